// The sm90 (Hopper) forward kernel, forced with FLASHSERVE_KERNEL=sm90, against the float64 CPU
// reference: bf16/fp16, head dims 64, 128 and 256, grids smaller and larger than one persistent
// wave, dense batches with equal and unequal q/kv lengths
// (1, 17, 128, 130, 1000, 2048; ragged tile edges both ways), causal (bottom-right, including
// rows that see no key) and not, sliding windows (left, right, both), varlen q and k (empty
// sequences too), seqused_k and paged K/V (pages of 16 to 256 keys) over NaN-poisoned unused keys,
// GQA and MQA, outputs poisoned with NaN. Plus the same inputs through the sm80 kernel, a
// determinism check, K/V multicast against the same calls without it, the refusals of what the
// kernel lacks, a small case for compute-sanitizer (Sm90Sanitize*), and the d64 exponentials on
// the FMA pipe against the MUFU path (Sm90Exp2Fma*). Skips without a CUDA device, on devices
// other than compute capability 9.0, and in builds without 90a.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "attention/backends.h"
#include "common/half.h"
#include "support/attention_case.h"
#include "support/compare.h"
#include "support/device_copy.h"
#include "support/nan_cases.h"
#include "support/scoped_env.h"
#include "support/worst.h"

namespace flashserve::testing {
namespace {

#define SKIP_WITHOUT_SM90()                                                                       \
  do {                                                                                            \
    SKIP_WITHOUT_CUDA();                                                                          \
    int major = 0, minor = 0;                                                                     \
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);                         \
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);                         \
    if (major != 9 || minor != 0) GTEST_SKIP() << "skipped: not a compute capability 9.0 device"; \
    if (!attention::cuda_sm90_built()) GTEST_SKIP() << "skipped: built without 90a";              \
  } while (0)

// Runs the case on the GPU with the kernel family `kernel` ("sm90", "sm80" or "auto"); returns the
// output read back as doubles. The case's host out/lse are re-poisoned first, so nothing of an
// earlier run can pass for this one's.
NaiveOutput run_on_gpu(AttentionCase& c, const char* kernel) {
  ScopedEnv env("FLASHSERVE_KERNEL", kernel);
  c.poison_outputs();
  DeviceCopy dev(c);
  attention_forward(dev.params());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download();
  return read_output(c.params());
}

// The case on the sm90 kernel with a switch (FLASHSERVE_SM90_*) at "1", then at "0".
struct SwitchRuns {
  NaiveOutput on, off;
};
SwitchRuns run_switched(AttentionCase& c, const char* variable) {
  SwitchRuns r;
  {
    ScopedEnv on(variable, "1");
    r.on = run_on_gpu(c, "sm90");
  }
  {
    ScopedEnv off(variable, "0");
    r.off = run_on_gpu(c, "sm90");
  }
  return r;
}

// Whether two runs' outputs and LSEs are the same bits.
::testing::AssertionResult same_bits(const NaiveOutput& a, const NaiveOutput& b) {
  if (a.out.size() != b.out.size() || a.lse.size() != b.lse.size())
    return ::testing::AssertionFailure() << "sizes differ";
  if (std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(double)) != 0)
    return ::testing::AssertionFailure() << "out differs";
  if (std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(double)) != 0)
    return ::testing::AssertionFailure() << "lse differs";
  return ::testing::AssertionSuccess();
}

CaseSpec spec(DType dt, int64_t d, int64_t batch, int64_t q_len, int64_t kv_len, int64_t h_q,
              int64_t h_kv, bool causal) {
  CaseSpec s;
  s.dtype = dt;
  s.head_dim = d;
  s.batch = batch;
  s.q_lens = {q_len};
  s.kv_lens = {kv_len};
  s.h_q = h_q;
  s.h_kv = h_kv;
  s.causal = causal;
  return s;
}

// Sliding windows, varlen sequences and seqused_k: the key blocks a tile visits start past 0
// (a left window), blocks need a mask on both sides, query tiles past a shorter sequence's rows
// have no work, and a sequence's last key block reaches into memory that is not its keys
// (another sequence's, or unused keys poisoned with NaN, which the kernel must zero in V).
std::vector<CaseSpec> sm90_mask_and_length_cases() {
  constexpr DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  std::vector<CaseSpec> v;
  auto window = [](CaseSpec s, int32_t left, int32_t right) {
    s.causal = false;
    s.window_left = left;
    s.window_right = right;
    return s;
  };
  for (int64_t d : {64, 128, 256}) {
    const DType dt = d == 128 ? bf16 : fp16;
    // Mistral's causal sliding window: blocks masked on the diagonal and at the window's left
    // edge, fully visible ones between them (d128: 500 keys span 4 blocks of 128; the window
    // 300 leaves the first rows' left edge at 0 and later ones past it).
    v.push_back(window(spec(dt, d, 2, 500, 500, 4, 2, false), 300, 0));
    // A narrow window (every block visited is masked on one side or both), right > 0, and a
    // prefill chunk over a longer cache (q < kv: the window slides along the cache).
    v.push_back(window(spec(dt, d, 1, 300, 300, 2, 1, false), 40, 17));
    v.push_back(window(spec(dt, d, 1, 130, 700, 4, 4, false), 200, 0));
    // Left only (no right edge), and right only with more queries than keys.
    v.push_back(window(spec(dt, d, 1, 257, 400, 2, 2, false), 150, -1));
    v.push_back(window(spec(dt, d, 1, 400, 150, 2, 2, false), -1, 5));
  }
  // Varlen q and k: unequal lengths, an empty sequence, a single-query one, sequences shorter
  // and longer than one query tile and key block, with and without causal and a window.
  for (int64_t d : {64, 128, 256})
    for (int mask = 0; mask < 3; ++mask) {
      CaseSpec s = spec(d == 256 ? bf16 : fp16, d, 4, 0, 0, 8, 2, mask == 1);
      s.q_lens = {130, 0, 1, 300};
      s.kv_lens = {200, 17, 333, 300};
      s.q_layout = QLayout::kVarlen;
      s.kv_layout = KVLayout::kVarlen;
      if (mask == 2) s = window(s, 100, 0);
      v.push_back(s);
    }
  // Varlen q over dense keys with seqused_k: NaN in every unused key row after each sequence's
  // keys, inside the key blocks the kernel loads.
  for (int64_t d : {64, 128, 256})
    for (bool causal : {false, true}) {
      CaseSpec s = spec(bf16, d, 3, 0, 0, 4, 1, causal);
      s.q_lens = {77, 200, 5};
      s.kv_lens = {100, 250, 1};
      s.q_layout = QLayout::kVarlen;
      s.use_seqused_k = true;
      s.kv_extra = 90;
      v.push_back(s);
    }
  // Dense q and k with seqused_k, and varlen keys over dense queries.
  {
    CaseSpec s = spec(fp16, 128, 2, 130, 0, 8, 8, true);
    s.kv_lens = {129, 300};
    s.use_seqused_k = true;
    s.kv_extra = 40;
    v.push_back(s);
    CaseSpec t = spec(bf16, 128, 3, 64, 0, 4, 2, false);
    t.kv_lens = {1, 500, 64};
    t.kv_layout = KVLayout::kVarlen;
    v.push_back(t);
  }
  // Paged K/V (always with seqused_k; unused pages and the rest of each last page poisoned):
  // pages smaller than a key block (several boxes per block: 16 into 80, 128 and 176 keys), as
  // large as one, and larger (a block within a page); varlen chunks over paged caches (the
  // engine's prefill), with a window.
  for (int64_t d : {64, 128, 256})
    for (int64_t page : {16, 64, 256}) {
      CaseSpec s = spec(d == 128 ? bf16 : fp16, d, 3, 0, 0, 8, 2, page != 64);
      s.q_lens = {130, 1, 257};
      s.kv_lens = {300, 77, 1100};
      s.q_layout = QLayout::kVarlen;
      s.kv_layout = KVLayout::kPaged;
      s.page_size = page;
      v.push_back(s);
    }
  {
    CaseSpec s = spec(bf16, 128, 2, 200, 0, 4, 4, false);
    s.kv_lens = {900, 450};
    s.kv_layout = KVLayout::kPaged;
    s.page_size = 48;  // boxes of gcd(176, 48) = 16 rows, pages not a power of two
    v.push_back(s);
    v.push_back(window(s, 256, 0));
  }
  // More tiles than multiprocessors, varlen and windowed: the tile counter over mixed tiles.
  {
    CaseSpec s = spec(bf16, 128, 3, 0, 0, 32, 8, true);
    s.q_lens = {400, 50, 260};
    s.kv_lens = {400, 90, 260};
    s.q_layout = QLayout::kVarlen;
    s.kv_layout = KVLayout::kVarlen;
    v.push_back(window(s, 128, 0));
  }
  return v;
}

// Shapes small enough for the float64 reference (single-threaded) to stay within seconds.
std::vector<CaseSpec> sm90_cases() {
  constexpr DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  std::vector<CaseSpec> v;
  for (DType dt : {bf16, fp16})
    for (bool causal : {false, true}) {
      // Equal lengths: one row, under one tile, exactly one tile, one tile and 2 rows. GQA 4.
      for (int64_t len : {1, 17, 128, 130}) v.push_back(spec(dt, 128, 2, len, len, 8, 2, causal));
      // A prefill chunk over a cached prefix (MQA), and more queries than keys: when causal, the
      // first 223 rows see no key (zero output, lse -inf), some whole tiles among them.
      v.push_back(spec(dt, 128, 1, 77, 300, 8, 1, causal));
      v.push_back(spec(dt, 128, 1, 300, 77, 2, 2, causal));
      // Head dim 64; head dim 256 (80-key blocks: 200 keys end inside the third).
      v.push_back(spec(dt, 64, 2, 130, 200, 4, 1, causal));
      v.push_back(spec(dt, 256, 2, 130, 200, 4, 1, causal));
      v.push_back(spec(dt, 256, 1, 17, 17, 2, 2, causal));
    }
  for (bool causal : {false, true}) {
    v.push_back(spec(bf16, 128, 1, 1000, 1000, 2, 1, causal));  // many key blocks, ring wraps
    v.push_back(spec(fp16, 128, 2, 17, 1000, 32, 8, causal));   // GQA 32/8, batch 2
    v.push_back(spec(bf16, 128, 1, 130, 2048, 4, 1, causal));   // 16 key blocks
    v.push_back(spec(fp16, 128, 1, 1000, 130, 4, 4, causal));   // 8 query tiles, 2 key blocks
    v.push_back(spec(bf16, 64, 1, 1000, 1000, 1, 1, causal));
    v.push_back(spec(fp16, 64, 1, 300, 1500, 4, 1, causal));    // past kShortKeys: DefaultTile
    v.push_back(spec(fp16, 256, 1, 1000, 1000, 2, 1, causal));  // 13 key blocks, ring wraps
    v.push_back(spec(bf16, 256, 1, 300, 77, 2, 2, causal));     // rows without keys (causal)
    v.push_back(spec(bf16, 128, 1, 500, 700, 4, 2, causal));    // 4 blocks of 176 keys (non-causal)
  }
  // More tiles than the H200's 132 multiprocessors: each persistent CTA walks several tiles,
  // K/V ring and Q rounds carried from one to the next; with q > k some tiles have no key.
  for (bool causal : {false, true}) {
    v.push_back(spec(fp16, 128, 3, 130, 130, 40, 8, causal));  // 240 tiles
    v.push_back(spec(bf16, 256, 2, 200, 200, 36, 4, causal));  // 144 tiles
    v.push_back(spec(bf16, 64, 2, 300, 77, 48, 8, causal));    // 288 tiles
  }
  v.push_back(spec(bf16, 128, 1, 1, 2048, 32, 8, false));  // one decode row over 2048 keys
  v.push_back(spec(bf16, 128, 3, 130, 257, 8, 1, false));  // batch 3, MQA 8/1
  // Rows 8 elements apart beyond the head dim: strided (16-byte aligned) q, k, v and out.
  for (int64_t d : {64, 128, 256}) {
    CaseSpec padded = spec(fp16, d, 2, 130, 200, 4, 2, d == 128);
    padded.pad = 8;
    v.push_back(padded);
  }
  CaseSpec no_lse = spec(bf16, 128, 2, 130, 130, 4, 2, true);
  no_lse.with_lse = false;
  v.push_back(no_lse);
  for (const CaseSpec& c : sm90_mask_and_length_cases()) v.push_back(c);
  return v;
}

class Sm90Forward : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(Sm90Forward, MatchesFloat64Reference) {
  SKIP_WITHOUT_SM90();
  CaseSpec s = GetParam();
  s.seed = seed_for(s.name(), 90);
  AttentionCase c(s);
  const NaiveOutput got = run_on_gpu(c, "sm90");
  EXPECT_TRUE(attention_close(got, c.exact(), c.lowp(), s.dtype)) << s.name();
}

INSTANTIATE_TEST_SUITE_P(Shapes, Sm90Forward, ::testing::ValuesIn(sm90_cases()),
                         [](const auto& info) { return info.param.name(); });

// Scores that grow from the last key block to the first (the order the kernel walks them): every
// row's running max grows block after block, by more than the lazy rescale's threshold (2^8) in
// some blocks and rows and less in others (`growth` scales key j by 1 + growth (1 - j / kv_len)),
// so the steps that rescale O, those that keep the max, and warps where only some rows take a new
// max are all exercised. Random N(0, 1) inputs alone almost never move the max that far.
class Sm90LazyRescale : public ::testing::TestWithParam<std::tuple<int64_t, double, bool>> {};

TEST_P(Sm90LazyRescale, GrowingScoresMatchFloat64Reference) {
  SKIP_WITHOUT_SM90();
  const auto [d, growth, causal] = GetParam();
  CaseSpec s = spec(DType::kBFloat16, d, 1, 300, 1500, 4, 2, causal);
  s.seed = seed_for(s.name(), static_cast<uint64_t>(growth));
  AttentionCase c(s);
  std::byte* k = c.buffers()[AttentionCase::kK].host;
  for (int64_t j = 0; j < 1500; ++j)
    for (int64_t i = 0; i < 2 * d; ++i) {  // both kv heads of key j
      const int64_t at = j * 2 * d + i;
      const double f = 1.0 + growth * (1.0 - static_cast<double>(j) / 1500);
      store_float(k, at, s.dtype, static_cast<float>(load_float(k, at, s.dtype) * f));
    }
  const NaiveOutput got = run_on_gpu(c, "sm90");
  EXPECT_TRUE(attention_close(got, c.exact(), c.lowp(), s.dtype)) << s.name();
}

INSTANTIATE_TEST_SUITE_P(Growth, Sm90LazyRescale,
                         ::testing::Combine(::testing::Values<int64_t>(64, 128, 256),
                                            ::testing::Values(12.0, 40.0), ::testing::Bool()),
                         [](const auto& info) {
                           return "d" + std::to_string(std::get<0>(info.param)) + "_growth" +
                                  std::to_string(static_cast<int>(std::get<1>(info.param))) +
                                  (std::get<2>(info.param) ? "_causal" : "");
                         });

// The compute-sanitizer case (memcheck/racecheck/synccheck): two query tiles, ragged key blocks
// wrapping the two-stage ring, GQA, causal.
TEST(Sm90Sanitize, SmallCausalGqa) {
  SKIP_WITHOUT_SM90();
  CaseSpec s = spec(DType::kBFloat16, 128, 1, 130, 300, 4, 2, true);
  s.seed = 901;
  AttentionCase c(s);
  const NaiveOutput got = run_on_gpu(c, "sm90");
  EXPECT_TRUE(attention_close(got, c.exact(), c.lowp(), s.dtype)) << s.name();
}

// Session 18's epilogue under the sanitizers: O's staging buffer and its TMA stores (d64 192 x
// 128, d128 128 x 128), varlen boxes that end inside their sequence, on the sequence's last row,
// past it (register stores) and at the tensor's end.
TEST(Sm90Sanitize, VarlenEpilogueBoxes) {
  SKIP_WITHOUT_SM90();
  for (int64_t d : {64, 128}) {
    CaseSpec s = spec(DType::kBFloat16, d, 4, 0, 0, 4, 2, true);
    s.q_lens = {100, 64, 0, 129};
    s.kv_lens = {100, 300, 5, 129};
    s.q_layout = QLayout::kVarlen;
    s.kv_layout = KVLayout::kVarlen;
    s.seed = 902;
    AttentionCase c(s);
    ScopedEnv on("FLASHSERVE_SM90_EPILOGUE", "1");
    const NaiveOutput got = run_on_gpu(c, "sm90");
    EXPECT_TRUE(attention_close(got, c.exact(), c.lowp(), s.dtype)) << s.name();
  }
}

// ---------------------------------------------------------------------------------------------
// NaN and infinity (issue 9's rule, tests/support/nan_inputs.h): a NaN in q or in a key a row
// sees, or a +inf score, makes that row's output and LSE NaN; a row that sees no key stays zero
// with LSE -inf; every other row matches the reference.

class Sm90Nan : public ::testing::TestWithParam<NanCase> {};

TEST_P(Sm90Nan, RowsThatSeeAPoisonedInputAreNan) {
  SKIP_WITHOUT_SM90();
  expect_nan_rule(
      GetParam(), [](AttentionCase& c) { return run_on_gpu(c, "sm90"); }, "sm90");
}

// Every poison of nan_inputs.h on each shape, bf16 and fp16.
std::vector<NanCase> sm90_nan_cases(const std::vector<CaseSpec>& shapes) {
  std::vector<NanCase> v;
  for (const CaseSpec& shape : shapes)
    for (DType dt : {DType::kBFloat16, DType::kFloat16})
      for (Poison poison : {Poison::kNanQ, Poison::kNanK, Poison::kOverflow}) {
        if (poison == Poison::kOverflow && dt == DType::kFloat16) continue;  // 1e36 is inf
        NanCase nc{shape, poison};
        nc.spec.dtype = dt;
        nc.spec.seed = seed_for(nc.name(), 94);
        v.push_back(nc);
      }
  return v;
}

// What v1 runs: dense, causal or not, d64/d128. Rows that see no key (causal, more queries than
// keys), GQA, and a poison that may fall in a later key block than the first.
INSTANTIATE_TEST_SUITE_P(
    Cases, Sm90Nan,
    ::testing::ValuesIn(sm90_nan_cases({spec(DType::kBFloat16, 64, 2, 40, 30, 4, 4, true),
                                        spec(DType::kBFloat16, 128, 1, 130, 300, 8, 2, false),
                                        spec(DType::kBFloat16, 128, 1, 200, 400, 4, 1, true)})),
    [](const auto& info) { return info.param.name(); });

// ---------------------------------------------------------------------------------------------
// Longer sequences: the reference is the CPU tiled path in float32 (itself tested against
// float64 in CI) on the same stored inputs, with the relative Frobenius error of bf16 operands.

TEST(Sm90Long, Seqlen2048GqaAgainstCpuTiledPath) {
  SKIP_WITHOUT_SM90();
  for (bool causal : {false, true}) {
    CaseSpec s = spec(DType::kBFloat16, 128, 2, 2048, 2048, 16, 4, causal);
    s.seed = seed_for(s.name(), 91);
    AttentionCase c(s);
    const NaiveOutput got = run_on_gpu(c, "sm90");
    c.poison_outputs();
    attention_forward(c.params());  // host buffers: the CPU tiled path
    const NaiveOutput ref = read_output(c.params());
    expect_close_to_tiled(got, ref, s.name());
  }
}

// ---------------------------------------------------------------------------------------------
// The same inputs through the sm80 kernel: both compute the same algorithm at the same precision
// (16-bit P, fp32 accumulation), so they agree far more closely than either agrees with a wrong
// kernel; and both match the float64 reference.

TEST(Sm90VsSm80, SameInputsAgree) {
  SKIP_WITHOUT_SM90();
  for (bool causal : {false, true}) {
    CaseSpec s = spec(DType::kBFloat16, 128, 1, 300, 700, 4, 2, causal);
    s.seed = seed_for(s.name(), 92);
    AttentionCase c(s);
    const NaiveOutput a = run_on_gpu(c, "sm90");
    const NaiveOutput b = run_on_gpu(c, "sm80");
    const NaiveOutput exact = c.exact(), lowp = c.lowp();
    EXPECT_TRUE(attention_close(a, exact, lowp, s.dtype)) << "sm90 " << s.name();
    EXPECT_TRUE(attention_close(b, exact, lowp, s.dtype)) << "sm80 " << s.name();
    double num = 0, den = 0, max_diff = 0, lse_diff = 0;
    for (size_t i = 0; i < a.out.size(); ++i) {
      const double d = a.out[i] - b.out[i];
      num += d * d;
      den += b.out[i] * b.out[i];
      max_diff = testing::worse(max_diff, std::abs(d));
    }
    for (size_t i = 0; i < a.lse.size(); ++i)
      lse_diff = std::max(lse_diff, std::abs(a.lse[i] - b.lse[i]));
    EXPECT_LT(std::sqrt(num / den), 1e-2) << s.name();  // each is ~0.3% off (16-bit P, output)
    EXPECT_LT(max_diff, 3e-2) << s.name();
    EXPECT_LT(lse_diff, 1e-3) << s.name();
  }
}

// The default dispatch takes sm90 for prefill-sized calls where it was measured faster
// (cuda/plan.cc's sm90_preferred), keeps sm80 elsewhere, and what it took matches the
// reference; FLASHSERVE_KERNEL=sm80 keeps sm80.
TEST(Sm90Dispatch, DefaultTakesSm90WhereMeasuredFaster) {
  SKIP_WITHOUT_SM90();
  const auto took = [](CaseSpec s, const char* kernel) {
    s.num_splits = 0;  // the library's default (the test cases' default is 1, no split)
    s.seed = seed_for(s.name(), 95);
    AttentionCase c(s);
    DeviceCopy dev(c);
    ScopedEnv env("FLASHSERVE_KERNEL", kernel);
    const std::string summary = plan_attention(dev.params()).summary();
    return summary.rfind("sm90 ", 0) == 0 ? "sm90" : "sm80";
  };
  constexpr DType bf16 = DType::kBFloat16;
  // 4 x 16 x 4 = 256 query tiles (the sm80 plan does not split below 132, one wave)
  EXPECT_STREQ(took(spec(bf16, 128, 4, 512, 512, 16, 4, true), "auto"), "sm90");
  EXPECT_STREQ(took(spec(bf16, 128, 4, 512, 512, 16, 4, true), ""), "sm90");  // empty is auto
  EXPECT_STREQ(took(spec(DType::kFloat16, 64, 1, 2048, 2048, 32, 32, false), "auto"), "sm90");
  EXPECT_STREQ(took(spec(bf16, 128, 4, 512, 512, 16, 4, true), "sm80"), "sm80");
  // 128 tiles: sm80 would split the keys, sm90 unsplit still fills 3/4 of the SMs
  EXPECT_STREQ(took(spec(bf16, 128, 2, 512, 512, 16, 4, true), "auto"), "sm90");
  EXPECT_STREQ(took(spec(bf16, 128, 4, 256, 256, 16, 4, true), "auto"), "sm80");  // short keys
  EXPECT_STREQ(took(spec(bf16, 64, 2, 1024, 1024, 32, 8, false), "auto"), "sm90");
  EXPECT_STREQ(took(spec(bf16, 64, 4, 512, 512, 32, 8, false), "auto"), "sm90");
  EXPECT_STREQ(took(spec(bf16, 64, 4, 512, 512, 32, 8, true), "auto"), "sm90");     // causal d64
  EXPECT_STREQ(took(spec(bf16, 64, 8, 256, 256, 32, 8, true), "auto"), "sm80");     // 256 keys
  EXPECT_STREQ(took(spec(bf16, 128, 8, 1, 4096, 32, 8, false), "auto"), "sm80");    // decode rows
  EXPECT_STREQ(took(spec(bf16, 128, 1, 128, 32768, 8, 1, false), "auto"), "sm80");  // splits
  EXPECT_STREQ(took(spec(bf16, 256, 2, 2048, 2048, 8, 8, true), "auto"), "sm90");   // d256
  CaseSpec window = spec(bf16, 128, 1, 1024, 1024, 8, 8, true);
  window.window_left = 256;
  EXPECT_STREQ(took(window, "auto"), "sm80");  // 64 tiles: sm80 splits, sm90 would idle
  window.batch = 2;                            // 128 tiles
  EXPECT_STREQ(took(window, "auto"), "sm90");

  // What auto runs, against the float64 reference: 5 x 16 x 2 = 160 query tiles, sm90.
  CaseSpec s = spec(bf16, 128, 2, 600, 700, 16, 4, true);
  s.num_splits = 0;
  EXPECT_STREQ(took(s, "auto"), "sm90");
  s.seed = seed_for(s.name(), 96);
  AttentionCase c(s);
  const NaiveOutput got = run_on_gpu(c, "auto");
  EXPECT_TRUE(attention_close(got, c.exact(), c.lowp(), s.dtype)) << s.name();
}

// The epilogue stores O 16 bytes at a time: the dispatch refuses an output whose rows are not on
// 16-byte boundaries (here a view 4 bytes into its buffer) before any kernel runs, naming it.
TEST(Sm90Epilogue, RefusesAnOutputOffA16ByteBoundary) {
  SKIP_WITHOUT_SM90();
  CaseSpec s = spec(DType::kBFloat16, 128, 2, 130, 200, 8, 2, false);
  AttentionCase c(s);
  DeviceCopy dev(c);
  AttentionParams p = dev.params();
  void* buf = nullptr;
  const auto out = c.buffers()[AttentionCase::kOut];  // a copy: buffers() is a new vector
  ASSERT_EQ(cudaMalloc(&buf, out.bytes + 16), cudaSuccess);
  p.out.data = static_cast<uint8_t*>(buf) + 4;
  ScopedEnv env("FLASHSERVE_KERNEL", "sm90");
  try {
    attention_forward(p);
    ADD_FAILURE() << "no error for an output 4 bytes off a 16-byte boundary";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "out") << e.what();
  }
  cudaFree(buf);
}

// A moving error between two runs on the same inputs is a race.
TEST(Sm90Determinism, SameInputsSameBits) {
  SKIP_WITHOUT_SM90();
  CaseSpec s = spec(DType::kBFloat16, 128, 2, 1000, 1000, 8, 2, true);
  s.seed = 93;
  AttentionCase c(s);
  const NaiveOutput first = run_on_gpu(c, "sm90");
  for (int run = 1; run < 3; ++run) {
    const NaiveOutput again = run_on_gpu(c, "sm90");
    ASSERT_EQ(again.out.size(), first.out.size());
    EXPECT_EQ(std::memcmp(again.out.data(), first.out.data(), first.out.size() * sizeof(double)), 0)
        << "run " << run << " differs from run 0 (out)";
    EXPECT_EQ(std::memcmp(again.lse.data(), first.lse.data(), first.lse.size() * sizeof(double)), 0)
        << "run " << run << " differs from run 0 (lse)";
  }
}

// K/V multicast over clusters of two CTAs (tile_config.h's Multicast) changes where K/V come from,
// not the arithmetic: the same calls with FLASHSERVE_SM90_MULTICAST=0 give the same bits. The
// shapes take it (unmasked, dense, an even number of query tiles): one pair, pairs whose second
// tile is ragged, more pairs than resident clusters (each cluster walks several; fp16 and GQA),
// a prefill chunk over a longer cache, and d256's four column chunks (two per CTA).
TEST(Sm90Multicast, SameBitsAsWithout) {
  SKIP_WITHOUT_SM90();
  const CaseSpec shapes[] = {
      spec(DType::kBFloat16, 128, 2, 256, 256, 4, 2, false),
      spec(DType::kBFloat16, 128, 1, 200, 1000, 4, 1, false),
      spec(DType::kFloat16, 128, 3, 130, 130, 40, 8, false),
      spec(DType::kBFloat16, 128, 2, 1000, 2050, 8, 8, false),
      spec(DType::kFloat16, 256, 2, 250, 300, 36, 4, false),
  };
  for (CaseSpec s : shapes) {
    s.seed = seed_for(s.name(), 94);
    AttentionCase c(s);
    const NaiveOutput with = run_on_gpu(c, "sm90");
    EXPECT_TRUE(attention_close(with, c.exact(), c.lowp(), s.dtype)) << s.name();
    ScopedEnv off("FLASHSERVE_SM90_MULTICAST", "0");
    const NaiveOutput without = run_on_gpu(c, "sm90");
    EXPECT_TRUE(same_bits(with, without)) << s.name() << " with multicast";
  }
}

// A call at head dim d with the sm90 kernel forced and `variable` set to a value it does not take
// is refused naming the variable.
void expect_switch_refused(const char* variable, int64_t d = 128) {
  CaseSpec s = spec(DType::kBFloat16, d, 1, 256, 256, 2, 2, false);
  AttentionCase c(s);
  DeviceCopy dev(c);
  ScopedEnv kernel("FLASHSERVE_KERNEL", "sm90");
  ScopedEnv bad(variable, "yes");
  try {
    attention_forward(dev.params());
    ADD_FAILURE() << "no error for " << variable << "=yes";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), variable) << e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
  }
}

TEST(Sm90Multicast, AnUnknownSwitchValueIsRefusedByName) {
  SKIP_WITHOUT_SM90();
  expect_switch_refused("FLASHSERVE_SM90_MULTICAST");
}

// Session 18's tile boundary (tile_config.h OverlappedEpilogue: O through shared memory and TMA
// stores where the staging fits, the tile's work announced by the producer) changes how O
// leaves and where the consumers learn a tile's lengths, not the arithmetic: the same calls with
// FLASHSERVE_SM90_EPILOGUE=0 (the register stores) give the same bits, and both match the float64
// reference. The shapes cover every tile the switch reaches (d64 192 x 128 and 128 x 128, d128
// 128 x 128 with and without multicast and causal, each with a staging buffer of its own) and the
// tiles it leaves alone (d128 128 x 176 and d256, no room for the staging: fwd_kernel.h
// EpilogueTile), grids larger than a wave (the counter, the
// fixed stride), GQA and fp16, and the hazard of the TMA store: varlen sequences
// ending inside a warpgroup's 64 rows (their boxes would reach into the next sequence's rows;
// tma_box_in_sequence sends them to the register stores), sequences of exactly 64 and 128 rows
// (boxes that end on the sequence's last row), an empty and a single-row sequence, the tensor's
// last sequence ending mid-box (the box clips at the map's end), paged K/V under varlen chunks.
std::vector<CaseSpec> sm90_epilogue_cases() {
  constexpr DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  std::vector<CaseSpec> v;
  for (bool causal : {false, true}) {
    v.push_back(spec(bf16, 64, 2, 500, 500, 4, 1, causal));    // d64 192x128 / 128x128
    v.push_back(spec(fp16, 64, 2, 300, 1500, 4, 1, causal));   // d64 past kShortKeys
    v.push_back(spec(bf16, 128, 2, 512, 512, 8, 2, causal));   // d128 128x128 (multicast)
    v.push_back(spec(bf16, 128, 1, 384, 384, 4, 4, causal));   // d128 128x128, odd tiles
    v.push_back(spec(fp16, 128, 3, 130, 130, 40, 8, causal));  // 240 tiles, GQA 5
    v.push_back(spec(bf16, 128, 1, 500, 1500, 4, 2, causal));  // d128 128x176 (left alone)
    v.push_back(spec(fp16, 256, 2, 200, 200, 36, 4, causal));  // d256 (left alone), 144 tiles
    v.push_back(spec(bf16, 128, 1, 300, 77, 2, 2, causal));    // causal rows without keys
  }
  for (int64_t d : {64, 128, 256})
    for (bool causal : {false, true}) {
      CaseSpec s = spec(d == 128 ? bf16 : fp16, d, 8, 0, 0, 8, 2, causal);
      s.q_lens = {100, 64, 0, 70, 1, 128, 193, 129};
      s.kv_lens = {100, 640, 5, 70, 300, 128, 193, 260};
      s.q_layout = QLayout::kVarlen;
      s.kv_layout = KVLayout::kVarlen;
      v.push_back(s);
    }
  {
    // Varlen chunks over a paged cache (the engine's prefill), the last chunk ending mid-box.
    CaseSpec s = spec(bf16, 128, 3, 0, 0, 8, 2, true);
    s.q_lens = {130, 1, 257};
    s.kv_lens = {300, 77, 1100};
    s.q_layout = QLayout::kVarlen;
    s.kv_layout = KVLayout::kPaged;
    s.page_size = 16;
    v.push_back(s);
    s.head_dim = 64;
    s.page_size = 256;
    v.push_back(s);
  }
  {
    // Many varlen sequences of 1-200 rows: more tiles than a wave, most of them ragged.
    CaseSpec s = spec(fp16, 128, 40, 0, 0, 16, 4, false);
    s.q_lens.clear();
    s.kv_lens.clear();
    for (int i = 0; i < 40; ++i) {
      s.q_lens.push_back(1 + (i * 37) % 200);
      s.kv_lens.push_back(1 + (i * 53) % 700);
    }
    s.q_layout = QLayout::kVarlen;
    s.kv_layout = KVLayout::kVarlen;
    v.push_back(s);
    s.causal = true;
    v.push_back(s);
  }
  return v;
}

TEST(Sm90Epilogue, SameBitsAsTheRegisterStores) {
  SKIP_WITHOUT_SM90();
  for (CaseSpec s : sm90_epilogue_cases()) {
    s.seed = seed_for(s.name(), 18);
    AttentionCase c(s);
    const SwitchRuns r = run_switched(c, "FLASHSERVE_SM90_EPILOGUE");
    EXPECT_TRUE(attention_close(r.on, c.exact(), c.lowp(), s.dtype)) << s.name();
    EXPECT_TRUE(attention_close(r.off, c.exact(), c.lowp(), s.dtype)) << s.name();
    EXPECT_TRUE(same_bits(r.on, r.off)) << s.name() << " between the two epilogues";
  }
}

// The TMA stores are asynchronous: a race between a tile's box and a neighbour's rows would show
// as bits that move between runs of the same inputs.
TEST(Sm90Epilogue, SameInputsSameBits) {
  SKIP_WITHOUT_SM90();
  CaseSpec s = spec(DType::kBFloat16, 128, 8, 0, 0, 8, 2, true);
  s.q_lens = {100, 64, 0, 70, 1, 128, 193, 129};
  s.kv_lens = {100, 640, 5, 70, 300, 128, 193, 260};
  s.q_layout = QLayout::kVarlen;
  s.kv_layout = KVLayout::kVarlen;
  s.seed = 1818;
  AttentionCase c(s);
  ScopedEnv on("FLASHSERVE_SM90_EPILOGUE", "1");
  const NaiveOutput first = run_on_gpu(c, "sm90");
  for (int run = 1; run < 4; ++run) {
    const NaiveOutput again = run_on_gpu(c, "sm90");
    ASSERT_EQ(again.out.size(), first.out.size());
    EXPECT_EQ(std::memcmp(again.out.data(), first.out.data(), first.out.size() * sizeof(double)), 0)
        << "run " << run;
  }
}

TEST(Sm90Epilogue, AnUnknownSwitchValueIsRefusedByName) {
  SKIP_WITHOUT_SM90();
  expect_switch_refused("FLASHSERVE_SM90_EPILOGUE");
}

// ---------------------------------------------------------------------------------------------
// Part of the d64 softmax's exponentials on the FMA pipe (FLASHSERVE_SM90_EXP2_FMA, tile_config.h
// Exp2Fma, exp2_poly.h). Not the same bits as the MUFU path: exp2_poly and ex2.approx.f32 differ
// by up to ~3.3e-7 of P (2^-23.5 the polynomial's relative error, tests/attention/
// exp2_poly_test.cc, plus ex2.approx's ~2^-22). In fp32 that moves O and the row sums by ~1e-6
// relative, far below a 16-bit output's unit in the last place (ulp); what can show is rounding:
// a P within that distance of a 16-bit rounding boundary rounds the other way for P V (O moves
// by that P's ulp x |V| / sum: rare, and small but for a row's largest keys), and an output
// value near a boundary rounds to the neighbouring 16-bit value. Both paths must pass the float64
// reference by the usual rule, and differ from each other by at most two ulps of the output's
// largest magnitude (one for the output's rounding, one for P's); the LSE (fp32, log of the sum)
// by at most 1e-6 + 2^-22 |lse|.

// The difference allowed between the two paths' outputs (above): 2 ulps of the 16-bit format
// (8 significant bits bf16, 11 fp16) at the largest |out| of the reference.
double exp2_fma_out_bound(const NaiveOutput& exact, DType dt) {
  const double largest = std::max(detail::max_abs(exact.out), 1e-30);
  const int significant_bits = dt == DType::kBFloat16 ? 8 : 11;
  return 2.0 * std::ldexp(1.0, std::ilogb(largest) - (significant_bits - 1));
}

::testing::AssertionResult within_exp2_rounding(const NaiveOutput& on, const NaiveOutput& off,
                                                const NaiveOutput& exact, DType dt) {
  if (on.out.size() != off.out.size() || on.lse.size() != off.lse.size())
    return ::testing::AssertionFailure() << "sizes differ";
  const double bound = exp2_fma_out_bound(exact, dt);
  double worst = 0.0;
  int64_t at = -1, differ = 0, compared = 0;
  for (size_t i = 0; i < on.out.size(); ++i) {
    if (std::isnan(exact.out[i])) continue;  // rows of no sequence (varlen padding)
    const double d = std::abs(on.out[i] - off.out[i]);
    ++compared;
    differ += on.out[i] != off.out[i];
    if (!(d <= worst)) worst = d, at = static_cast<int64_t>(i);  // NaN is the worst
  }
  int64_t lse_beyond = -1;  // a row whose LSEs differ by more than their bound
  for (size_t r = 0; r < on.lse.size() && lse_beyond < 0; ++r) {
    if (!std::isfinite(exact.lse[r])) continue;  // no key: -inf in both (attention_close)
    if (!(std::abs(on.lse[r] - off.lse[r]) <= 1e-6 + std::ldexp(std::abs(exact.lse[r]), -22)))
      lse_beyond = static_cast<int64_t>(r);
  }
  std::ostringstream note;
  note << "on/off: max |out diff| " << worst << " (bound " << bound << ") at element " << at << ", "
       << differ << " of " << compared << " elements differ";
  if (lse_beyond >= 0)
    note << "; lse of row " << lse_beyond << ": " << on.lse[lse_beyond] << " on, "
         << off.lse[lse_beyond] << " off";
  if (!(worst <= bound) || lse_beyond >= 0) return ::testing::AssertionFailure() << note.str();
  return ::testing::AssertionSuccess() << note.str();
}

// Every d64 tile the switch reaches (ShortTile 192 x 128 and causal 128 x 128, DefaultTile past
// kShortKeys), each with and without session 18's epilogue: dense causal and not, grids larger
// than a wave (GQA 6), a sliding window (masked blocks on both sides of unmasked ones), varlen
// sequences (empty, single-row, ragged tiles) and varlen chunks over 16-key pages (cp.async).
std::vector<CaseSpec> sm90_exp2_fma_cases() {
  constexpr DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  std::vector<CaseSpec> v;
  for (bool causal : {false, true}) {
    v.push_back(spec(bf16, 64, 2, 500, 500, 4, 1, causal));   // ShortTile, 4 key blocks
    v.push_back(spec(fp16, 64, 1, 300, 1500, 4, 1, causal));  // DefaultTile, 12 key blocks
    v.push_back(spec(bf16, 64, 2, 300, 300, 48, 8, causal));  // 192 / 288 tiles
    CaseSpec s = spec(fp16, 64, 6, 0, 0, 8, 2, causal);
    s.q_lens = {100, 64, 0, 1, 193, 129};
    s.kv_lens = {100, 640, 5, 300, 193, 260};
    s.q_layout = QLayout::kVarlen;
    s.kv_layout = KVLayout::kVarlen;
    v.push_back(s);
  }
  CaseSpec window = spec(fp16, 64, 1, 300, 700, 4, 2, false);
  window.window_left = 200;
  window.window_right = 0;
  v.push_back(window);
  CaseSpec paged = spec(bf16, 64, 3, 0, 0, 8, 2, true);
  paged.q_lens = {130, 1, 257};
  paged.kv_lens = {300, 77, 1100};
  paged.q_layout = QLayout::kVarlen;
  paged.kv_layout = KVLayout::kPaged;
  paged.page_size = 16;
  v.push_back(paged);
  return v;
}

TEST(Sm90Exp2Fma, MatchesFloat64ReferenceAndTheMufuPathWithinRounding) {
  SKIP_WITHOUT_SM90();
  for (CaseSpec s : sm90_exp2_fma_cases()) {
    s.seed = seed_for(s.name(), 20);
    AttentionCase c(s);
    for (const char* epilogue : {"0", "1"}) {
      ScopedEnv boundary("FLASHSERVE_SM90_EPILOGUE", epilogue);
      const SwitchRuns r = run_switched(c, "FLASHSERVE_SM90_EXP2_FMA");
      const std::string name = s.name() + (*epilogue == '1' ? " epilogue" : "");
      EXPECT_TRUE(attention_close(r.on, c.exact(), c.lowp(), s.dtype)) << name;
      EXPECT_TRUE(attention_close(r.off, c.exact(), c.lowp(), s.dtype)) << name;
      EXPECT_TRUE(within_exp2_rounding(r.on, r.off, c.exact(), s.dtype)) << name;
    }
  }
}

// d128 and d256 have no Exp2Fma tiles (GEMM-bound): the switch leaves their bits alone.
TEST(Sm90Exp2Fma, OtherHeadDimsKeepTheirBits) {
  SKIP_WITHOUT_SM90();
  for (bool causal : {false, true})
    for (CaseSpec s : {spec(DType::kBFloat16, 128, 2, 300, 300, 8, 2, causal),
                       spec(DType::kFloat16, 256, 1, 200, 200, 4, 2, causal)}) {
      s.seed = seed_for(s.name(), 20);
      AttentionCase c(s);
      const SwitchRuns r = run_switched(c, "FLASHSERVE_SM90_EXP2_FMA");
      EXPECT_TRUE(same_bits(r.on, r.off)) << s.name();
    }
}

// The NaN rule with the polynomial: a NaN score stays NaN through exp2_poly (its max keeps NaN),
// a masked one (-inf) weighs 0. Key blocks longer than 64 keys, so that the polynomial's chunks
// (columns 56-63 and 120-127 of each block) hold real scores.
TEST(Sm90Exp2Fma, RowsThatSeeAPoisonedInputAreNan) {
  SKIP_WITHOUT_SM90();
  ScopedEnv fma("FLASHSERVE_SM90_EXP2_FMA", "1");
  for (const NanCase& nc : sm90_nan_cases({spec(DType::kBFloat16, 64, 1, 130, 300, 8, 2, false),
                                           spec(DType::kBFloat16, 64, 1, 200, 400, 4, 1, true)}))
    expect_nan_rule(
        nc, [](AttentionCase& c) { return run_on_gpu(c, "sm90"); }, "sm90 exp2 fma");
}

TEST(Sm90Exp2Fma, AnUnknownSwitchValueIsRefusedByName) {
  SKIP_WITHOUT_SM90();
  expect_switch_refused("FLASHSERVE_SM90_EXP2_FMA", 64);
}

// What the kernel lacks (pages of other than a multiple of 8 keys, split-KV) is refused naming
// FLASHSERVE_KERNEL (which also shows
// that the variable reaches the dispatch: without it these calls would run on sm80).
TEST(Sm90Refusals, NamesTheForcedKernel) {
  SKIP_WITHOUT_SM90();
  auto expect_refused = [](CaseSpec s) {
    AttentionCase c(s);
    DeviceCopy dev(c);
    ScopedEnv env("FLASHSERVE_KERNEL", "sm90");
    try {
      attention_forward(dev.params());
      ADD_FAILURE() << "no error for " << s.name();
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHSERVE_KERNEL") << e.what();
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
    }
  };
  CaseSpec paged = spec(DType::kBFloat16, 128, 2, 64, 64, 4, 2, false);
  paged.kv_layout = KVLayout::kPaged;
  paged.page_size = 12;  // TMA boxes within a page need a multiple of 8 rows
  expect_refused(paged);
  CaseSpec split = spec(DType::kBFloat16, 128, 1, 64, 1000, 2, 2, false);
  split.num_splits = 3;
  expect_refused(split);
}

}  // namespace
}  // namespace flashserve::testing
