// The CUDA backward through the public API, against the float64 reference backward, with each
// kernel family forced by FLASHSERVE_BWD_KERNEL: sm80 (src/attention/sm80/bwd_kernel.h) and sm90
// (src/attention/sm90/bwd_kernel.h), the latter with each of its dQ paths
// (FLASHSERVE_SM90_BWD_DQ_BULK: per-element atomics, or a shared-memory tile added by a TMA bulk
// reduce-add; either sums dq in no fixed order, so both are held to the reference, not to each
// other's bits), the bulk path's step in FlashAttention-3's order (FLASHSERVE_SM90_BWD_OVERLAP:
// the same products in the same order, so dk and dv keep their bits) and its masked grids'
// CTAs launched heaviest first (FLASHSERVE_SM90_BWD_HEAVY_FIRST: the same CTAs in another order,
// so dk and dv keep their bits too) and its persistent grid (FLASHSERVE_SM90_BWD_PERSISTENT, with
// the overlapped step off and on: the same tiles looped over by fewer CTAs, dk and dv keep their
// bits); and head dim 256 on sm90 (FLASHSERVE_SM90_BWD_D256=1, src/attention/sm90/
// bwd_swapped_kernel.h: the main shapes at d256 and the padded ones at 136-248, the Sanitize
// subset, the dLSE path, dk and dv repeating bit for bit). Each case runs our CPU
// forward on the host (out and lse as a training step saves them), copies every buffer to the
// device (gradients poisoned with NaN), runs attention_backward there and compares dq, dk, dv by
// support/compare.h's rule. The instantiations named Sanitize are the small subset for
// compute-sanitizer (with atomics and in deterministic mode). Without a CUDA device every test
// skips with "skipped: no CUDA device"; the sm90 runs also skip (saying why) on devices other than
// compute capability 9.0 and in builds without 90a.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention/backends.h"
#include "flashserve/attention_backward.h"
#include "support/backward_case.h"
#include "support/compare.h"
#include "support/device_copy.h"
#include "support/scoped_env.h"

namespace flashserve::testing {
namespace {

using attention::reference::Emulate;

// Device copies of a backward case's buffers (the attention's and the gradients'), freed on
// destruction.
class BackwardDevice {
 public:
  explicit BackwardDevice(BackwardCase& c) : c_(c) {
    for (const auto& b : c.attention().buffers()) attn_.push_back(upload(b));
    for (const auto& b : c.grad_buffers()) grads_.push_back(upload(b));
  }
  ~BackwardDevice() {
    for (void* p : attn_) cudaFree(p);
    for (void* p : grads_) cudaFree(p);
  }
  AttentionBackwardParams params() { return c_.params(kGpu, attn_.data(), grads_.data()); }
  void download_grads() {
    const auto bufs = c_.grad_buffers();
    for (int g : {BackwardCase::kDq, BackwardCase::kDk, BackwardCase::kDv})
      if (bufs[g].bytes)
        EXPECT_EQ(cudaMemcpy(bufs[g].host, grads_[g], bufs[g].bytes, cudaMemcpyDeviceToHost),
                  cudaSuccess);
  }

 private:
  static void* upload(const AttentionCase::BufferInfo& b) {
    void* d = nullptr;
    if (b.bytes) {
      EXPECT_EQ(cudaMalloc(&d, b.bytes), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(d, b.host, b.bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
    return d;
  }
  BackwardCase& c_;
  std::vector<void*> attn_, grads_;
};

// The kernel family a run forces (FLASHSERVE_BWD_KERNEL) and, for sm90, its dQ path
// (FLASHSERVE_SM90_BWD_DQ_BULK): kSm90 the atomics, kSm90DqBulk the bulk reduce-add, kSm90Overlap
// the bulk reduce-add with the overlapped step (FLASHSERVE_SM90_BWD_OVERLAP), kSm90HeavyFirst the
// bulk reduce-add with a masked grid's key blocks heaviest first (FLASHSERVE_SM90_BWD_HEAVY_FIRST;
// unmasked calls run as kSm90DqBulk), kSm90Persistent and kSm90PersistentOverlap the bulk
// reduce-add on the persistent grid (FLASHSERVE_SM90_BWD_PERSISTENT), with each step order;
// kSm90D256 the d256 kernel (FLASHSERVE_SM90_BWD_D256=1; every other run sets it to 0, so that
// forced sm90 at d256 refuses there); kSm90FusedDq the bulk reduce-add with each unit's last CTA
// converting dq (FLASHSERVE_SM90_BWD_FUSED_DQ=1, the overlapped step at its default; varlen and
// seqused_k calls keep the postprocess; every other run sets it to 0).
enum class Family {
  kSm80,
  kSm90,
  kSm90DqBulk,
  kSm90Overlap,
  kSm90HeavyFirst,
  kSm90Persistent,
  kSm90PersistentOverlap,
  kSm90D256,
  kSm90FusedDq
};
const char* family_name(Family f) {
  static constexpr const char* kNames[] = {"sm80",
                                           "sm90",
                                           "sm90_dq_bulk",
                                           "sm90_overlap",
                                           "sm90_heavy_first",
                                           "sm90_persistent",
                                           "sm90_persistent_overlap",
                                           "sm90_d256",
                                           "sm90_fused_dq"};
  return kNames[static_cast<int>(f)];
}

// The sm90 kernel runs on compute capability 9.0 devices of builds with 90a only.
#define SKIP_WITHOUT_FAMILY(family)                                                         \
  do {                                                                                      \
    SKIP_WITHOUT_CUDA();                                                                    \
    if ((family) != Family::kSm80) {                                                        \
      int major = 0, minor = 0;                                                             \
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);                 \
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);                 \
      if (major != 9 || minor != 0)                                                         \
        GTEST_SKIP() << "skipped: the sm90 backward needs a compute capability 9.0 device"; \
      if (!attention::cuda_sm90_built()) GTEST_SKIP() << "skipped: built without 90a";      \
    }                                                                                       \
  } while (0)

// Runs the backward on the device with `family` forced; returns the gradients read back.
attention::reference::NaiveGrads run_on_gpu(BackwardCase& bc, Family family,
                                            bool deterministic = false) {
  ScopedEnv env("FLASHSERVE_BWD_KERNEL", family == Family::kSm80 ? "sm80" : "sm90");
  ScopedEnv dq_path("FLASHSERVE_SM90_BWD_DQ_BULK", family == Family::kSm90 ? "0" : "1");
  const bool persistent =
      family == Family::kSm90Persistent || family == Family::kSm90PersistentOverlap;
  ScopedEnv overlap("FLASHSERVE_SM90_BWD_OVERLAP",
                    family == Family::kSm90FusedDq ? ""
                    : family == Family::kSm90Overlap || family == Family::kSm90PersistentOverlap
                        ? "1"
                        : "0");
  ScopedEnv fused_dq("FLASHSERVE_SM90_BWD_FUSED_DQ", family == Family::kSm90FusedDq ? "1" : "0");
  ScopedEnv heavy_first("FLASHSERVE_SM90_BWD_HEAVY_FIRST",
                        family == Family::kSm90HeavyFirst ? "1" : "0");
  ScopedEnv persistent_grid("FLASHSERVE_SM90_BWD_PERSISTENT", persistent ? "1" : "0");
  ScopedEnv d256("FLASHSERVE_SM90_BWD_D256", family == Family::kSm90D256 ? "1" : "0");
  BackwardDevice dev(bc);
  AttentionBackwardParams p = dev.params();
  p.deterministic = deterministic;
  attention_backward(p);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download_grads();
  return bc.read();
}

// Each of `runs` (the gradients of one family's run) against the case's float64 references.
void expect_matches_reference(BackwardCase& bc,
                              std::initializer_list<const attention::reference::NaiveGrads*> runs,
                              const std::string& name) {
  const auto exact = bc.reference(Emulate::kExact);
  const auto lowp = bc.reference(Emulate::kLowPrecision);
  const DType dt = bc.attention().spec().dtype;
  for (const auto* got : runs) {
    EXPECT_TRUE(grad_close(got->dq, exact.dq, lowp.dq, dt, "dq")) << name;
    EXPECT_TRUE(grad_close(got->dk, exact.dk, lowp.dk, dt, "dk")) << name;
    EXPECT_TRUE(grad_close(got->dv, exact.dv, lowp.dv, dt, "dv")) << name;
  }
}

void check_case(CaseSpec s, Family family, bool with_dlse = false, bool deterministic = false) {
  s.seed = seed_for(s.name() + (with_dlse ? "dlse" : ""), 2290);
  BackwardCase bc(s, with_dlse);
  bc.run_forward();  // on the host buffers, before they are copied
  const auto got = run_on_gpu(bc, family, deterministic);
  expect_matches_reference(bc, {&got}, s.name() + " " + family_name(family));
}

CaseSpec spec(DType dt, int64_t d, int64_t batch, int64_t q, int64_t k, int64_t h_q, int64_t h_kv,
              bool causal) {
  CaseSpec s;
  s.dtype = dt, s.head_dim = d, s.batch = batch, s.q_lens = {q}, s.kv_lens = {k};
  s.h_q = h_q, s.h_kv = h_kv, s.causal = causal;
  return s;
}

// The main shapes at each of `dims`.
std::vector<CaseSpec> cases_at(std::initializer_list<int64_t> dims) {
  std::vector<CaseSpec> v;
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    for (int64_t d : dims)
      for (bool causal : {false, true}) {
        v.push_back(spec(dt, d, 2, 1, 1, 2, 2, causal));
        v.push_back(spec(dt, d, 2, 127, 127, 4, 1, causal));  // GQA 4, odd length
        v.push_back(spec(dt, d, 1, 77, 300, 8, 1, causal));   // q_len < kv_len, GQA 8
        v.push_back(spec(dt, d, 1, 300, 77, 2, 2, causal));   // q_len > kv_len: masked rows
        CaseSpec w = spec(dt, d, 1, 200, 257, 2, 1, false);
        w.window_left = 37, w.window_right = causal ? 0 : 11;  // sliding windows
        v.push_back(w);
        CaseSpec var = spec(dt, d, 4, 1, 1, 4, 2, causal);
        var.q_lens = {33, 0, 129, 7}, var.kv_lens = {65, 9, 129, 0};  // empty sequences
        var.q_layout = QLayout::kVarlen, var.kv_layout = KVLayout::kVarlen;
        v.push_back(var);
      }
  // Several key blocks and query blocks per CTA (sm90: 128 keys, 64 or 128 queries, d256 64 x 64;
  // the Q/dO ring wraps many times over the GQA group's heads), and seqused_k with the unused
  // keys poisoned with NaN (the last key block reads them; they must not reach dq).
  for (int64_t d : dims) {
    v.push_back(spec(DType::kBFloat16, d, 1, 520, 520, 4, 1, true));
    v.push_back(spec(DType::kFloat16, d, 1, 513, 700, 2, 2, false));
    CaseSpec used = spec(DType::kBFloat16, d, 2, 40, 70, 4, 2, true);
    used.use_seqused_k = true, used.kv_extra = 30;
    v.push_back(used);
    CaseSpec var = spec(DType::kBFloat16, d, 3, 1, 1, 4, 1, false);
    var.q_lens = {300, 5, 130}, var.kv_lens = {260, 400, 129};
    var.q_layout = QLayout::kVarlen, var.kv_layout = KVLayout::kVarlen;
    var.window_left = 50, var.window_right = 20;
    v.push_back(var);
    // Short varlen sequences, so that one 64-row dQ box spans several sequences (the bulk path
    // adds its exact zeros past a sequence's queries into the next ones' rows while those add
    // their own), a query block reaching past the last row, GQA 4.
    CaseSpec tiny = spec(DType::kBFloat16, d, 5, 1, 1, 8, 2, true);
    tiny.q_lens = {1, 2, 3, 64, 65}, tiny.kv_lens = {5, 1, 130, 64, 200};
    tiny.q_layout = QLayout::kVarlen, tiny.kv_layout = KVLayout::kVarlen;
    v.push_back(tiny);
    // A window that no query of the first key blocks' keys sees: their CTAs have no step (sm90:
    // the dQ writer warp hands nothing over), their dK and dV are zeros.
    CaseSpec unseen = spec(DType::kBFloat16, d, 2, 10, 600, 4, 2, false);
    unseen.window_left = 20, unseen.window_right = 0;
    v.push_back(unseen);
  }
  return v;
}
std::vector<CaseSpec> cases() {
  return cases_at({64, 128});
}

// Every case through both families, sm90 with each dQ path and with the fused dQ conversion (and,
// given `switches`, the bulk path's other switches too: GpuBackwardOverlap, GpuBackwardHeavyFirst
// and GpuBackwardPersistent run the main shapes through them beside the bulk path).
using FamilyCase = std::tuple<CaseSpec, Family>;
std::vector<FamilyCase> with_families(const std::vector<CaseSpec>& specs, bool switches = false) {
  std::vector<FamilyCase> v;
  for (Family f : {Family::kSm80, Family::kSm90, Family::kSm90DqBulk, Family::kSm90FusedDq,
                   Family::kSm90Overlap, Family::kSm90HeavyFirst, Family::kSm90Persistent,
                   Family::kSm90PersistentOverlap})
    if (switches || f == Family::kSm80 || f == Family::kSm90 || f == Family::kSm90DqBulk ||
        f == Family::kSm90FusedDq)
      for (const CaseSpec& s : specs) v.emplace_back(s, f);
  return v;
}
std::string case_name(const ::testing::TestParamInfo<FamilyCase>& info) {
  return std::get<0>(info.param).name() + "_" + family_name(std::get<1>(info.param));
}

class GpuBackward : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(GpuBackward, MatchesFloat64Reference) {
  const auto& [s, family] = GetParam();
  SKIP_WITHOUT_FAMILY(family);
  check_case(s, family);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuBackward, ::testing::ValuesIn(with_families(cases())),
                         case_name);

// The compute-sanitizer subset: a masked and an unmasked case per head dim, and for sm90 a CTA
// with several query blocks over two stages and two GQA heads (the ring's phases and the dS
// buffers' reuse) and varlen keys that end inside a key block (the K rows zeroed past them).
std::vector<CaseSpec> sanitize_cases() {
  CaseSpec var = spec(DType::kBFloat16, 128, 2, 1, 1, 4, 2, true);
  var.q_lens = {150, 40}, var.kv_lens = {90, 200};
  var.q_layout = QLayout::kVarlen, var.kv_layout = KVLayout::kVarlen;
  return {spec(DType::kBFloat16, 64, 1, 70, 90, 4, 2, true),
          spec(DType::kFloat16, 128, 1, 65, 33, 2, 1, false),
          spec(DType::kBFloat16, 128, 1, 200, 150, 4, 2, false),
          spec(DType::kFloat16, 64, 1, 300, 260, 2, 1, true), var};
}
INSTANTIATE_TEST_SUITE_P(Sanitize, GpuBackward,
                         ::testing::ValuesIn(with_families(sanitize_cases(), /*switches=*/true)),
                         case_name);

// Head dim 256 on sm90 (FLASHSERVE_SM90_BWD_D256=1): the main shapes, and its compute-sanitizer
// subset: masked with two GQA heads over several query blocks (the ring's two stages, which also
// hold the dQ tiles, wrap; the dQ hand-off's barriers alternate), unmasked with q_len > kv_len,
// varlen keys that end inside a key block (K's rows zeroed past them), and a padded head dim.
std::vector<FamilyCase> d256_family(const std::vector<CaseSpec>& specs) {
  std::vector<FamilyCase> v;
  for (const CaseSpec& s : specs) v.emplace_back(s, Family::kSm90D256);
  return v;
}
std::vector<CaseSpec> d256_sanitize_cases() {
  CaseSpec var = spec(DType::kBFloat16, 256, 2, 1, 1, 4, 2, true);
  var.q_lens = {150, 40}, var.kv_lens = {90, 200};
  var.q_layout = QLayout::kVarlen, var.kv_layout = KVLayout::kVarlen;
  return {spec(DType::kBFloat16, 256, 1, 150, 130, 4, 2, true),
          spec(DType::kFloat16, 256, 1, 200, 70, 2, 1, false), var,
          spec(DType::kFloat16, 200, 1, 70, 90, 4, 2, true)};  // padded: 200 of 256 columns
}
INSTANTIATE_TEST_SUITE_P(D256, GpuBackward, ::testing::ValuesIn(d256_family(cases_at({256}))),
                         case_name);
INSTANTIATE_TEST_SUITE_P(SanitizeD256, GpuBackward,
                         ::testing::ValuesIn(d256_family(d256_sanitize_cases())), case_name);

// Head dims other than 64 and 128 (sm80's padded kernels, bwd_kernel.h BwdPaddedConfig: 64's below
// 64, 128's below 128, 256's past it in two launches of half the columns; the sm90 backward
// lacks them): a multiple of 16 and an odd multiple of 8 in each range (an odd one ends inside a
// k16 step and a pair of d-tiles), with causal and plain, GQA, q_len != kv_len, windows, varlen
// with empty sequences and seqused_k (NaN-poisoned unused keys); run with atomics and, for some,
// in deterministic mode (bwd_dq_kernel, per column half past 128).
std::vector<CaseSpec> padded_cases() {
  std::vector<CaseSpec> v;
  for (int64_t d : {32, 40, 72, 96, 136, 192, 248, 256}) {
    const DType dt = d % 16 == 0 ? DType::kBFloat16 : DType::kFloat16;
    v.push_back(spec(dt, d, 2, 127, 127, 4, 1, true));   // GQA 4, odd length, causal
    v.push_back(spec(dt, d, 1, 77, 300, 8, 2, false));   // q_len < kv_len, GQA 4, several blocks
    v.push_back(spec(dt, d, 1, 300, 77, 2, 2, true));    // q_len > kv_len: rows with no keys
    CaseSpec w = spec(dt, d, 1, 200, 257, 2, 1, false);  // a sliding window
    w.window_left = 37, w.window_right = 11;
    v.push_back(w);
    CaseSpec var = spec(DType::kBFloat16, d, 4, 1, 1, 4, 2, true);
    var.q_lens = {33, 0, 129, 7}, var.kv_lens = {65, 9, 129, 0};  // empty sequences
    var.q_layout = QLayout::kVarlen, var.kv_layout = KVLayout::kVarlen;
    v.push_back(var);
    CaseSpec used = spec(DType::kBFloat16, d, 2, 40, 70, 4, 2, true);
    used.use_seqused_k = true, used.kv_extra = 30;
    v.push_back(used);
  }
  return v;
}

class GpuBackwardPadded : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(GpuBackwardPadded, MatchesFloat64Reference) {
  const CaseSpec& s = GetParam();
  SKIP_WITHOUT_CUDA();
  check_case(s, Family::kSm80);
  // Deterministic mode on the dense GQA cases (its dq kernel walks the key blocks per query block).
  if (s.q_layout == QLayout::kDense && !s.use_seqused_k && s.window_left < 0)
    check_case(s, Family::kSm80, false, /*deterministic=*/true);
}

INSTANTIATE_TEST_SUITE_P(PaddedHeadDims, GpuBackwardPadded, ::testing::ValuesIn(padded_cases()),
                         [](const ::testing::TestParamInfo<CaseSpec>& info) {
                           return info.param.name();
                         });

// Head dims 136-248 on the d256 kernel, padded (TMA's zero fill past the head dim): padded_cases()
// past 128.
std::vector<CaseSpec> padded_wide_cases() {
  std::vector<CaseSpec> v;
  for (const CaseSpec& s : padded_cases())
    if (s.head_dim > 128 && s.head_dim < 256) v.push_back(s);
  return v;
}
INSTANTIATE_TEST_SUITE_P(PaddedD256, GpuBackward,
                         ::testing::ValuesIn(d256_family(padded_wide_cases())), case_name);

// The compute-sanitizer subset of the padded kernels: one head dim in each (64's, 128's, 256's in
// two launches), with atomics and in deterministic mode; the dLSE path at one.
TEST(GpuBackwardSanitize, PaddedHeadDims) {
  SKIP_WITHOUT_CUDA();
  for (int64_t d : {40, 96, 200}) {
    check_case(spec(DType::kBFloat16, d, 1, 70, 90, 4, 2, true), Family::kSm80);
    check_case(spec(DType::kFloat16, d, 1, 65, 33, 2, 1, false), Family::kSm80, false,
               /*deterministic=*/true);
  }
  check_case(spec(DType::kBFloat16, 160, 2, 45, 61, 4, 2, true), Family::kSm80,
             /*with_dlse=*/true);
}

// FLASHSERVE_SM90_BWD_OVERLAP on and off (the bulk dQ path both times) on the main shapes and on
// grids of more CTAs than the H200 has SMs (132: CTAs start while others end), each run
// against the float64 reference. The overlapped step issues the same products on the same
// operands with the same accumulation order, only earlier: dk and dv (sums in registers) keep
// every bit. dq keeps them where one key block per sequence (one CTA per row of the accumulator)
// adds it; with several, the reduce-adds' order between CTAs is free, on or off.
std::vector<CaseSpec> overlap_cases() {
  std::vector<CaseSpec> v = cases();
  // Many key blocks and heads over few queries, so that the float64 reference stays cheap.
  v.push_back(spec(DType::kBFloat16, 64, 4, 64, 520, 8, 8, false));   // 5 x 8 x 4 = 160 CTAs
  v.push_back(spec(DType::kBFloat16, 128, 4, 130, 400, 9, 9, true));  // 4 x 9 x 4 = 144
  // GQA 4 (four heads' steps per CTA) and a window: 3 x 4 x 4 = 48 CTAs.
  v.push_back(spec(DType::kFloat16, 128, 4, 100, 260, 16, 4, false));
  v.back().window_left = 70, v.back().window_right = 30;
  return v;
}

class GpuBackwardOverlap : public ::testing::TestWithParam<CaseSpec> {};

// A variant of the bulk-dQ kernel that runs the same products in the same order (only issued or
// launched otherwise) against the float64 reference beside the bulk path itself, on the same
// inputs: dk and dv keep every bit, and dq too where one key block per sequence adds each row of
// the accumulator (with several, the reduce-adds' order between CTAs is free either way).
void expect_bulk_paths_bits(const CaseSpec& s, Family variant) {
  BackwardCase bc(s);
  bc.run_forward();
  const auto off = run_on_gpu(bc, Family::kSm90DqBulk);
  const auto on = run_on_gpu(bc, variant);
  expect_matches_reference(bc, {&off, &on}, s.name());
  EXPECT_TRUE(on.dk == off.dk) << s.name();
  EXPECT_TRUE(on.dv == off.dv) << s.name();
  int64_t max_kv_len = 0;
  for (int64_t b = 0; b < s.batch; ++b) max_kv_len = std::max(max_kv_len, s.kv_len(b));
  if (max_kv_len <= 128) EXPECT_TRUE(on.dq == off.dq) << s.name();
}

TEST_P(GpuBackwardOverlap, MatchesTheReferenceAndTheBulkPathsBits) {
  CaseSpec s = GetParam();
  SKIP_WITHOUT_FAMILY(Family::kSm90Overlap);
  s.seed = seed_for(s.name(), 2293);
  expect_bulk_paths_bits(s, Family::kSm90Overlap);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuBackwardOverlap, ::testing::ValuesIn(overlap_cases()),
                         [](const ::testing::TestParamInfo<CaseSpec>& info) {
                           return info.param.name();
                         });

// FLASHSERVE_SM90_BWD_HEAVY_FIRST on and off (the bulk dQ path both times) on the main shapes'
// masked cases (causal, windows with a right side, a window with only a left side, whose
// heaviest key blocks are the last: the order's other direction; varlen with empty sequences, GQA,
// odd lengths) and on grids the order splits into sections on the H200 (132 multiprocessors:
// sections of about two waves of CTAs, ceil(264 / key blocks) (KV head, sequence) units), of equal
// and unequal sizes, each run against the float64 reference. The same CTAs compute the same
// products in the same order, only started in another order: dk and dv keep every bit; dq too
// where one key block per sequence adds each row of the accumulator.
std::vector<CaseSpec> heavy_first_cases() {
  std::vector<CaseSpec> v;
  for (const CaseSpec& s : cases())
    if (s.causal || s.window_left >= 0 || s.window_right >= 0) v.push_back(s);
  CaseSpec left = spec(DType::kBFloat16, 64, 1, 300, 520, 4, 2, false);
  left.window_left = 90;  // no right side: the last key blocks are the heaviest
  v.push_back(left);
  // 5 key blocks: sections of 53 units; 9 KV heads x 7 sequences = 63 units, two sections (32 and
  // 31 units, 315 CTAs).
  v.push_back(spec(DType::kBFloat16, 64, 7, 64, 520, 9, 9, true));
  // 16 key blocks: sections of 17 units; GQA 2, 8 KV heads x 3 sequences = 24 units, two sections
  // of 12 (384 CTAs); q_len < kv_len (the last key block alone is masked).
  v.push_back(spec(DType::kFloat16, 128, 3, 40, 2000, 16, 8, true));
  // Varlen, several key blocks per sequence and sequences shorter than the longest (their extra
  // key blocks end at once): 4 key blocks, sections of 66 units, 2 KV heads x 3 = 6 units.
  CaseSpec var = spec(DType::kBFloat16, 128, 3, 1, 1, 4, 2, true);
  var.q_lens = {450, 3, 200}, var.kv_lens = {500, 130, 77};
  var.q_layout = QLayout::kVarlen, var.kv_layout = KVLayout::kVarlen;
  v.push_back(var);
  return v;
}

class GpuBackwardHeavyFirst : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(GpuBackwardHeavyFirst, MatchesTheReferenceAndTheBulkPathsBits) {
  CaseSpec s = GetParam();
  SKIP_WITHOUT_FAMILY(Family::kSm90HeavyFirst);
  s.seed = seed_for(s.name(), 2294);
  expect_bulk_paths_bits(s, Family::kSm90HeavyFirst);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuBackwardHeavyFirst, ::testing::ValuesIn(heavy_first_cases()),
                         [](const ::testing::TestParamInfo<CaseSpec>& info) {
                           return info.param.name();
                         });

// FLASHSERVE_SM90_BWD_PERSISTENT on (the overlapped step off and on) against the bulk path's
// one-CTA-per-tile grid, on every main shape (one tile per CTA on the H200: the barriers' first
// phases, tiles without steps) and on grids of more tiles than the H200 has multiprocessors (132),
// so that each CTA loops over several: the Q/dO ring, the dS^T buffers and the dQ writer's
// hand-off going on across tiles, K and V released by kv_empty and reloaded under the dK/dV
// stores, tiles without keys skipped (varlen sequences shorter than the longest) and tiles
// without steps between tiles with steps (a window no query of most key blocks sees). Each run
// against the float64 reference; the same tiles compute the same products in the same order, so
// dk and dv keep every bit, and dq where one key block per sequence adds each row.
std::vector<CaseSpec> persistent_cases() {
  std::vector<CaseSpec> v = cases();
  // Unmasked, the natural order: 9 key blocks x 16 x 4 = 576 tiles; 20 x 4 x 3 = 240, GQA 2.
  v.push_back(spec(DType::kBFloat16, 128, 4, 130, 1100, 16, 16, false));
  v.push_back(spec(DType::kFloat16, 64, 3, 64, 2500, 8, 4, false));
  // Causal, the heaviest-first order in sections, taken from the counter: 16 key blocks x 8 x 3 =
  // 384 tiles (as GpuBackwardHeavyFirst's), 5 x 9 x 7 = 315.
  v.push_back(spec(DType::kFloat16, 128, 3, 40, 2000, 16, 8, true));
  v.push_back(spec(DType::kBFloat16, 64, 7, 64, 520, 9, 9, true));
  // Only the last of 16 key blocks is seen by the 10 queries (window 20 / 0): 512 tiles, most
  // without steps, between the ones with.
  CaseSpec unseen = spec(DType::kBFloat16, 64, 8, 10, 2000, 4, 4, false);
  unseen.window_left = 20, unseen.window_right = 0;
  v.push_back(unseen);
  // Varlen, causal, GQA 2: 17 key blocks x 8 x 6 = 816 tiles, most of the shorter sequences'
  // without keys.
  CaseSpec var = spec(DType::kBFloat16, 128, 6, 1, 1, 16, 8, true);
  var.q_lens = {64, 3, 130, 1, 200, 17}, var.kv_lens = {2100, 5, 700, 129, 1000, 300};
  var.q_layout = QLayout::kVarlen, var.kv_layout = KVLayout::kVarlen;
  v.push_back(var);
  // Unmasked, with seqused_k's poisoned keys past each sequence's used ones (the key blocks past
  // a shorter sequence's without keys): 8 key blocks x 4 x 5 = 160 tiles.
  CaseSpec used = spec(DType::kBFloat16, 64, 5, 50, 900, 8, 4, false);
  used.kv_lens = {900, 300, 128, 40, 600};
  used.use_seqused_k = true, used.kv_extra = 100;
  v.push_back(used);
  return v;
}

using PersistentCase = std::tuple<CaseSpec, Family>;
class GpuBackwardPersistent : public ::testing::TestWithParam<PersistentCase> {};

TEST_P(GpuBackwardPersistent, MatchesTheReferenceAndTheBulkPathsBits) {
  CaseSpec s = std::get<0>(GetParam());
  const Family family = std::get<1>(GetParam());
  SKIP_WITHOUT_FAMILY(family);
  s.seed = seed_for(s.name(), 2295);
  expect_bulk_paths_bits(s, family);
}

std::vector<PersistentCase> persistent_params() {
  std::vector<PersistentCase> v;
  for (Family f : {Family::kSm90Persistent, Family::kSm90PersistentOverlap})
    for (const CaseSpec& s : persistent_cases()) v.emplace_back(s, f);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuBackwardPersistent, ::testing::ValuesIn(persistent_params()),
                         case_name);

TEST(GpuBackwardSanitize, DeterministicSmallCase) {
  SKIP_WITHOUT_CUDA();
  check_case(spec(DType::kBFloat16, 64, 1, 70, 90, 4, 2, true), Family::kSm80, false,
             /*deterministic=*/true);
}

TEST(GpuBackwardLse, GradientOfTheLse) {
  for (Family family : {Family::kSm80, Family::kSm90, Family::kSm90DqBulk, Family::kSm90FusedDq,
                        Family::kSm90Overlap, Family::kSm90HeavyFirst, Family::kSm90Persistent,
                        Family::kSm90PersistentOverlap}) {
    SKIP_WITHOUT_FAMILY(family);
    check_case(spec(DType::kBFloat16, 64, 2, 45, 61, 4, 2, true), family, /*with_dlse=*/true);
    check_case(spec(DType::kFloat16, 128, 1, 130, 200, 2, 1, false), family, /*with_dlse=*/true);
  }
}

// deterministic = true: dq from the fixed-order dq kernel (sm80's bwd_dq_kernel, which the
// default dispatch runs it on, sm90 or not), as accurate, and the same bits on a second run (the
// atomics' order may differ between runs; this must not).
TEST(GpuBackwardDeterministic, MatchesTheReferenceAndRepeatsBitForBit) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv automatic("FLASHSERVE_BWD_KERNEL", "auto");
  for (bool causal : {false, true}) {
    CaseSpec s = spec(DType::kBFloat16, 128, 2, 150, 222, 8, 2, causal);
    s.seed = seed_for(s.name(), 2290);
    BackwardCase bc0(s);
    bc0.run_forward();
    BackwardDevice dev(bc0);
    AttentionBackwardParams p = dev.params();
    p.deterministic = true;
    attention_backward(p);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dev.download_grads();
    const auto got = bc0.read();
    const auto exact = bc0.reference(Emulate::kExact);
    const auto lowp = bc0.reference(Emulate::kLowPrecision);
    EXPECT_TRUE(grad_close(got.dq, exact.dq, lowp.dq, s.dtype, "dq")) << s.name();
    EXPECT_TRUE(grad_close(got.dk, exact.dk, lowp.dk, s.dtype, "dk")) << s.name();
    EXPECT_TRUE(grad_close(got.dv, exact.dv, lowp.dv, s.dtype, "dv")) << s.name();
    s.seed = 2291;
    BackwardCase bc(s);
    bc.run_forward();
    const auto first = run_on_gpu(bc, Family::kSm80, true);
    const auto second = run_on_gpu(bc, Family::kSm80, true);
    EXPECT_TRUE(first.dq == second.dq && first.dk == second.dk && first.dv == second.dv)
        << s.name();
  }
}

// Deterministic mode at padded head dims (past 128: the dq kernel once per half of the columns)
// repeats bit for bit, through the default dispatch.
TEST(GpuBackwardDeterministic, PaddedHeadDimRepeatsBitForBit) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv automatic("FLASHSERVE_BWD_KERNEL", "auto");
  for (int64_t d : {96, 232}) {
    CaseSpec s = spec(DType::kBFloat16, d, 2, 150, 222, 8, 2, true);
    s.seed = 2295;
    BackwardCase bc(s);
    bc.run_forward();
    const auto first = run_on_gpu(bc, Family::kSm80, true);
    const auto second = run_on_gpu(bc, Family::kSm80, true);
    expect_matches_reference(bc, {&first}, s.name());
    EXPECT_TRUE(first.dq == second.dq && first.dk == second.dk && first.dv == second.dv)
        << s.name();
  }
}

// The sm90 kernel's dK and dV are sums in registers in a fixed order (no atomics): a second run
// on the same inputs gives the same bits, where a race (a stage or dS buffer overwritten while
// read) would move them; with either dQ path (the bulk path's producer order differs). dq goes
// through atomics or reduce-adds in no fixed order and may differ in its last bits.
TEST(GpuBackwardSm90, DkDvRepeatBitForBit) {
  SKIP_WITHOUT_FAMILY(Family::kSm90);
  for (Family family :
       {Family::kSm90, Family::kSm90DqBulk, Family::kSm90Overlap, Family::kSm90HeavyFirst})
    for (int64_t d : {64, 128}) {
      CaseSpec s = spec(DType::kBFloat16, d, 1, 400, 600, 4, 2, true);
      s.seed = 2292;
      BackwardCase bc(s);
      bc.run_forward();
      const auto first = run_on_gpu(bc, family);
      const auto second = run_on_gpu(bc, family);
      EXPECT_TRUE(first.dk == second.dk && first.dv == second.dv)
          << s.name() << " " << family_name(family);
    }
}

// The d256 kernel: the dLSE path (D = rowsum(dO o O) - dLSE, the shared preprocess), and dk and
// dv (sums in registers over the CTA's steps in a fixed order) bit for bit from run to run.
TEST(GpuBackwardD256, GradientOfTheLse) {
  SKIP_WITHOUT_FAMILY(Family::kSm90D256);
  check_case(spec(DType::kBFloat16, 256, 2, 45, 61, 4, 2, true), Family::kSm90D256,
             /*with_dlse=*/true);
  check_case(spec(DType::kFloat16, 256, 1, 130, 200, 2, 1, false), Family::kSm90D256,
             /*with_dlse=*/true);
}

TEST(GpuBackwardD256, DkDvRepeatBitForBit) {
  SKIP_WITHOUT_FAMILY(Family::kSm90D256);
  CaseSpec s = spec(DType::kBFloat16, 256, 1, 400, 600, 4, 2, true);
  s.seed = 2292;
  BackwardCase bc(s);
  bc.run_forward();
  const auto first = run_on_gpu(bc, Family::kSm90D256);
  const auto second = run_on_gpu(bc, Family::kSm90D256);
  EXPECT_TRUE(first.dk == second.dk && first.dv == second.dv) << s.name();
}

// FLASHSERVE_BWD_KERNEL=sm90 refuses what the sm90 kernel lacks by the variable's name:
// deterministic mode (auto runs it on sm80), head dims other than 64, 128 and 256, and 256 with
// FLASHSERVE_SM90_BWD_D256=0.
TEST(GpuBackwardSm90, ForcedRefusesWhatItLacks) {
  SKIP_WITHOUT_FAMILY(Family::kSm90);
  ScopedEnv env("FLASHSERVE_BWD_KERNEL", "sm90");
  ScopedEnv d256("FLASHSERVE_SM90_BWD_D256", "0");
  for (auto [d, deterministic] : {std::pair{int64_t{64}, true}, std::pair{int64_t{96}, false},
                                  std::pair{int64_t{256}, false}}) {
    CaseSpec s = spec(DType::kBFloat16, d, 1, 9, 9, 2, 2, false);
    BackwardCase bc(s);
    bc.run_forward();
    BackwardDevice dev(bc);
    AttentionBackwardParams p = dev.params();
    p.deterministic = deterministic;
    try {
      attention_backward(p);
      ADD_FAILURE() << "no error; expected FLASHSERVE_BWD_KERNEL at d" << d;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
      EXPECT_EQ(e.argument(), "FLASHSERVE_BWD_KERNEL") << e.what();
    }
  }
}

TEST(GpuBackwardRefusals, NamesWhatTheKernelsLack) {
  SKIP_WITHOUT_CUDA();
  auto refused = [](CaseSpec s, const char* arg) {
    BackwardCase bc(s);
    bc.run_forward();
    BackwardDevice dev(bc);
    AttentionBackwardParams p = dev.params();
    try {
      attention_backward(p);
      ADD_FAILURE() << "no error; expected " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
      EXPECT_EQ(e.argument(), arg) << e.what();
    }
  };
  refused(spec(DType::kBFloat16, 264, 1, 9, 9, 2, 2, false), "q");  // head dims past 256
  refused(spec(DType::kBFloat16, 100, 1, 9, 9, 2, 2, false), "q");  // and not multiples of 8
  refused(spec(DType::kFloat32, 64, 1, 9, 9, 2, 2, false), "q");    // dtype
  CaseSpec dv = spec(DType::kBFloat16, 64, 1, 9, 9, 2, 2, false);
  dv.head_dim_v = 32;
  refused(dv, "v");
  CaseSpec capped = spec(DType::kBFloat16, 64, 1, 9, 9, 2, 2, false);
  capped.softcap = 5.0f;  // the forward ran on the CPU, which has it
  refused(capped, "softcap");
  capped.softcap = 0.0f;
  capped.alibi = 2;
  refused(capped, "alibi_slopes");
}

}  // namespace
}  // namespace flashserve::testing
