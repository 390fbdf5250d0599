// The CUDA runner's fp8 (e4m3) KV cache (issue 23): the write (rope_kv_write into e4m3 pages)
// bit for bit against the host quantiser, the runner's pool against its own bf16 pool, and the
// logits and greedy tokens of `tiny` with the fp8 cache against the bf16 cache.
//
// Tolerances (stated where asserted):
// - The write: exact. e4m3(x / scale) of the same float32 x is one correctly rounded division and
//   one round-to-nearest-even saturating conversion on both sides (common/float8.h to_e4m3,
//   common/float8_cuda.cuh e4m3_from_float).
// - Layer 0's pool: per element |code x scale - bf16 pool| <= (2^-4 + 2^-8)(1 + 2^-7)|bf16| +
//   2^-10 scale: e4m3's half step (2^-4 relative, 2^-10 absolute among subnormals, times the
//   scale) plus bf16's (2^-8), of the same x (one runner, the same GEMMs, so the same x). A wrong
//   head's scale (they are random in [1/2, 2]) or slot is off by far more.
// - Logits: per row, max |fp8 - bf16| <= 2 D + 0.3, D = the same row's max |fp8 - bf16| on the
//   CPU runner (float32 arithmetic: the cache's own effect). By the triangle inequality through
//   the CPU's two caches: 0.15 per side is GpuModelRunner.MatchesCpuRunnerOnTiny's bound for the
//   GPU's bf16 arithmetic, and the GPU's fp8 side may round K/V elements that straddle an e4m3
//   midpoint to the neighbouring code (its x is the bf16 arithmetic's, the CPU's float32's),
//   which moves the logits by at most the cache's whole rounding effect D again. Where bf16's
//   top-2 gap exceeds twice that bound the argmax must agree.
// - Greedy decode: reported, not asserted (after a near-tie the continuations legitimately
//   differ; the CPU runner's KvCacheDtypes.GreedyAgreementOverARunIsReported says the same).
//
// The fp8 cache is behind FLASHSERVE_CUDA_FP8_KV (off by default: docs/fp8.md): each test turns
// it on for its scope.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "common/float8.h"
#include "flashserve/error.h"
#include "model/cuda/cuda_runner.h"
#include "model/cuda/rope_kv_write.h"
#include "model/forward_batch.h"
#include "model/runner.h"
#include "model_gpu/device_buffer.h"
#include "model_gpu/tiny_model.h"
#include "support/scoped_env.h"

namespace flashserve::testing {
namespace {

using model::ForwardBatch;
using model::ForwardBatchBuilder;
using model::KvCacheConfig;
using model::KvCacheDtype;
using model::ModelRunner;

constexpr int32_t kBlock = 16;

// rope_kv_write at position 0 (cos 1, sin 0 exactly: k is written unrotated) with random
// per-head scales: every byte of both e4m3 pools equals the host's to_e4m3(x / scale), the
// slots of skipped tokens (slot -1) and unused slots keep their poison, and q is untouched by
// the cache's type. Inputs: random normals over magnitudes 2^-14 .. 2^10 (subnormal codes,
// saturation past 448 x scale), every e4m3 code and every midpoint between two codes (ties to
// even, with head 0's scale 1), and in v infinities and NaN (saturation to +-448, NaN to 0x7f).
TEST(KvFp8Write, RopeKvWriteQuantisesAsTheHostBitForBit) {
  SKIP_WITHOUT_CUDA();
  const int32_t heads = 4, kv_heads = 2, d = 64;
  const int64_t n = 700, slots = 1024, width = (heads + 2 * kv_heads) * d;
  std::mt19937 rng(2301);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> octave(-14, 10);
  std::vector<bf16_t> qkv(n * width);
  for (auto& x : qkv) x = to_bf16(std::ldexp(normal(rng), octave(rng)));
  // Codes and midpoints: row t's element c (k and v, head 0) takes value number t * d + c.
  std::vector<float> exact;
  for (int code = 0; code < 256; ++code) {
    const float v = to_float(fp8_e4m3_t{static_cast<uint8_t>(code)});
    if (std::isnan(v)) continue;
    exact.push_back(v);
    const float next = to_float(fp8_e4m3_t{static_cast<uint8_t>(code + 1)});
    if ((code & 0x7f) < 0x7e && !std::isnan(next)) exact.push_back((v + next) / 2);  // in bf16
  }
  for (size_t i = 0; i < exact.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) / d, c = static_cast<int64_t>(i) % d;
    qkv[t * width + heads * d + c] = to_bf16(exact[i]);               // k head 0
    qkv[t * width + (heads + kv_heads) * d + c] = to_bf16(exact[i]);  // v head 0
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {inf, -inf, std::nanf(""), 1e30f, -1e30f, 464.0f, -464.0f, 480.0f};
  for (size_t i = 0; i < std::size(specials); ++i)
    qkv[(n - 1) * width + (heads + kv_heads + 1) * d + i] = to_bf16(specials[i]);  // v head 1
  std::vector<int32_t> positions(n, 0), slot(n);
  std::vector<int32_t> perm(slots);
  for (int32_t i = 0; i < slots; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t t = 0; t < n; ++t) slot[t] = t % 11 == 5 ? -1 : perm[t];
  std::vector<float> k_scale = {1.0f, 0.0f}, v_scale = {1.0f, 0.0f};
  std::uniform_real_distribution<float> factor(0.5f, 2.0f);
  k_scale[1] = factor(rng);
  v_scale[1] = factor(rng);
  std::vector<float> inv_freq(d / 2);
  for (int i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / d);

  constexpr uint8_t kPoison = 0x5a;
  DeviceBuffer<bf16_t> dqkv(qkv), q_out(static_cast<size_t>(n * heads * d));
  DeviceBuffer<int32_t> dpos(positions), dslot(slot);
  DeviceBuffer<float> dfreq(inv_freq), dks(k_scale), dvs(v_scale);
  DeviceBuffer<uint8_t> k8(static_cast<size_t>(slots * kv_heads * d), kPoison),
      v8(static_cast<size_t>(slots * kv_heads * d), kPoison);
  model::cuda::RopeKvArgs a;
  a.qkv = dqkv.as<const __nv_bfloat16>();
  a.positions = dpos.get();
  a.slot_mapping = dslot.get();
  a.inv_freq = dfreq.get();
  a.q_out = q_out.as<__nv_bfloat16>();
  a.k_cache8 = k8.get();
  a.v_cache8 = v8.get();
  a.k_scale = dks.get();
  a.v_scale = dvs.get();
  a.n_tokens = n;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.head_dim = d;
  model::cuda::rope_kv_write(a, nullptr);
  const std::vector<uint8_t> gk = k8.download(), gv = v8.download();

  std::vector<uint8_t> want_k(gk.size(), kPoison), want_v(gv.size(), kPoison);
  for (int64_t t = 0; t < n; ++t) {
    if (slot[t] < 0) continue;
    for (int h = 0; h < kv_heads; ++h)
      for (int c = 0; c < d; ++c) {
        const int64_t at = (int64_t{slot[t]} * kv_heads + h) * d + c;
        // k at position 0: x1 * cos - x2 * sin with cos 1 and sin 0, as the kernel forms it.
        const int half = d / 2, pair = c < half ? c + half : c - half;
        const float x = to_float(qkv[t * width + (heads + h) * d + c]);
        const float partner = to_float(qkv[t * width + (heads + h) * d + pair]);
        const float y = c < half ? x * 1.0f - partner * 0.0f : x * 1.0f + partner * 0.0f;
        want_k[at] = to_e4m3(y / k_scale[h]).bits;
        const float v = to_float(qkv[t * width + (heads + kv_heads + h) * d + c]);
        want_v[at] = to_e4m3(v / v_scale[h]).bits;
      }
  }
  int64_t bad = 0;
  for (size_t i = 0; i < gk.size(); ++i) {
    if (gk[i] != want_k[i] && bad++ < 10)
      ADD_FAILURE() << "k byte " << i << ": 0x" << std::hex << int(gk[i]) << ", host 0x"
                    << int(want_k[i]);
    if (gv[i] != want_v[i] && bad++ < 10)
      ADD_FAILURE() << "v byte " << i << ": 0x" << std::hex << int(gv[i]) << ", host 0x"
                    << int(want_v[i]);
  }
  EXPECT_EQ(bad, 0);
}

std::vector<int32_t> random_tokens(size_t n, int64_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

// Prompt a prefilled in chunks of 64 while b (prefilled first) decodes in the same steps, both
// teacher-forced: the logits rows of every step (mixed steps: chunk and decode kernels, split-KV
// at the longer lengths), then 30 decode-only steps of both (decode graphs).
std::vector<std::vector<float>> teacher_forced(ModelRunner& r, const KvCacheConfig& kv) {
  r.set_kv_cache(kv);
  const int64_t per_seq = 64;
  r.allocate_kv(2 * per_seq, kBlock);
  const int64_t vocab = r.config().vocab_size;
  const auto a = random_tokens(400, vocab, 11), b = random_tokens(400, vocab, 12);
  std::vector<std::vector<float>> out;
  auto keep = [&] {
    const std::vector<float> l = r.logits();
    for (size_t i = 0; i < l.size() / vocab; ++i)
      out.emplace_back(l.begin() + i * vocab, l.begin() + (i + 1) * vocab);
  };
  const int64_t b_prompt = 37;
  {
    ForwardBatchBuilder bb(kBlock);
    bb.add(b.data(), 0, b_prompt, sequence_blocks(1, b_prompt, per_seq, kBlock), true);
    r.forward(std::move(bb).build());
    keep();
  }
  int64_t done = 0, b_done = b_prompt;
  const int64_t a_prompt = 300;
  while (done < a_prompt) {
    const int64_t q = std::min<int64_t>(64, a_prompt - done);
    ForwardBatchBuilder bb(kBlock);
    bb.add(a.data() + done, done, q, sequence_blocks(0, done + q, per_seq, kBlock),
           done + q == a_prompt);
    bb.add(b.data() + b_done, b_done, 1, sequence_blocks(1, b_done + 1, per_seq, kBlock), true);
    r.forward(std::move(bb).build());
    keep();
    done += q;
    ++b_done;
  }
  for (int s = 0; s < 30; ++s) {
    ForwardBatchBuilder bb(kBlock);
    bb.add(a.data() + done, done, 1, sequence_blocks(0, done + 1, per_seq, kBlock), true);
    bb.add(b.data() + b_done, b_done, 1, sequence_blocks(1, b_done + 1, per_seq, kBlock), true);
    r.forward(std::move(bb).build());
    keep();
    ++done;
    ++b_done;
  }
  return out;
}

double max_diff(const std::vector<float>& x, const std::vector<float>& y) {
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(double(x[i]) - y[i]));
  return m;
}

int argmax(const std::vector<float>& x) {
  return static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin());
}

double top2_gap(std::vector<float> x) {
  std::partial_sort(x.begin(), x.begin() + 2, x.end(), std::greater<float>());
  return double(x[0]) - x[1];
}

KvCacheConfig fp8_config(const model::ModelConfig& c, std::mt19937* rng) {
  KvCacheConfig kv{KvCacheDtype::kFp8E4M3, {}, {}};
  if (rng) {
    std::uniform_real_distribution<float> factor(0.5f, 2.0f);
    for (int64_t i = 0; i < c.num_hidden_layers * c.num_key_value_heads; ++i) {
      kv.k_scales.push_back(factor(*rng));
      kv.v_scales.push_back(factor(*rng));
    }
  }
  return kv;
}

// One runner, the same prefill with each cache: layer 0's K and V (whose inputs do not depend on
// the cache) in the fp8 pool are the bf16 pool's values quantised with their head's scale; the
// pool takes half the bytes for the same blocks.
TEST(KvFp8Runner, Layer0PoolHoldsTheBf16PoolQuantisedWithItsHeadsScale) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv on("FLASHSERVE_CUDA_FP8_KV", "1");
  auto r = model::cuda::CudaRunner::load(tiny_checkpoint_dir(), 0);
  const model::ModelConfig& c = r->config();
  const int64_t blocks = 16, hkv = c.num_key_value_heads, d = c.head_dim;
  std::mt19937 rng(2302);
  const KvCacheConfig fp8 = fp8_config(c, &rng);
  const auto a = random_tokens(53, c.vocab_size, 21), b = random_tokens(20, c.vocab_size, 22);
  auto prefill = [&](const KvCacheConfig& kv) {
    r->set_kv_cache(kv);
    r->allocate_kv(blocks, kBlock);
    ForwardBatchBuilder bb(kBlock);
    bb.add(a.data(), 0, 53, {5, 2, 9, 0}, true);
    bb.add(b.data(), 0, 20, {14, 7}, true);
    r->forward(std::move(bb).build());
    r->synchronize();
    const auto [ptr, bytes] = r->kv_pool();
    std::vector<uint8_t> pool(bytes);
    EXPECT_EQ(cudaMemcpy(pool.data(), ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return pool;
  };
  const std::vector<uint8_t> p16 = prefill({KvCacheDtype::kBf16, {}, {}});
  const std::vector<uint8_t> p8 = prefill(fp8);
  ASSERT_EQ(p8.size() * 2, p16.size()) << "an fp8 pool of the same blocks is half the bytes";
  const int64_t layer = blocks * kBlock * hkv * d;  // elements of one layer's K (or V)
  const bf16_t* b16 = reinterpret_cast<const bf16_t*>(p16.data());
  const struct {
    int64_t seq_len;
    std::vector<int32_t> pages;
  } seqs[] = {{53, {5, 2, 9, 0}}, {20, {14, 7}}};
  int64_t checked = 0, bad = 0;
  for (int kv = 0; kv < 2; ++kv)  // layer 0's K, then its V
    for (const auto& s : seqs)
      for (int64_t j = 0; j < s.seq_len; ++j)
        for (int64_t h = 0; h < hkv; ++h) {
          const float scale = (kv == 0 ? fp8.k_scales : fp8.v_scales)[h];  // layer 0's heads
          for (int64_t e = 0; e < d; ++e) {
            const int64_t at =
                kv * layer + ((int64_t{s.pages[j / kBlock]} * kBlock + j % kBlock) * hkv + h) * d +
                e;
            const double want = to_float(b16[at]);
            const double got = double(to_float(fp8_e4m3_t{p8[at]})) * scale;
            const double tol = (0x1p-4 + 0x1p-8) * (1 + 0x1p-7) * std::abs(want) + 0x1p-10 * scale;
            ++checked;
            if (!(std::abs(got - want) <= tol) && bad++ < 10)
              ADD_FAILURE() << (kv ? "v" : "k") << " key " << j << " head " << h << " col " << e
                            << ": " << got << " against bf16 " << want << " (scale " << scale
                            << ")";
          }
        }
  EXPECT_EQ(bad, 0) << "of " << checked;
}

// The fp8 cache's logits against the bf16 cache's, within the bound the header derives from the
// CPU runner's two caches; the argmax agrees wherever bf16's top-2 gap is beyond twice it.
TEST(KvFp8Runner, LogitsStayCloseToTheBf16Cache) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv on("FLASHSERVE_CUDA_FP8_KV", "1");
  std::unique_ptr<ModelRunner> cpu;
  try {
    cpu = model::make_cpu_runner(tiny_checkpoint_dir());
  } catch (const Error& e) {  // a build without OpenBLAS has no CPU runner
    if (e.kind() == ErrorKind::kUnsupported) GTEST_SKIP() << e.what();
    throw;
  }
  auto gpu = model::make_cuda_runner(tiny_checkpoint_dir(), 0);
  const KvCacheConfig fp8 = fp8_config(gpu->config(), nullptr), bf16{KvCacheDtype::kBf16, {}, {}};
  const auto g16 = teacher_forced(*gpu, bf16), g8 = teacher_forced(*gpu, fp8);
  const auto c16 = teacher_forced(*cpu, bf16), c8 = teacher_forced(*cpu, fp8);
  ASSERT_EQ(g16.size(), g8.size());
  ASSERT_EQ(g16.size(), c16.size());
  double worst_ratio = 0, largest = 0;
  int agree = 0, must = 0;
  for (size_t i = 0; i < g16.size(); ++i) {
    const double d_cpu = max_diff(c8[i], c16[i]), d_gpu = max_diff(g8[i], g16[i]);
    const double bound = 2 * d_cpu + 0.3;
    EXPECT_LE(d_gpu, bound) << "row " << i << " (cpu's fp8 effect " << d_cpu << ")";
    worst_ratio = std::max(worst_ratio, d_gpu / bound);
    largest = std::max(largest, d_gpu);
    const bool same = argmax(g8[i]) == argmax(g16[i]);
    agree += same;
    if (top2_gap(g16[i]) > 2 * bound) {
      ++must;
      EXPECT_TRUE(same) << "row " << i << ": bf16's top-2 gap " << top2_gap(g16[i]) << " > 2 x "
                        << bound;
    }
  }
  EXPECT_GT(largest, 0.0) << "the fp8 cache changed nothing: is it fp8?";
  std::printf(
      "fp8 vs bf16 cache: max |logit diff| %.4f, at most %.2f of the bound; argmax agrees "
      "at %d of %zu rows (%d had to)\n",
      largest, worst_ratio, agree, g16.size(), must);
}

// 48 greedy tokens from four prompts with each cache (decode graphs on): reported.
TEST(KvFp8Runner, GreedyAgreementIsReported) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv on("FLASHSERVE_CUDA_FP8_KV", "1");
  auto r = model::make_cuda_runner(tiny_checkpoint_dir(), 0);
  const int64_t vocab = r->config().vocab_size, per_seq = 8, n = 4, steps = 48;
  std::vector<std::vector<int32_t>> runs[2];
  for (int cache = 0; cache < 2; ++cache) {
    r->set_kv_cache(cache ? fp8_config(r->config(), nullptr)
                          : KvCacheConfig{KvCacheDtype::kBf16, {}, {}});
    r->allocate_kv(n * per_seq, kBlock);
    std::vector<std::vector<int32_t>> seqs;
    for (int64_t i = 0; i < n; ++i) seqs.push_back(random_tokens(20 + 13 * i, vocab, 30 + i));
    std::vector<int64_t> len(n);
    ForwardBatchBuilder first(kBlock);
    for (int64_t i = 0; i < n; ++i) {
      len[i] = static_cast<int64_t>(seqs[i].size());
      first.add(seqs[i].data(), 0, len[i], sequence_blocks(i, len[i], per_seq, kBlock), true);
    }
    ForwardBatch b = std::move(first).build();
    for (int64_t s = 0; s <= steps; ++s) {
      r->forward(b);
      const auto tok = r->sample(b, std::vector<model::SamplingParams>(n));
      if (s == steps) break;
      for (int64_t i = 0; i < n; ++i) seqs[i].push_back(tok[i]);
      ForwardBatchBuilder bb(kBlock);
      for (int64_t i = 0; i < n; ++i) {
        bb.add(seqs[i].data() + len[i], len[i], 1, sequence_blocks(i, len[i] + 1, per_seq, kBlock),
               true);
        ++len[i];
      }
      b = std::move(bb).build();
    }
    runs[cache] = seqs;
  }
  for (int64_t i = 0; i < n; ++i) {
    const size_t prompt = 20 + 13 * i;
    size_t same = 0;
    while (prompt + same < runs[0][i].size() &&
           runs[0][i][prompt + same] == runs[1][i][prompt + same])
      ++same;
    std::printf("prompt %lld: %zu of %lld greedy tokens agree before the first divergence\n",
                static_cast<long long>(i), same, static_cast<long long>(steps));
    RecordProperty("greedy_agree_" + std::to_string(i), static_cast<int>(same));
  }
}

// Switch off: the runner refuses fp8 by name and keeps serving its bf16 pool.
TEST(KvFp8Runner, RefusedWhileTheSwitchIsOff) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv off("FLASHSERVE_CUDA_FP8_KV", "0");
  auto r = model::make_cuda_runner(tiny_checkpoint_dir(), 0);
  try {
    r->set_kv_cache(fp8_config(r->config(), nullptr));
    ADD_FAILURE() << "fp8 accepted with the switch off";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_EQ(e.argument(), "kv_cache_dtype");
  }
  KvCacheConfig bad{KvCacheDtype::kBf16, {1.0f}, {}};
  EXPECT_THROW(r->set_kv_cache(bad), Error);  // scales beside a bf16 cache
}

}  // namespace
}  // namespace flashserve::testing
