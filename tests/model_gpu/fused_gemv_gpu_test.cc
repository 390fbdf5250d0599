// The fused decode GEMV (model/cuda/fused_gemv.h) on fresh random inputs with poisoned outputs:
// each variant against the float64 reference that mirrors the unfused kernels' bf16 roundings, and
// bit for bit against the unfused GEMV path it replaces (gemv, add_rmsnorm, silu_mul) on the same
// inputs; then the CUDA runner's decode steps with FLASHSERVE_FUSE_NORM / FLASHSERVE_FUSE_SILU's
// paths against its unfused GEMV path (the same logits, bit for bit). Without a CUDA device every
// test skips with "skipped: no CUDA device".
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "flashserve/error.h"
#include "model/cuda/cuda_runner.h"
#include "model/cuda/fused_gemv.h"
#include "model/cuda/gemv.h"
#include "model/cuda/rmsnorm.h"
#include "model/cuda/silu_mul.h"
#include "model/decode_kernels.h"
#include "model/forward_batch.h"
#include "model_gpu/device_buffer.h"
#include "model_gpu/tiny_model.h"

namespace flashserve::testing {
namespace {

using model::ForwardBatchBuilder;
using model::cuda::FusedGemvArgs;
const bf16_t kPoison = to_bf16(NAN);

__nv_bfloat16* bf(const DeviceBuffer<bf16_t>& b) {
  return b.as<__nv_bfloat16>();
}

bool same_bits(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16_t)) == 0;
}

// float64 dot products of x's rows with w's rows, and the bound on float32 accumulation's error
// (k * 2^-24 * sum |x_i w_i|), as kernels_gpu_test.cc's products.
struct Dot {
  double value = 0, bound = 0;
};
Dot dot(const std::vector<double>& x, const std::vector<bf16_t>& w, int64_t row, int64_t k) {
  Dot d;
  double mag = 0;
  for (int64_t c = 0; c < k; ++c) {
    const double p = x[c] * f(w[row * k + c]);
    d.value += p;
    mag += std::abs(p);
  }
  d.bound = static_cast<double>(k) * std::ldexp(mag, -24) + 1e-7;
  return d;
}

// add_rmsnorm's output for one row (rmsnorm.h), in float64 with its two bf16 roundings.
std::vector<double> normalized(const std::vector<bf16_t>& x, const std::vector<bf16_t>& w,
                               int64_t row, int64_t k, double eps) {
  double ss = 0;
  for (int64_t c = 0; c < k; ++c) ss += f(x[row * k + c]) * f(x[row * k + c]);
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(k) + eps);
  std::vector<double> h(k);
  for (int64_t c = 0; c < k; ++c) h[c] = round_bf16(round_bf16(f(x[row * k + c]) * inv) * f(w[c]));
  return h;
}

std::vector<double> row_of(const std::vector<bf16_t>& x, int64_t row, int64_t k) {
  std::vector<double> r(k);
  for (int64_t c = 0; c < k; ++c) r[c] = f(x[row * k + c]);
  return r;
}

// The norm prologue with a plain (optionally biased) store: the QKV product of a fused layer.
void check_norm_store(int64_t m, int64_t n, int64_t k, bool bias, bool pdl) {
  std::mt19937 rng(static_cast<unsigned>(m * 7 + n * 13 + k + bias));
  const float eps = 1e-5f;
  const auto x = random_bf16(m * k, rng, 2.0f), nw = random_bf16(k, rng, 1.0f);
  const auto w = random_bf16(n * k, rng, 0.05f), b = random_bf16(n, rng, 0.5f);
  DeviceBuffer<bf16_t> d_x(x), d_nw(nw), d_w(w), d_b(b), d_y(m * n, kPoison);
  FusedGemvArgs a;
  a.x = bf(d_x);
  a.norm_weight = bf(d_nw);
  a.eps = eps;
  a.w = bf(d_w);
  a.bias = bias ? bf(d_b) : nullptr;
  a.y = bf(d_y);
  a.m = m;
  a.n = n;
  a.k = k;
  model::cuda::fused_gemv(a, nullptr, pdl);
  const auto y = d_y.download();
  // The unfused path: add_rmsnorm into h, then the GEMV.
  DeviceBuffer<bf16_t> d_res(x), d_h(m * k, kPoison), d_y2(m * n, kPoison);
  model::cuda::add_rmsnorm(nullptr, bf(d_res), bf(d_nw), bf(d_h), nullptr, m, k, eps, nullptr);
  model::cuda::gemv(bf(d_h), bf(d_w), bias ? bf(d_b) : nullptr, d_y2.get(), false, m, n, k,
                    nullptr);
  EXPECT_TRUE(same_bits(y, d_y2.download())) << "m " << m << " n " << n << " k " << k;
  int bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    // The reference's normalized row may differ from the kernel's by a bf16 unit where the
    // rounding is a near tie: the product's tolerance takes a unit of each term on top.
    const std::vector<double> h = normalized(x, nw, i, k, eps);
    for (int64_t j = 0; j < n; ++j) {
      const Dot d = dot(h, w, j, k);
      const double want = d.value + (bias ? f(b[j]) : 0.0);
      double mag = 0;
      for (int64_t c = 0; c < k; ++c) mag += std::abs(h[c] * f(w[j * k + c]));
      const double tol = std::ldexp(std::abs(want), -8) + d.bound + std::ldexp(mag, -7);
      if (!(std::abs(f(y[i * n + j]) - want) <= tol)) ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << "m " << m << " n " << n << " k " << k << " bias " << bias;
}

// The residual epilogue: y += bf16(x w^T), as the o and down products of a fused layer.
void check_residual(int64_t m, int64_t n, int64_t k, bool pdl) {
  std::mt19937 rng(static_cast<unsigned>(m * 5 + n * 3 + k));
  const auto x = random_bf16(m * k, rng), w = random_bf16(n * k, rng, 0.05f);
  const auto y0 = random_bf16(m * n, rng, 2.0f);
  DeviceBuffer<bf16_t> d_x(x), d_w(w), d_y(y0);
  FusedGemvArgs a;
  a.x = bf(d_x);
  a.w = bf(d_w);
  a.y = bf(d_y);
  a.add_to_y = true;
  a.m = m;
  a.n = n;
  a.k = k;
  model::cuda::fused_gemv(a, nullptr, pdl);
  const auto y = d_y.download();
  // The unfused path: the GEMV into delta, add_rmsnorm's add into the residual (its normalized
  // output unused; n a multiple of 8 as the model's hidden sizes are).
  DeviceBuffer<bf16_t> d_delta(m * n, kPoison), d_res(y0), d_nw(n, to_bf16(1.0f));
  DeviceBuffer<bf16_t> d_out(m * n, kPoison);
  model::cuda::gemv(bf(d_x), bf(d_w), nullptr, d_delta.get(), false, m, n, k, nullptr);
  model::cuda::add_rmsnorm(bf(d_delta), bf(d_res), bf(d_nw), bf(d_out), nullptr, m, n, 1e-5f,
                           nullptr);
  EXPECT_TRUE(same_bits(y, d_res.download())) << "m " << m << " n " << n << " k " << k;
  int bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    const std::vector<double> xi = row_of(x, i, k);
    for (int64_t j = 0; j < n; ++j) {
      const Dot d = dot(xi, w, j, k);
      const double want = f(y0[i * n + j]) + d.value;
      // Two roundings (the product's, the sum's) of values up to |y0| + |product|.
      const double tol =
          std::ldexp(std::abs(d.value), -8) + std::ldexp(std::abs(want), -8) + d.bound;
      if (!(std::abs(f(y[i * n + j]) - want) <= tol)) ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << "m " << m << " n " << n << " k " << k;
}

// The silu epilogue over gate | up rows, with and without the norm prologue: the gate/up product
// of a fused layer.
void check_silu(int64_t m, int64_t inter, int64_t k, bool norm, bool pdl) {
  std::mt19937 rng(static_cast<unsigned>(m * 11 + inter + k * 3 + norm));
  const float eps = 1e-6f;
  const auto x = random_bf16(m * k, rng, norm ? 2.0f : 1.0f), nw = random_bf16(k, rng, 1.0f);
  const auto w = random_bf16(2 * inter * k, rng, 0.08f);
  DeviceBuffer<bf16_t> d_x(x), d_nw(nw), d_w(w), d_y(m * inter, kPoison);
  FusedGemvArgs a;
  a.x = bf(d_x);
  a.norm_weight = norm ? bf(d_nw) : nullptr;
  a.eps = eps;
  a.w = bf(d_w);
  a.y = bf(d_y);
  a.silu = true;
  a.m = m;
  a.n = inter;
  a.k = k;
  model::cuda::fused_gemv(a, nullptr, pdl);
  const auto y = d_y.download();
  // The unfused path: (add_rmsnorm,) the GEMV into gate | up, silu_mul. silu_mul takes
  // intermediate sizes in multiples of 8 only (its refusal failed this test on the H200, session
  // 21): a ragged size is held to the float64 reference below alone.
  if (inter % 8 == 0) {
    DeviceBuffer<bf16_t> d_res(x), d_h(m * k, kPoison), d_gu(m * 2 * inter, kPoison);
    DeviceBuffer<bf16_t> d_act(m * inter, kPoison);
    if (norm)
      model::cuda::add_rmsnorm(nullptr, bf(d_res), bf(d_nw), bf(d_h), nullptr, m, k, eps, nullptr);
    model::cuda::gemv(norm ? bf(d_h) : bf(d_x), bf(d_w), nullptr, d_gu.get(), false, m, 2 * inter,
                      k, nullptr);
    model::cuda::silu_mul(bf(d_gu), bf(d_act), m, inter, nullptr);
    EXPECT_TRUE(same_bits(y, d_act.download())) << "m " << m << " inter " << inter << " k " << k;
  }
  int bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    const std::vector<double> xi = norm ? normalized(x, nw, i, k, eps) : row_of(x, i, k);
    for (int64_t j = 0; j < inter; ++j) {
      const Dot g = dot(xi, w, j, k), u = dot(xi, w, inter + j, k);
      const double gb = round_bf16(g.value), ub = round_bf16(u.value);
      const double want = gb / (1 + std::exp(-gb)) * ub;
      // The output's rounding, and the gate's and up's (a unit each, when a near tie or the
      // normalized input rounds the other way) carried through silu (slope at most 1.1).
      const double tol = std::ldexp(std::abs(want), -8) +
                         1.1 * std::abs(ub) * (std::ldexp(std::abs(g.value), -7) + g.bound) +
                         std::abs(gb) * (std::ldexp(std::abs(u.value), -7) + u.bound) + 1e-6;
      if (!(std::abs(f(y[i * inter + j]) - want) <= tol)) ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << "m " << m << " inter " << inter << " k " << k << " norm " << norm;
}

bool hopper() {
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major >= 9;
}

// Shapes: n not a multiple of a block's 8 columns, k not a multiple of a warp pass (256), the
// mistral-7b hidden size, and the largest hidden a norm prologue takes (64 KiB of shared memory
// at 4 rows: the launch asks for more than the default 48).
TEST(GpuFusedGemv, NormPrologueMatchesReferenceAndUnfusedPath) {
  SKIP_WITHOUT_CUDA();
  for (bool pdl : {false, true}) {
    if (pdl && !hopper()) continue;
    SCOPED_TRACE(::testing::Message() << "pdl " << pdl);
    for (int64_t m : {1, 2, 3, 4}) {
      check_norm_store(m, 77, 1032, false, pdl);
      check_norm_store(m, 384, 4096, true, pdl);
      check_norm_store(m, 40, 64, true, pdl);
    }
    check_norm_store(4, 24, 8192, false, pdl);
    check_norm_store(1, 17, 8, false, pdl);  // one vector: 31 lanes of each warp idle
  }
}

TEST(GpuFusedGemv, ResidualEpilogueMatchesReferenceAndUnfusedPath) {
  SKIP_WITHOUT_CUDA();
  for (bool pdl : {false, true}) {
    if (pdl && !hopper()) continue;
    SCOPED_TRACE(::testing::Message() << "pdl " << pdl);
    for (int64_t m : {1, 2, 3, 4}) {
      check_residual(m, 1032, 256, pdl);
      check_residual(m, 64, 14336, pdl);
      check_residual(m, 200, 1000, pdl);
    }
  }
}

TEST(GpuFusedGemv, SiluEpilogueMatchesReferenceAndUnfusedPath) {
  SKIP_WITHOUT_CUDA();
  for (bool pdl : {false, true}) {
    if (pdl && !hopper()) continue;
    SCOPED_TRACE(::testing::Message() << "pdl " << pdl);
    for (int64_t m : {1, 2, 3, 4})
      for (bool norm : {false, true}) {
        check_silu(m, 77, 1032, norm, pdl);
        check_silu(m, 256, 4096, norm, pdl);
      }
  }
}

TEST(GpuFusedGemv, RefusesWhatItDoesNotTake) {
  SKIP_WITHOUT_CUDA();
  FusedGemvArgs a;
  a.m = 5;
  a.n = 8;
  a.k = 64;
  EXPECT_THROW(model::cuda::fused_gemv(a, nullptr), Error);  // more rows than a GEMV takes
  a.m = 1;
  a.k = 12;
  EXPECT_THROW(model::cuda::fused_gemv(a, nullptr), Error);  // k not a multiple of 8
  a.k = 8200;
  DeviceBuffer<bf16_t> d_nw(8200, to_bf16(1.0f));
  a.norm_weight = bf(d_nw);
  EXPECT_THROW(model::cuda::fused_gemv(a, nullptr), Error);  // a norm wider than 8192
  a.norm_weight = nullptr;
  a.k = 64;
  a.silu = a.add_to_y = true;
  EXPECT_THROW(model::cuda::fused_gemv(a, nullptr), Error);
}

// Prefills three prompts of the tiny checkpoint, then decodes 6 steps of the first `batch`
// sequences (graphs on); returns the decode steps' logits. The prompts' prefill (more tokens
// than a fused step takes) runs unfused in every configuration.
std::vector<float> decode_logits(model::cuda::CudaRunner& runner, int64_t batch) {
  constexpr int32_t kBlock = 16;
  const int64_t vocab = runner.config().vocab_size, per_seq = 8;
  std::mt19937 rng(21);
  std::vector<std::vector<int32_t>> tokens(3, std::vector<int32_t>(60));
  for (auto& t : tokens)
    for (auto& id : t) id = static_cast<int32_t>(rng() % vocab);
  const std::vector<int64_t> prompt = {37, 5, 20};
  runner.allocate_kv(3 * per_seq, kBlock);
  ForwardBatchBuilder pre(kBlock);
  for (int64_t s = 0; s < 3; ++s)
    pre.add(tokens[s].data(), 0, prompt[s], sequence_blocks(s, prompt[s], per_seq, kBlock), true);
  runner.forward(std::move(pre).build());
  std::vector<float> all;
  for (int64_t step = 0; step < 6; ++step) {
    ForwardBatchBuilder bb(kBlock);
    for (int64_t s = 0; s < batch; ++s) {
      const int64_t pos = prompt[s] + step;
      bb.add(tokens[s].data() + pos, pos, 1, sequence_blocks(s, pos + 1, per_seq, kBlock), true);
    }
    runner.forward(std::move(bb).build());
    const std::vector<float> l = runner.logits();
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The runner's decode steps (batch 1 to 3) with each fusion against its unfused GEMV path
// (set_gemv_rows: the same products' sums through gemv.h): the same logits, bit for bit, and close
// to the cuBLASLt path's.
TEST(GpuFusedGemv, RunnerDecodeStepsEqualTheUnfusedGemvPath) {
  SKIP_WITHOUT_CUDA();
  auto runner = model::cuda::CudaRunner::load(tiny_checkpoint_dir(), 0);
  for (int64_t batch : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "batch " << batch);
    runner->set_decode_fusion(false, false);
    runner->set_gemv_rows(0);
    const std::vector<float> cublas = decode_logits(*runner, batch);
    runner->set_gemv_rows(model::kGemvMaxProductRows);
    const std::vector<float> unfused = decode_logits(*runner, batch);
    double peak = 0, diff = 0;
    for (size_t i = 0; i < cublas.size(); ++i) {
      peak = std::max(peak, std::abs(double(cublas[i])));
      diff = std::max(diff, std::abs(double(cublas[i]) - unfused[i]));
    }
    // Different products' summation orders, through a few layers of bf16: a sanity bound only.
    EXPECT_LE(diff, 0.05 * peak) << "the GEMV path against cuBLASLt's";
    for (auto [norm, silu] : {std::pair{true, false}, {false, true}, {true, true}}) {
      runner->set_decode_fusion(norm, silu);
      EXPECT_TRUE(same_floats(decode_logits(*runner, batch), unfused))
          << "norm " << norm << " silu " << silu;
    }
    runner->set_decode_fusion(false, false);
  }
}

// The GEMV's first weights before its wait and silu launched programmatically
// (set_early_weights), with and without the attention's programmatic launch: the decode steps'
// logits bit for bit as without them, for one-row products through the GEMV and for every small
// product through it.
TEST(GpuFusedGemv, RunnerEarlyWeightsChangeNoBit) {
  SKIP_WITHOUT_CUDA();
  auto runner = model::cuda::CudaRunner::load(tiny_checkpoint_dir(), 0);
  for (int64_t rows : {model::kGemvRowsByDefault, model::kGemvMaxProductRows})
    for (int64_t batch : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << "GEMV rows " << rows << ", batch " << batch);
      runner->set_gemv_rows(rows);
      runner->set_early_weights(false);
      runner->set_attention_pdl(false);
      const std::vector<float> base = decode_logits(*runner, batch);
      for (bool attention_pdl : {false, true}) {
        runner->set_early_weights(true);
        runner->set_attention_pdl(attention_pdl);
        EXPECT_TRUE(same_floats(decode_logits(*runner, batch), base))
            << "attention PDL " << attention_pdl;
      }
    }
  runner->set_gemv_rows(model::kGemvRowsByDefault);
  runner->set_early_weights(model::kEarlyWeightsByDefault);
  runner->set_attention_pdl(model::kPdlAttentionByDefault);
}

}  // namespace
}  // namespace flashserve::testing
