// The model's small CUDA kernels and its GEMM, each on fresh random inputs against a float64 CPU
// reference that mirrors the bf16 roundings Hugging Face's model makes (so the tolerance is one or
// two bf16 units, not a loose absolute bound). Outputs and unused KV slots are poisoned first.
// Without a CUDA device every test skips with "skipped: no CUDA device".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "flashserve/error.h"
#include "model/cuda/embedding.h"
#include "model/cuda/gemm.h"
#include "model/cuda/gemv.h"
#include "model/cuda/rmsnorm.h"
#include "model/cuda/rope_kv_write.h"
#include "model/cuda/silu_mul.h"
#include "model/rope.h"
#include "model_gpu/device_buffer.h"

namespace flashserve::testing {
namespace {

using model::cuda::Gemm;
const bf16_t kPoison = to_bf16(NAN);

TEST(GpuModelKernels, EmbeddingGathersRowsAndZeroesBadIds) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(1);
  const int64_t vocab = 1000, hidden = 1032;
  const auto table = random_bf16(vocab * hidden, rng);
  std::vector<int32_t> ids = {0, 999, 17, 17, -1, 1000, 523};
  DeviceBuffer<bf16_t> d_table(table), d_out(ids.size() * hidden, kPoison);
  DeviceBuffer<int32_t> d_ids(ids);
  model::cuda::embed_tokens(d_table.as<__nv_bfloat16>(), d_ids.get(), d_out.as<__nv_bfloat16>(),
                            ids.size(), hidden, vocab, nullptr);
  const auto out = d_out.download();
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t c = 0; c < hidden; ++c) {
      const bool valid = ids[t] >= 0 && ids[t] < vocab;
      const double want = valid ? f(table[ids[t] * hidden + c]) : 0.0;
      ASSERT_EQ(f(out[t * hidden + c]), want) << "token " << t << " col " << c;
    }
}

// residual += delta (bf16), out = w * bf16(x / rms(x)).
void check_rmsnorm(int64_t hidden, bool with_delta, bool with_rows) {
  std::mt19937 rng(static_cast<unsigned>(hidden * 4 + with_delta * 2 + with_rows));
  const int64_t n = 9;
  const float eps = 1e-5f;
  const auto residual = random_bf16(n * hidden, rng, 2.0f);
  const auto delta = random_bf16(n * hidden, rng, 0.5f);
  const auto weight = random_bf16(hidden, rng, 1.0f);
  std::vector<int32_t> rows = with_rows ? std::vector<int32_t>{8, 0, 3} : std::vector<int32_t>{};
  const int64_t n_out = with_rows ? static_cast<int64_t>(rows.size()) : n;
  DeviceBuffer<bf16_t> d_res(residual), d_delta(delta), d_w(weight), d_out(n_out * hidden, kPoison);
  DeviceBuffer<int32_t> d_rows(rows);
  model::cuda::add_rmsnorm(with_delta ? d_delta.as<__nv_bfloat16>() : nullptr,
                           d_res.as<__nv_bfloat16>(), d_w.as<__nv_bfloat16>(),
                           d_out.as<__nv_bfloat16>(), with_rows ? d_rows.get() : nullptr, n_out,
                           hidden, eps, nullptr);
  const auto out = d_out.download();
  const auto res = d_res.download();
  int bad = 0;
  for (int64_t r = 0; r < n_out; ++r) {
    const int64_t src = with_rows ? rows[r] : r;
    std::vector<double> x(hidden);
    double ss = 0;
    for (int64_t c = 0; c < hidden; ++c) {
      x[c] = f(residual[src * hidden + c]);
      if (with_delta) x[c] = round_bf16(x[c] + f(delta[src * hidden + c]));
      ss += x[c] * x[c];
      if (!bf16_close(f(res[src * hidden + c]), x[c], 1.0, 0)) ++bad;
    }
    const double inv = 1.0 / std::sqrt(ss / hidden + eps);
    for (int64_t c = 0; c < hidden; ++c) {
      // Two roundings in the reference and in the kernel: allow two bf16 units.
      const double want = round_bf16(x[c] * inv) * f(weight[c]);
      if (!bf16_close(f(out[r * hidden + c]), want, 2.0, 1e-6)) ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << "hidden " << hidden << " delta " << with_delta << " rows " << with_rows;
}

TEST(GpuModelKernels, AddRmsNormMatchesReference) {
  SKIP_WITHOUT_CUDA();
  for (int64_t hidden : {64, 896, 1024, 4096, 5128, 8192})
    for (bool d : {false, true})
      for (bool rows : {false, true}) check_rmsnorm(hidden, d, rows);
}

void check_rope(int heads, int kv_heads, int d, bool bias, bool llama3) {
  std::mt19937 rng(static_cast<unsigned>(heads * 1000 + d + bias * 7 + llama3 * 13));
  const int64_t n = 37, width = static_cast<int64_t>(heads + 2 * kv_heads) * d;
  const int64_t slots = 64;
  const auto qkv = random_bf16(n * width, rng);
  const auto b = random_bf16(width, rng, 0.3f);
  std::vector<int32_t> pos(n), slot(n);
  std::uniform_int_distribution<int32_t> pd(0, 131071);
  for (auto& p : pos) p = pd(rng);
  pos[0] = 0;
  pos[1] = 1;
  std::vector<int32_t> perm(slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t t = 0; t < n; ++t) slot[t] = perm[t];
  slot[5] = -1;  // a padding token: no K/V write
  model::ModelConfig cfg;
  cfg.head_dim = d;
  cfg.rope_theta = llama3 ? 500000.0 : 10000.0;
  if (llama3) cfg.rope_scaling = model::RopeScaling{"llama3", 8.0, 1.0, 4.0, 8192};
  const auto inv64 = model::rope_inv_freq(cfg);
  const std::vector<float> inv(inv64.begin(), inv64.end());
  DeviceBuffer<bf16_t> d_qkv(qkv), d_b(b), d_q(n * heads * d, kPoison);
  DeviceBuffer<bf16_t> d_k(slots * kv_heads * d, kPoison), d_v(slots * kv_heads * d, kPoison);
  DeviceBuffer<int32_t> d_pos(pos), d_slot(slot);
  DeviceBuffer<float> d_inv(inv);
  model::cuda::RopeKvArgs a;
  a.qkv = d_qkv.as<__nv_bfloat16>();
  a.bias = bias ? d_b.as<__nv_bfloat16>() : nullptr;
  a.positions = d_pos.get();
  a.slot_mapping = d_slot.get();
  a.inv_freq = d_inv.get();
  a.q_out = d_q.as<__nv_bfloat16>();
  a.k_cache = d_k.as<__nv_bfloat16>();
  a.v_cache = d_v.as<__nv_bfloat16>();
  a.n_tokens = n;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = d;
  model::cuda::rope_kv_write(a, nullptr);
  const auto q = d_q.download(), k = d_k.download(), v = d_v.download();
  int bad = 0;
  std::vector<bool> written(slots, false);
  for (int64_t t = 0; t < n; ++t) {
    auto x = [&](int64_t col) {
      double val = f(qkv[t * width + col]);
      return bias ? round_bf16(val + f(b[col])) : val;
    };
    for (int h = 0; h < heads + kv_heads; ++h) {
      const bool is_q = h < heads;
      if (!is_q && slot[t] < 0) continue;
      for (int i = 0; i < d / 2; ++i) {
        // The angle in float32 as Hugging Face forms it; its sine and cosine exactly.
        const double ang = static_cast<double>(static_cast<float>(pos[t]) * inv[i]);
        const double x1 = x(int64_t{h} * d + i), x2 = x(int64_t{h} * d + i + d / 2);
        const double y1 = x1 * std::cos(ang) - x2 * std::sin(ang);
        const double y2 = x2 * std::cos(ang) + x1 * std::sin(ang);
        const bf16_t* out =
            is_q ? &q[(t * heads + h) * d] : &k[(int64_t{slot[t]} * kv_heads + (h - heads)) * d];
        const double scale = std::abs(x1) + std::abs(x2);
        if (std::abs(f(out[i]) - y1) > std::ldexp(scale, -8) + 1e-6) ++bad;
        if (std::abs(f(out[i + d / 2]) - y2) > std::ldexp(scale, -8) + 1e-6) ++bad;
      }
    }
    if (slot[t] < 0) continue;
    written[slot[t]] = true;
    for (int h = 0; h < kv_heads; ++h)
      for (int i = 0; i < d; ++i) {
        const double want = round_bf16(x(int64_t{heads + kv_heads + h} * d + i));
        if (f(v[(int64_t{slot[t]} * kv_heads + h) * d + i]) != want) ++bad;
      }
  }
  for (int64_t sl = 0; sl < slots; ++sl)
    if (!written[sl])
      for (int64_t i = 0; i < kv_heads * d; ++i)
        if (!std::isnan(f(k[sl * kv_heads * d + i])) || !std::isnan(f(v[sl * kv_heads * d + i])))
          ++bad;
  EXPECT_EQ(bad, 0) << "heads " << heads << "/" << kv_heads << " d " << d << " bias " << bias
                    << " llama3 " << llama3;
}

TEST(GpuModelKernels, RopeKvWriteMatchesReference) {
  SKIP_WITHOUT_CUDA();
  for (int d : {64, 128})
    for (bool bias : {false, true})
      for (bool llama3 : {false, true}) {
        check_rope(16, 4, d, bias, llama3);
        check_rope(7, 1, d, bias, llama3);
      }
}

TEST(GpuModelKernels, SiluMulMatchesReference) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(5);
  for (int64_t inter : {8, 2816, 14336}) {
    const int64_t n = 5;
    const auto gu = random_bf16(n * 2 * inter, rng, 3.0f);
    DeviceBuffer<bf16_t> d_gu(gu), d_out(n * inter, kPoison);
    model::cuda::silu_mul(d_gu.as<__nv_bfloat16>(), d_out.as<__nv_bfloat16>(), n, inter, nullptr);
    const auto out = d_out.download();
    int bad = 0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < inter; ++i) {
        const double g = f(gu[t * 2 * inter + i]), u = f(gu[t * 2 * inter + inter + i]);
        const double want = g / (1 + std::exp(-g)) * u;
        if (!bf16_close(f(out[t * inter + i]), want, 1.0, 1e-6)) ++bad;
      }
    EXPECT_EQ(bad, 0) << "intermediate " << inter;
  }
}

// y = x W^T with fp32 accumulation: the error is the output rounding (one bf16 unit, or none for
// float32 output) plus the accumulation's, bounded by k * 2^-24 * sum |x_i w_i|.
using Product = std::function<void(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y,
                                   bool y_float, int64_t m, int64_t n, int64_t k)>;

void check_product(const Product& run, int64_t m, int64_t n, int64_t k, bool y_float) {
  std::mt19937 rng(static_cast<unsigned>(m * 31 + n * 7 + k));
  const auto x = random_bf16(m * k, rng), w = random_bf16(n * k, rng, 0.05f);
  DeviceBuffer<bf16_t> d_x(x), d_w(w);
  DeviceBuffer<float> d_yf(m * n, NAN);
  DeviceBuffer<bf16_t> d_yb(m * n, kPoison);
  run(d_x.as<__nv_bfloat16>(), d_w.as<__nv_bfloat16>(),
      y_float ? static_cast<void*>(d_yf.get()) : static_cast<void*>(d_yb.get()), y_float, m, n, k);
  const auto yf = d_yf.download();
  const auto yb = d_yb.download();
  int bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double want = 0, mag = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double p = f(x[i * k + c]) * f(w[j * k + c]);
        want += p;
        mag += std::abs(p);
      }
      const double got = y_float ? yf[i * n + j] : f(yb[i * n + j]);
      const double tol = (y_float ? 0.0 : std::ldexp(std::abs(want), -8)) +
                         static_cast<double>(k) * std::ldexp(mag, -24) + 1e-7;
      if (!(std::abs(got - want) <= tol)) ++bad;
    }
  EXPECT_EQ(bad, 0) << "m " << m << " n " << n << " k " << k << " float " << y_float;
}

void check_gemm(Gemm& gemm, int64_t m, int64_t n, int64_t k, bool y_float) {
  check_product([&](const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, bool yf, int64_t m_,
                    int64_t n_, int64_t k_) { gemm.run(x, w, y, yf, m_, n_, k_, nullptr); },
                m, n, k, y_float);
}

bool hopper() {
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major >= 9;
}

// The GEMV kernel launched plainly and (on Hopper) with programmatic dependent launch, its first
// weights loaded after or before the wait (early), on odd shapes: n not a multiple of the block's
// 8 rows, k not a multiple of a warp pass (256) or shorter than the first pass (1024).
TEST(GpuModelKernels, GemvMatchesReferenceWithAndWithoutPdl) {
  SKIP_WITHOUT_CUDA();
  for (bool pdl : {false, true})
    for (bool early : {false, true}) {
      if (pdl && !hopper()) continue;
      SCOPED_TRACE(::testing::Message() << "pdl " << pdl << " early " << early);
      const Product run = [&](const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, bool yf,
                              int64_t m, int64_t n, int64_t k) {
        model::cuda::gemv(x, w, nullptr, y, yf, m, n, k, nullptr, pdl, early);
      };
      for (int64_t m : {1, 2, 3, 4})
        for (bool y_float : {false, true}) {
          check_product(run, m, 1000, 256, y_float);
          check_product(run, m, 384, 1032, y_float);
          check_product(run, m, 77, 8200, y_float);
        }
      check_product(run, 1, 13, 8, false);  // one chunk per row: 31 lanes of each warp idle
    }
}

bool same_bits(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16_t)) == 0;
}

// The early first pass changes when the weights are read, not the sums: the same bits.
TEST(GpuModelKernels, GemvEarlyWeightsGiveTheSameBits) {
  SKIP_WITHOUT_CUDA();
  std::mt19937 rng(17);
  for (int64_t m : {1, 3})
    for (int64_t k : {1032, 4096, 8200}) {
      const int64_t n = 77;
      const auto x = random_bf16(m * k, rng), w = random_bf16(n * k, rng, 0.05f);
      DeviceBuffer<bf16_t> d_x(x), d_w(w), late(m * n, kPoison), early(m * n, kPoison);
      for (bool e : {false, true})
        model::cuda::gemv(d_x.as<__nv_bfloat16>(), d_w.as<__nv_bfloat16>(), nullptr,
                          (e ? early : late).as<__nv_bfloat16>(), false, m, n, k, nullptr, hopper(),
                          e);
      EXPECT_TRUE(same_bits(late.download(), early.download())) << "m " << m << " k " << k;
    }
}

// silu launched with programmatic dependent launch (Hopper) writes what the plain launch writes.
TEST(GpuModelKernels, SiluMulWithPdlGivesTheSameBits) {
  SKIP_WITHOUT_CUDA();
  if (!hopper()) GTEST_SKIP() << "programmatic dependent launch needs sm_90";
  std::mt19937 rng(6);
  const int64_t n = 3, inter = 14336;
  const auto gu = random_bf16(n * 2 * inter, rng, 3.0f);
  DeviceBuffer<bf16_t> d_gu(gu), plain(n * inter, kPoison), pdl(n * inter, kPoison);
  model::cuda::silu_mul(d_gu.as<__nv_bfloat16>(), plain.as<__nv_bfloat16>(), n, inter, nullptr);
  model::cuda::silu_mul(d_gu.as<__nv_bfloat16>(), pdl.as<__nv_bfloat16>(), n, inter, nullptr, true);
  EXPECT_TRUE(same_bits(plain.download(), pdl.download()));
}

TEST(GpuModelKernels, GemmMatchesReference) {
  SKIP_WITHOUT_CUDA();
  Gemm gemm;
  gemm.set_gemv_rows(model::cuda::kGemvMaxRows);
  for (int64_t m : {1, 2, 3, 4, 7, 32, 129})  // m <= 4: the GEMV kernel
    for (bool y_float : {false, true}) {
      check_gemm(gemm, m, 384, 1024, y_float);
      check_gemm(gemm, m, 1000, 256, y_float);
      check_gemm(gemm, m, 256, 1032, y_float);  // k not a multiple of the GEMV's 256-wide pass
    }
  check_gemm(gemm, 1, 384, 1024, false);  // a cached plan reused
  gemm.set_gemv_rows(0);                  // and cuBLASLt for the same small m
  for (int64_t m : {1, 3})
    for (bool y_float : {false, true}) check_gemm(gemm, m, 384, 1024, y_float);
  gemm.set_gemv_rows(1);  // one row through the GEMV, two through cuBLASLt
  for (int64_t m : {1, 2}) check_gemm(gemm, m, 384, 1024, false);
  EXPECT_THROW(gemm.set_gemv_rows(model::cuda::kGemvMaxRows + 1), Error);
  EXPECT_THROW(gemm.set_gemv_rows(-1), Error);
}

TEST(GpuModelKernels, GemmBiasEpilogueRoundsOnce) {
  SKIP_WITHOUT_CUDA();
  Gemm gemm;
  // m <= 4 through the GEMV kernel's bias, the others cuBLASLt's epilogue.
  gemm.set_gemv_rows(model::cuda::kGemvMaxRows);
  for (int64_t m : {1, 2, 17, 300}) {
    const int64_t n = 1152, k = 896;
    std::mt19937 rng(static_cast<unsigned>(m));
    const auto x = random_bf16(m * k, rng), w = random_bf16(n * k, rng, 0.05f);
    const auto b = random_bf16(n, rng, 0.5f);
    DeviceBuffer<bf16_t> d_x(x), d_w(w), d_b(b), d_y(m * n, kPoison);
    ASSERT_TRUE(gemm.run_bias(d_x.as<__nv_bfloat16>(), d_w.as<__nv_bfloat16>(),
                              d_b.as<__nv_bfloat16>(), d_y.as<__nv_bfloat16>(), m, n, k, nullptr))
        << "cuBLASLt offers no bias epilogue for m " << m;
    const auto y = d_y.download();
    int bad = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double want = f(b[j]), mag = std::abs(f(b[j]));
        for (int64_t c = 0; c < k; ++c) {
          want += f(x[i * k + c]) * f(w[j * k + c]);
          mag += std::abs(f(x[i * k + c]) * f(w[j * k + c]));
        }
        // One rounding to bf16 (at most half a unit: 2^-8 of the value) plus the accumulation.
        const double tol = std::ldexp(std::abs(want), -8) + k * std::ldexp(mag, -24) + 1e-7;
        if (!(std::abs(f(y[i * n + j]) - want) <= tol)) ++bad;
      }
    EXPECT_EQ(bad, 0) << "m " << m;
  }
}

}  // namespace
}  // namespace flashserve::testing
