// The CUDA forward path through the public API, against the float64 CPU reference.
//
// Every case copies the host buffers of a tests/support AttentionCase (fresh random inputs; out and
// lse poisoned with NaN, unused KV slots too) to the device, runs attention_forward on the device
// views, copies out and lse back and compares with docs/architecture.md's tolerance. The
// instantiation named Sanitize is the small representative subset that scripts/gpu-check.sh runs
// under compute-sanitizer. Without a CUDA device every test skips with "skipped: no CUDA device".
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attention/problem.h"
#include "support/attention_case.h"
#include "support/compare.h"
#include "support/device_copy.h"
#include "support/nan_cases.h"
#include "support/scoped_env.h"

namespace flashserve::testing {
namespace {

// Runs the case on the GPU; returns the output read back as doubles.
NaiveOutput run_on_gpu(AttentionCase& c) {
  DeviceCopy dev(c);
  attention_forward(dev.params());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download();
  return read_output(c.params());
}

void check_case(const CaseSpec& spec) {
  AttentionCase c(spec);
  const NaiveOutput got = run_on_gpu(c);
  EXPECT_TRUE(attention_close(got, c.exact(), c.lowp(), spec.dtype)) << spec.name();
}

// ---------------------------------------------------------------------------------------------
// The shape list: odd lengths, q_len != kv_len both ways, GQA 1/4/8, head dims 64/128/256,
// causal, windows, varlen with an empty sequence, strided views, with and without lse.

// A dense case; callers set what else differs.
CaseSpec spec(DType dt, int64_t d, int64_t batch, std::vector<int64_t> q_lens,
              std::vector<int64_t> kv_lens, int64_t h_q, int64_t h_kv, bool causal = false) {
  CaseSpec s;
  s.dtype = dt;
  s.head_dim = d;
  s.batch = batch;
  s.q_lens = std::move(q_lens);
  s.kv_lens = std::move(kv_lens);
  s.h_q = h_q;
  s.h_kv = h_kv;
  s.causal = causal;
  return s;
}

CaseSpec varlen(CaseSpec s) {
  s.q_layout = QLayout::kVarlen;
  s.kv_layout = KVLayout::kVarlen;
  return s;
}

std::vector<CaseSpec> forward_cases() {
  constexpr DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  std::vector<CaseSpec> v;
  for (DType dt : {bf16, fp16})
    for (int64_t d : {64, 128, 256})
      for (bool causal : {false, true}) {
        for (int64_t len : {1, 17, 127, 1000})
          v.push_back(spec(dt, d, 2, {len}, {len}, 4, 1, causal));
        // Fewer queries than keys (a prefill chunk over a cached prefix), GQA 8; then more
        // queries than keys: the first rows see nothing when causal.
        v.push_back(spec(dt, d, 1, {77}, {300}, 8, 1, causal));
        v.push_back(spec(dt, d, 1, {300}, {77}, 2, 2, causal));
      }
  for (int64_t d : {64, 128, 256}) {
    // Varlen batch including an empty sequence and a decode row; causal, then a two-sided window.
    CaseSpec s = varlen(spec(bf16, d, 5, {33, 0, 1, 200, 64}, {33, 0, 513, 200, 129}, 8, 2, true));
    v.push_back(s);
    s.causal = false;
    s.window_left = 40;
    s.window_right = 7;
    v.push_back(s);
    CaseSpec w = spec(fp16, d, 2, {500}, {500}, 4, 4, true);  // causal sliding window
    w.window_left = 100;
    v.push_back(w);
    CaseSpec p = spec(bf16, d, 3, {129}, {257}, 4, 2);  // strided views, no lse
    p.pad = 8;  // a pad of 8 elements keeps rows 16-byte aligned
    p.with_lse = false;
    v.push_back(p);
    CaseSpec u = spec(bf16, d, 3, {16}, {100, 31, 250}, 4, 1, true);  // dense KV, seqused_k
    u.use_seqused_k = true;
    u.kv_extra = 20;
    v.push_back(u);
  }
  return v;
}

// The small representative subset that scripts/gpu-check.sh runs under compute-sanitizer
// (memcheck, racecheck): its instantiation is named Sanitize.
std::vector<CaseSpec> sanitize_cases() {
  std::vector<CaseSpec> v;
  for (int64_t d : {64, 128, 256}) {
    CaseSpec s = varlen(spec(DType::kBFloat16, d, 2, {130, 3}, {130, 200}, 4, 2, d != 128));
    if (d == 128) s.window_left = 50;
    v.push_back(s);
  }
  CaseSpec paged = spec(DType::kBFloat16, 128, 2, {5, 40}, {200, 90}, 4, 2, true);
  paged.q_layout = QLayout::kVarlen;
  paged.kv_layout = KVLayout::kPaged;
  paged.page_size = 16;
  v.push_back(paged);
  CaseSpec split = spec(DType::kBFloat16, 64, 1, {1}, {1500}, 4, 1);
  split.num_splits = 3;
  v.push_back(split);
  // Decode with a group of 24 heads over two packed tiles, paged and split, varlen with an empty
  // query; and a d256 varlen prefill of several waves of tiles.
  CaseSpec decode = spec(DType::kBFloat16, 128, 3, {1, 0, 1}, {300, 20, 1100}, 48, 2);
  decode.q_layout = QLayout::kVarlen;
  decode.kv_layout = KVLayout::kPaged;
  decode.num_splits = 4;
  v.push_back(decode);
  v.push_back(varlen(spec(DType::kBFloat16, 256, 3, {700, 0, 129}, {300, 3, 500}, 32, 8)));
  return v;
}

class GpuForward : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(GpuForward, MatchesFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  CaseSpec s = GetParam();
  s.seed = seed_for(s.name(), 7);
  check_case(s);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuForward, ::testing::ValuesIn(forward_cases()),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(Sanitize, GpuForward, ::testing::ValuesIn(sanitize_cases()),
                         [](const auto& info) { return info.param.name(); });

// ---------------------------------------------------------------------------------------------
// Paged KV (page sizes 16, 256, 1 and 7, causal or not, GQA) and split-KV (automatic with the
// workspace the call asks for, and explicit).

std::vector<CaseSpec> paged_split_cases() {
  std::vector<CaseSpec> v;
  for (int64_t page : {16, 256, 1, 7})
    for (int64_t d : {64, 128, 256}) {
      CaseSpec s = spec(DType::kBFloat16, d, 3, {1, 17, 64}, {700, 17, 300}, 8, 2, page != 7);
      s.q_layout = QLayout::kVarlen;
      s.kv_layout = KVLayout::kPaged;
      s.page_size = page;
      v.push_back(s);
    }
  for (int32_t splits : {0, 3}) {
    CaseSpec s = spec(DType::kBFloat16, 128, 2, {1}, {5000}, 8, 1);  // long-context decode
    s.num_splits = splits;
    v.push_back(s);
  }
  CaseSpec s = spec(DType::kFloat16, 64, 2, {1, 33}, {3000, 900}, 4, 4, true);  // paged + split
  s.q_layout = QLayout::kVarlen;
  s.kv_layout = KVLayout::kPaged;
  s.num_splits = 5;
  v.push_back(s);
  return v;
}

INSTANTIATE_TEST_SUITE_P(PagedSplit, GpuForward, ::testing::ValuesIn(paged_split_cases()),
                         [](const auto& info) { return info.param.name(); });

// ---------------------------------------------------------------------------------------------
// Decode (at most one query per sequence): the GQA group's heads are packed into the rows of one
// tile (groups of 1, 4, 8 and 24 heads: 24 spans two 16-row tiles), with causal (which masks
// nothing there) or not, automatic and forced splits, varlen batches with empty sequences and
// empty caches, paged caches, strided views. A left window (Mistral's sliding window) stays on
// the decode tiles: the packed heads share the one query, so it bounds them alike.

std::vector<CaseSpec> decode_cases() {
  constexpr DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  std::vector<CaseSpec> v;
  for (DType dt : {bf16, fp16})
    for (int64_t d : {64, 128, 256}) {
      v.push_back(spec(dt, d, 3, {1}, {1000}, 32, 8, dt == bf16));  // group of 4, auto split
      CaseSpec one = spec(dt, d, 2, {1}, {3000}, 8, 1);             // group of 8, 3 splits
      one.num_splits = 3;
      v.push_back(one);
    }
  for (int64_t d : {64, 128, 256}) {
    v.push_back(spec(bf16, d, 2, {1}, {777}, 48, 2, true));  // group of 24: two tiles
    // A left window on a group of 24 (two 16-row tiles) over contiguous varlen KV: an empty and a
    // one-key cache, the window's edge inside a key block; unsplit, forced splits, then left 0.
    CaseSpec gw = varlen(spec(bf16, d, 4, {1}, {0, 1, 300, 2049}, 48, 2, true));
    gw.window_left = 129;
    v.push_back(gw);
    gw.num_splits = 3;
    v.push_back(gw);
    gw.window_left = 0;
    v.push_back(gw);
    v.push_back(spec(fp16, d, 4, {1}, {129}, 4, 4));  // MHA: one row per tile
    for (int32_t splits : {20, 70}) {                 // the combine's 4- and 8-warp shares
      CaseSpec many = spec(d == 128 ? fp16 : bf16, d, 2, {1}, {9000}, 8, 2);
      many.num_splits = splits;
      v.push_back(many);
    }
    // Varlen: an empty query, an empty cache; seqused_k below the stored keys.
    CaseSpec s = varlen(spec(bf16, d, 4, {1, 0, 1, 1}, {700, 5, 0, 64}, 16, 2, true));
    s.use_seqused_k = true;
    s.kv_extra = 9;
    v.push_back(s);
    CaseSpec p = spec(bf16, d, 3, {1}, {2049, 1, 300}, 16, 2);  // paged, auto split
    p.q_layout = QLayout::kVarlen;
    p.kv_layout = KVLayout::kPaged;
    p.page_size = 16;
    v.push_back(p);
    p.page_size = 7;
    p.num_splits = 5;
    p.with_lse = false;
    v.push_back(p);
    CaseSpec w = spec(fp16, d, 2, {1}, {1000}, 8, 2, true);  // a left window
    w.window_left = 100;
    v.push_back(w);
    // Paged decodes longer and shorter than the window, its edge inside a key block (2999 - 999
    // = 2000), split automatically; then forced splits and a window of the query alone.
    CaseSpec mw = spec(bf16, d, 4, {1}, {3000, 77, 1000, 1}, 32, 8, true);
    mw.q_layout = QLayout::kVarlen;
    mw.kv_layout = KVLayout::kPaged;
    mw.page_size = 16;
    mw.window_left = 999;
    v.push_back(mw);
    mw.num_splits = 7;
    mw.window_left = 0;
    v.push_back(mw);
    CaseSpec r = spec(bf16, d, 2, {1}, {500}, 12, 4);  // strided views
    r.pad = 8;
    v.push_back(r);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Decode, GpuForward, ::testing::ValuesIn(decode_cases()),
                         [](const auto& info) { return info.param.name(); });

// ---------------------------------------------------------------------------------------------
// Decode with the splits merged in a thread-block cluster (FLASHSERVE_DECODE_CLUSTER=1,
// sm80/cluster_combine.h): every split count from 2 to 16 (dividing the column pairs or not),
// splits past a short sequence's keys (empty partials), sequences with no query or no keys, a
// group over two tiles, a left window, seqused_k, strided views, with and without lse. On a
// device with clusters the plan must take the cluster path; elsewhere the same cases run the
// combine kernel.

std::vector<CaseSpec> cluster_decode_cases() {
  constexpr DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  std::vector<CaseSpec> v;
  for (DType dt : {bf16, fp16})
    for (int64_t d : {64, 128, 256}) {
      v.push_back(spec(dt, d, 1, {1}, {1000}, 32, 8, true));  // batch 1: the automatic splits
      CaseSpec two = spec(dt, d, 2, {1}, {3000}, 8, 1);       // group of 8, 2 splits
      two.num_splits = 2;
      v.push_back(two);
    }
  for (int64_t d : {64, 128, 256}) {
    for (int32_t splits : {3, 5, 8, 13, 16}) {
      // Paged; the one-key cache leaves all but one split without keys.
      CaseSpec p = spec(bf16, d, 3, {1}, {2049, 1, 300}, 16, 2);
      p.q_layout = QLayout::kVarlen;
      p.kv_layout = KVLayout::kPaged;
      p.page_size = splits == 13 ? 7 : 16;
      p.num_splits = splits;
      p.with_lse = splits != 5;
      v.push_back(p);
    }
    CaseSpec gw = varlen(spec(bf16, d, 4, {1}, {0, 1, 300, 2049}, 48, 2, true));  // two tiles
    gw.window_left = 129;
    gw.num_splits = 7;
    v.push_back(gw);
    CaseSpec s = varlen(spec(fp16, d, 4, {1, 0, 1, 1}, {700, 5, 0, 64}, 16, 2, true));
    s.use_seqused_k = true;
    s.kv_extra = 9;
    s.num_splits = 4;
    v.push_back(s);
    CaseSpec mha = spec(fp16, d, 4, {1}, {129}, 4, 4);  // one row a tile
    mha.num_splits = 3;
    v.push_back(mha);
    CaseSpec r = spec(bf16, d, 2, {1}, {500}, 12, 4);  // strided views
    r.pad = 8;
    r.num_splits = 6;
    v.push_back(r);
  }
  return v;
}

class GpuDecodeCluster : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(GpuDecodeCluster, MatchesFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  const ScopedEnv on("FLASHSERVE_DECODE_CLUSTER", "1");
  CaseSpec s = GetParam();
  s.seed = seed_for(s.name(), 31);
  AttentionCase c(s);
  DeviceCopy dev(c);
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  // The launch's splits as its summary gives them: the cluster takes 2 to 16.
  const std::string plan = plan_attention(dev.params()).summary();
  const size_t at = plan.find(" splits ");
  ASSERT_NE(at, std::string::npos) << plan;
  const int splits = std::atoi(plan.c_str() + at + 8);
  EXPECT_EQ(plan.find("cluster combine") != std::string::npos,
            major == 9 && splits >= 2 && splits <= 16)
      << plan;
  attention_forward(dev.params());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download();
  EXPECT_TRUE(attention_close(read_output(c.params()), c.exact(), c.lowp(), s.dtype)) << s.name();
}

INSTANTIATE_TEST_SUITE_P(ClusterDecode, GpuDecodeCluster,
                         ::testing::ValuesIn(cluster_decode_cases()),
                         [](const auto& info) { return info.param.name(); });

// For compute-sanitizer (memcheck, racecheck over the cluster's shared memory): a paged batch with
// an empty split and a sequence without a query, and 16 splits.
std::vector<CaseSpec> cluster_sanitize_cases() {
  CaseSpec p = varlen(spec(DType::kBFloat16, 128, 3, {1, 0, 1}, {300, 20, 1}, 16, 2));
  p.kv_layout = KVLayout::kPaged;
  p.page_size = 16;
  p.num_splits = 5;
  CaseSpec wide = spec(DType::kFloat16, 64, 1, {1}, {2000}, 8, 2);
  wide.num_splits = 16;
  return {p, wide};
}

INSTANTIATE_TEST_SUITE_P(SanitizeCluster, GpuDecodeCluster,
                         ::testing::ValuesIn(cluster_sanitize_cases()),
                         [](const auto& info) { return info.param.name(); });

// ---------------------------------------------------------------------------------------------
// Decode split by length (FLASHSERVE_DECODE_BALANCE=1, kernel/split_items.h): automatic splits
// over sequences of very different lengths (5000 keys beside 0, 1 and 17), paged and contiguous,
// a left window on a group over two tiles, seqused_k, sequences without a query, a decode launch
// that skips the prefill chunks between its sequences, padded head dims, softcap, equal lengths,
// and a batch of 70 (several sequences a lane in the kernel's walk). The plan must take it.

std::vector<CaseSpec> balanced_decode_cases() {
  constexpr DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  std::vector<CaseSpec> v;
  auto automatic = [](CaseSpec s) {
    s.num_splits = 0;
    return s;
  };
  for (DType dt : {bf16, fp16})
    for (int64_t d : {64, 128, 256}) {
      CaseSpec p = automatic(spec(dt, d, 6, {1}, {5000, 17, 0, 300, 2049, 1}, 32, 8));
      p.q_layout = QLayout::kVarlen;
      p.kv_layout = KVLayout::kPaged;
      p.page_size = dt == bf16 ? 16 : 7;
      p.with_lse = d != 128;
      v.push_back(p);
    }
  for (int64_t d : {64, 128, 256}) {
    CaseSpec gw = automatic(varlen(spec(bf16, d, 5, {1}, {0, 1, 300, 2049, 4000}, 48, 2, true)));
    gw.window_left = 129;
    v.push_back(gw);
    CaseSpec used = automatic(spec(fp16, d, 5, {1}, {700, 5, 0, 64, 3000}, 16, 2));
    used.use_seqused_k = true;
    used.kv_extra = 9;
    v.push_back(used);
    v.push_back(automatic(varlen(spec(bf16, d, 4, {1, 0, 1, 1}, {3000, 20, 1, 900}, 32, 8))));
    CaseSpec mixed = automatic(spec(bf16, d, 4, {1, 33, 1, 1}, {2000, 900, 3000, 10}, 32, 8, true));
    mixed.q_layout = QLayout::kVarlen;
    mixed.kv_layout = KVLayout::kPaged;
    v.push_back(mixed);
    v.push_back(automatic(spec(bf16, d, 3, {1}, {1000}, 32, 8)));  // equal lengths, dense
  }
  CaseSpec padded = automatic(varlen(spec(bf16, 96, 4, {1}, {4000, 3, 700, 1500}, 32, 8)));
  v.push_back(padded);
  CaseSpec capped = automatic(varlen(spec(fp16, 128, 4, {1}, {100, 3000, 0, 1500}, 32, 8)));
  capped.softcap = 30.0f;
  v.push_back(capped);
  return v;
}

void check_balanced(CaseSpec s) {
  const ScopedEnv on("FLASHSERVE_DECODE_BALANCE", "1");
  AttentionCase c(s);
  DeviceCopy dev(c);
  const std::string plan = plan_attention(dev.params()).summary();
  EXPECT_NE(plan.find("by length"), std::string::npos) << plan;
  attention_forward(dev.params());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download();
  EXPECT_TRUE(attention_close(read_output(c.params()), c.exact(), c.lowp(), s.dtype)) << s.name();
}

class GpuDecodeBalanced : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(GpuDecodeBalanced, MatchesFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  CaseSpec s = GetParam();
  s.seed = seed_for(s.name(), 33);
  check_balanced(s);
}

INSTANTIATE_TEST_SUITE_P(BalancedDecode, GpuDecodeBalanced,
                         ::testing::ValuesIn(balanced_decode_cases()),
                         [](const auto& info) { return info.param.name(); });

// For compute-sanitizer: a paged batch with an empty cache and a sequence without a query.
INSTANTIATE_TEST_SUITE_P(
    SanitizeBalanced, GpuDecodeBalanced, ::testing::Values([] {
      CaseSpec p = varlen(spec(DType::kBFloat16, 128, 4, {1, 0, 1, 1}, {3000, 20, 0, 300}, 16, 2));
      p.kv_layout = KVLayout::kPaged;
      p.num_splits = 0;
      return p;
    }()),
    [](const auto& info) { return info.param.name(); });

// 70 decodes of exponential lengths (mean 600 keys; a few empty): three sequences a lane in the
// walks, items past the last share.
TEST(GpuDecodeBalancedBatch, SeventyExponentialLengths) {
  SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(70);
  std::exponential_distribution<double> len(1.0 / 600);
  std::vector<int64_t> kv(70);
  for (int64_t& k : kv) k = rng() % 9 == 0 ? 0 : static_cast<int64_t>(len(rng));
  CaseSpec s = spec(DType::kBFloat16, 128, 70, {1}, kv, 8, 2);
  s.q_layout = QLayout::kVarlen;
  s.kv_layout = KVLayout::kPaged;
  s.num_splits = 0;
  s.seed = 70;
  check_balanced(s);
}

// ---------------------------------------------------------------------------------------------
// Unmasked d256 with more tiles than the GPU holds at once (several waves), over sequences that are
// empty, have no keys, are paged or split.

std::vector<CaseSpec> many_tile_cases() {
  std::vector<CaseSpec> v;
  v.push_back(spec(DType::kBFloat16, 256, 2, {1024}, {256}, 16, 4));  // 256 tiles
  CaseSpec s = varlen(spec(DType::kFloat16, 256, 5, {640, 0, 1, 500, 384}, {200, 5, 0, 130, 0}, 16,
                           2));  // 400 grid tiles, some empty, some without keys
  v.push_back(s);
  CaseSpec p = spec(DType::kBFloat16, 256, 2, {300, 700}, {400, 900}, 16, 4);
  p.q_layout = QLayout::kVarlen;
  p.kv_layout = KVLayout::kPaged;
  v.push_back(p);
  CaseSpec split = spec(DType::kBFloat16, 256, 1, {512}, {512}, 32, 8);  // 384 tiles with splits
  split.num_splits = 3;
  v.push_back(split);
  return v;
}

INSTANTIATE_TEST_SUITE_P(ManyTiles, GpuForward, ::testing::ValuesIn(many_tile_cases()),
                         [](const auto& info) { return info.param.name(); });

// ---------------------------------------------------------------------------------------------
// Long sequences (16k): the float64 naive reference would take minutes, so the reference is the CPU
// tiled path in float32 on the same stored inputs (itself tested against float64 in CI), and the
// criterion is the relative Frobenius error expected of bf16 operands.

TEST(GpuForwardLong, Seqlen16kAgainstCpuTiledPath) {
  SKIP_WITHOUT_CUDA();
  for (bool causal : {false, true}) {
    CaseSpec s = spec(DType::kBFloat16, 128, 1, {16384}, {16384}, 2, 1, causal);
    s.seed = seed_for(s.name(), 13);
    AttentionCase c(s);
    const NaiveOutput got = run_on_gpu(c);
    c.poison_outputs();
    attention_forward(c.params());  // CPU tiled path, float32 accumulation
    const NaiveOutput ref = read_output(c.params());
    expect_close_to_tiled(got, ref, s.name());
  }
}

// ---------------------------------------------------------------------------------------------
// A moving error is a race: the same inputs twice must give the same bits.

TEST(GpuForwardDeterminism, SameInputsSameBits) {
  SKIP_WITHOUT_CUDA();
  CaseSpec s = spec(DType::kBFloat16, 128, 3, {1000}, {1000}, 8, 2, true);
  s.seed = 99;
  AttentionCase c(s);
  DeviceCopy dev(c);
  const auto bufs = c.buffers();
  const int outputs[] = {AttentionCase::kOut, AttentionCase::kLse};
  std::vector<std::byte> first[2];
  for (int run = 0; run < 3; ++run) {
    attention_forward(dev.params());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dev.download();
    for (int i = 0; i < 2; ++i) {
      const auto& b = bufs[outputs[i]];
      ASSERT_GT(b.bytes, 0u) << b.name;
      if (run == 0) {
        first[i].assign(b.host, b.host + b.bytes);
      } else {
        EXPECT_EQ(std::memcmp(first[i].data(), b.host, b.bytes), 0)
            << b.name << ": run " << run << " differs from run 0";
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// What the CUDA path cannot run is refused with a clear error naming the argument.

// Runs the case on the GPU after `mutate` has edited its device-side params and expects an Error
// naming `arg` (a clear one, not an internal error).
void expect_refused(const CaseSpec& s, const char* arg,
                    const std::function<void(AttentionParams&)>& mutate = {}) {
  AttentionCase c(s);
  DeviceCopy dev(c);
  AttentionParams p = dev.params();
  if (mutate) mutate(p);
  try {
    attention_forward(p);
    ADD_FAILURE() << "no error for " << s.name() << " (expected one about " << arg << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), arg) << e.what();
    EXPECT_NE(e.kind(), ErrorKind::kInternal) << e.what();
  }
}

TEST(GpuErrors, RefusesWhatItCannotRun) {
  SKIP_WITHOUT_CUDA();
  CaseSpec base = spec(DType::kBFloat16, 64, 1, {32}, {32}, 1, 1);
  CaseSpec f32 = base;
  f32.dtype = DType::kFloat32;
  expect_refused(f32, "q");  // float32 has no tensor-core path
  CaseSpec odd = base;
  odd.head_dim = 36;
  expect_refused(odd, "q");  // a head dim off the rule (multiples of 8 from 32 to 256)
  base.with_lse = false;
  expect_refused(base, "q", [](AttentionParams& p) {  // a base pointer off 16-byte alignment
    p.q.data = static_cast<char*>(p.q.data) + 2;
    p.q.shape[1] -= 1;  // stay inside the allocation; out follows so only q is at fault
    p.out.shape[1] -= 1;
  });
}

// ---------------------------------------------------------------------------------------------
// Score modifiers (softcap, ALiBi): the sm80 modifier kernels (sm80/score_mod.h) on every path the
// plan gives them: masked prefill tiles (also for calls without a mask), dense, varlen, paged,
// GQA, causal, windows, rows that see no key; decode tiles with packed GQA rows (a slope per row)
// and split-KV with its combine. Against the float64 reference under the same bound as every
// forward case: the kernel's tanh is within 1e-6 relative (sm80/score_mod.h), so a capped score
// moves by at most 1e-6 of itself: 1/4000 of bf16's and 1/500 of fp16's rounding of q and k that
// the naive low-precision error (the bound's main term) already holds, and below lse_floor's
// 2e-5 relative for the LSE. softcap 5 bends typical scores (|scale q.k| up to ~4) hard; 30 is
// Gemma-2's. ALiBi slopes are drawn in [0.05, 0.8), per head ([h_q]) or per sequence and head.

// The modifier variants of a case: softcap, ALiBi [h_q], ALiBi [batch, h_q], both.
void add_score_mods(std::vector<CaseSpec>& v, const CaseSpec& s) {
  v.push_back(with(s, [](CaseSpec& c) { c.softcap = 5.0f; }));
  v.push_back(with(s, [](CaseSpec& c) { c.alibi = 1; }));
  v.push_back(with(s, [](CaseSpec& c) { c.alibi = 2; }));
  v.push_back(with(s, [](CaseSpec& c) {
    c.softcap = 30.0f;
    c.alibi = 2;
  }));
}

std::vector<CaseSpec> score_mod_cases() {
  constexpr DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;
  std::vector<CaseSpec> v;
  for (DType dt : {bf16, fp16})
    for (int64_t d : {64, 128, 256}) {
      add_score_mods(v, spec(dt, d, 2, {127}, {127}, 4, 1));  // no mask: masked tiles all the same
      add_score_mods(v, spec(dt, d, 1, {77}, {300}, 8, 1, true));  // a chunk over a prefix, GQA 8
    }
  for (int64_t d : {64, 128, 256}) {
    const DType dt = d == 128 ? fp16 : bf16;
    // More queries than keys, causal: the first rows see no key (zero output, lse -inf).
    add_score_mods(v, spec(dt, d, 2, {300}, {77}, 2, 2, true));
    // Varlen with an empty sequence and a decode row (a decode launch and a prefill launch).
    add_score_mods(v,
                   varlen(spec(dt, d, 5, {33, 0, 1, 200, 64}, {33, 0, 513, 200, 129}, 8, 2, true)));
    CaseSpec two_sided = varlen(spec(dt, d, 3, {90, 17, 40}, {300, 17, 41}, 4, 4));
    two_sided.window_left = 40;
    two_sided.window_right = 7;
    add_score_mods(v, two_sided);
    CaseSpec sliding = spec(dt, d, 2, {500}, {500}, 4, 4, true);  // causal sliding window
    sliding.window_left = 100;
    add_score_mods(v, sliding);
    // Paged (16-key pages), GQA, causal chunks over cached keys.
    CaseSpec paged = spec(dt, d, 2, {5, 40}, {200, 90}, 4, 2, true);
    paged.q_layout = QLayout::kVarlen;
    paged.kv_layout = KVLayout::kPaged;
    paged.page_size = 16;
    add_score_mods(v, paged);
    // A prefill chunk split over its keys (forced), then the combine.
    CaseSpec split = spec(dt, d, 2, {64}, {1500}, 8, 2, true);
    split.num_splits = 3;
    add_score_mods(v, split);
    // Decode: one query per sequence, GQA 4 packed into a tile's rows, split-KV forced.
    CaseSpec decode = spec(dt, d, 3, {1}, {1500}, 8, 2);
    decode.num_splits = 3;
    add_score_mods(v, decode);
    // Decode of 24 heads per KV head (two packed tiles: rows past the group read no slope) on
    // 16-key pages, varlen with an empty query, split 4 ways.
    CaseSpec paged_decode = spec(dt, d, 3, {1, 0, 1}, {300, 20, 1100}, 48, 2);
    paged_decode.q_layout = QLayout::kVarlen;
    paged_decode.kv_layout = KVLayout::kPaged;
    paged_decode.page_size = 16;
    paged_decode.num_splits = 4;
    add_score_mods(v, paged_decode);
    // A shape the default plan runs on sm90 without modifiers (a full 128-row tile over 512+
    // keys): with them it must stay on sm80 (GpuScoreModPlan checks the plan).
    add_score_mods(v, spec(dt, d, 1, {512}, {1024}, 4, 4, true));
  }
  return v;
}

class GpuScoreMod : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(GpuScoreMod, MatchesFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  CaseSpec s = GetParam();
  s.seed = seed_for(s.name(), 29);
  check_case(s);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuScoreMod, ::testing::ValuesIn(score_mod_cases()),
                         [](const auto& info) { return info.param.name(); });

// The default plan keeps calls with modifiers on sm80 where it would take sm90 without them, a
// forced sm80 runs them, and a forced sm90 refuses them by the argument's name.
TEST(GpuScoreModPlan, ModifiersRunOnSm80AndForcedSm90RefusesThem) {
  SKIP_WITHOUT_CUDA();
  const CaseSpec base = spec(DType::kBFloat16, 128, 1, {512}, {1024}, 4, 4, true);
  const CaseSpec capped = with(base, [](CaseSpec& c) { c.softcap = 30.0f; });
  const CaseSpec alibi = with(base, [](CaseSpec& c) { c.alibi = 1; });
  for (const CaseSpec& s : {capped, alibi}) {
    AttentionCase c(s);
    DeviceCopy dev(c);
    const std::string summary = plan_attention(dev.params()).summary();
    EXPECT_EQ(summary.rfind("prefill masked", 0), 0u) << summary;  // not "sm90 prefill ..."
  }
  {
    ScopedEnv env("FLASHSERVE_KERNEL", "sm80");
    check_case(with(capped, [](CaseSpec& c) { c.seed = 31; }));
  }
  {
    // FLASHSERVE_CHECK_INDICES copies the index tensors back and validates a host copy of the
    // call; the device slopes stay out of it (their entries are not read on the host).
    ScopedEnv check("FLASHSERVE_CHECK_INDICES", "1");
    CaseSpec paged = spec(DType::kBFloat16, 64, 2, {5, 40}, {200, 90}, 4, 2, true);
    paged.q_layout = QLayout::kVarlen;
    paged.kv_layout = KVLayout::kPaged;
    paged.alibi = 2;
    paged.softcap = 5.0f;
    paged.seed = 37;
    check_case(paged);
  }
  ScopedEnv env("FLASHSERVE_KERNEL", "sm90");
  expect_refused(capped, "softcap");
  expect_refused(alibi, "alibi_slopes");
  const CaseSpec decode = with(base, [](CaseSpec& c) {
    c.q_lens = {1};
    c.softcap = 5.0f;
  });
  expect_refused(decode, "softcap");  // decode shapes too
}

// ---------------------------------------------------------------------------------------------
// FLASHSERVE_CHECK_INDICES=1: index tensors in device memory are copied back and checked entry by
// entry, with the CPU path's errors; a valid call still runs and matches the reference.

TEST(GpuIndexCheck, RefusesBadDeviceIndicesWhenAsked) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv check("FLASHSERVE_CHECK_INDICES", "1");
  CaseSpec paged = spec(DType::kBFloat16, 128, 3, {1, 17, 64}, {700, 17, 300}, 8, 2, true);
  paged.q_layout = QLayout::kVarlen;
  paged.kv_layout = KVLayout::kPaged;
  paged.seed = 21;
  check_case(paged);  // valid indices: checked, then run

  // Writes `value` over entry `index` of one int32 index tensor in device memory.
  auto poke = [](TensorView AttentionParams::*tensor, int64_t index, int32_t value) {
    return [=](AttentionParams& p) {
      ASSERT_EQ(cudaMemcpy(static_cast<int32_t*>((p.*tensor).data) + index, &value, sizeof value,
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    };
  };
  expect_refused(paged, "block_table", poke(&AttentionParams::block_table, 0, 1 << 20));
  expect_refused(paged, "seqused_k", poke(&AttentionParams::seqused_k, 1, 1 << 20));
  CaseSpec var = varlen(spec(DType::kFloat16, 64, 3, {5, 40, 9}, {50, 40, 90}, 4, 2));
  expect_refused(var, "cu_seqlens_k", poke(&AttentionParams::cu_seqlens_k, 2, 1));
  expect_refused(var, "max_seqlen_q",
                 [](AttentionParams& p) { p.max_seqlen_q = 39; });  // the longest query is 40
}

// ---------------------------------------------------------------------------------------------
// FLASHSERVE_SMEM_PER_BLOCK: the tiles of a device with 99 KB of shared memory per block
// (sm86/sm89: d256 without the PV pairs' exchange) run here against the reference; a limit no
// tile fits and a malformed value are refused.

TEST(GpuSmallSmem, TilesOfA99KbDeviceMatchReference) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv limit("FLASHSERVE_SMEM_PER_BLOCK", "101376");
  std::vector<CaseSpec> cases;
  for (bool causal : {false, true})
    cases.push_back(spec(DType::kBFloat16, 256, 2, {300}, {300}, 4, 2, causal));
  cases.push_back(varlen(spec(DType::kFloat16, 256, 3, {700, 0, 129}, {300, 3, 500}, 16, 4)));
  CaseSpec split = spec(DType::kBFloat16, 256, 1, {64}, {1500}, 8, 2);
  split.num_splits = 3;
  cases.push_back(split);
  cases.push_back(spec(DType::kBFloat16, 128, 2, {200}, {333}, 8, 2, true));
  for (CaseSpec& s : cases) {
    s.seed = seed_for(s.name(), 17);
    check_case(s);
  }
}

TEST(GpuSmallSmem, RefusesWhatNoTileFitsAndMalformedLimits) {
  SKIP_WITHOUT_CUDA();
  const CaseSpec d256 = spec(DType::kBFloat16, 256, 1, {64}, {64}, 2, 2);
  {
    ScopedEnv limit("FLASHSERVE_SMEM_PER_BLOCK", "49152");  // 48 KB: no d256 tile fits
    expect_refused(d256, "q");
  }
  ScopedEnv bad("FLASHSERVE_SMEM_PER_BLOCK", "99KB");
  expect_refused(d256, "FLASHSERVE_SMEM_PER_BLOCK");
}

// ---------------------------------------------------------------------------------------------
// NaN and infinity (issue 9): a NaN in q or in a key a row sees, or a score overflowing float32,
// gives that row NaN (out and LSE) through the sm80 softmax and the split-KV combine, as the
// float64 reference and PyTorch do; rows that see no key stay zero / -inf; the rest match.

class GpuNan : public ::testing::TestWithParam<NanCase> {};

TEST_P(GpuNan, RowsThatSeeAPoisonedInputAreNan) {
  SKIP_WITHOUT_CUDA();
  expect_nan_rule(
      GetParam(), [](AttentionCase& c) { return run_on_gpu(c); }, "gpu");
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuNan,
                         ::testing::ValuesIn(nan_cases({DType::kFloat16, DType::kBFloat16})),
                         [](const auto& info) { return info.param.name(); });

}  // namespace
}  // namespace flashserve::testing
