// Head dims other than the compiled 64/128/256 on CUDA (issue 24): multiples of 8 from 32 to 256,
// q/k's and v's equal or not (DeepSeek's 192/128), on sm80's padded kernels (the next compiled
// head dim, columns past the call's zero-filled on load and never stored; cuda/plan.h).
//
// Against the float64 reference on fresh random inputs, out and lse poisoned with NaN first. Most
// cases pad every head row of q, k, v and out with NaN elements (CaseSpec::pad) at least as wide
// as the kernel's padding: a kernel that read a column past the call's head dim would turn a row
// NaN, and one that stored past head_dim_v would overwrite the NaN padding of out, which is
// checked to be untouched. Without a CUDA device every test skips with "skipped: no CUDA device".
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention/cuda/plan.h"
#include "attention/problem.h"
#include "attention/sm80/tile_config.h"
#include "common/half.h"
#include "support/attention_case.h"
#include "support/compare.h"
#include "support/cuda_skip.h"
#include "support/device_copy.h"
#include "support/scoped_env.h"

namespace flashserve::testing {
namespace {

constexpr DType bf16 = DType::kBFloat16, fp16 = DType::kFloat16;

CaseSpec spec(DType dt, int64_t d, int64_t dv, int64_t batch, std::vector<int64_t> q_lens,
              std::vector<int64_t> kv_lens, int64_t h_q, int64_t h_kv, bool causal = false) {
  CaseSpec s;
  s.dtype = dt;
  s.head_dim = d;
  s.head_dim_v = dv;
  s.batch = batch;
  s.q_lens = std::move(q_lens);
  s.kv_lens = std::move(kv_lens);
  s.h_q = h_q;
  s.h_kv = h_kv;
  s.causal = causal;
  return s;
}

// NaN padding after every head row, wider than what the kernel pads the larger head dim with.
CaseSpec padded_rows(CaseSpec s) {
  const int kernel =
      attention::sm80::kernel_head_dim(static_cast<int>(s.head_dim), static_cast<int>(s.dv()));
  s.pad = kernel - std::min(s.head_dim, s.dv()) + 8;
  return s;
}

CaseSpec varlen(CaseSpec s) {
  s.q_layout = QLayout::kVarlen;
  s.kv_layout = KVLayout::kVarlen;
  return s;
}

CaseSpec paged(CaseSpec s, int64_t page_size) {
  s.q_layout = QLayout::kVarlen;
  s.kv_layout = KVLayout::kPaged;
  s.page_size = page_size;
  return s;
}

// Runs the case, compares with the reference and checks out's padding (if any) still NaN.
void check_case(const CaseSpec& spec) {
  AttentionCase c(spec);
  DeviceCopy dev(c);
  attention_forward(dev.params());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download();
  const NaiveOutput got = read_output(c.params());
  EXPECT_TRUE(attention_close(got, c.exact(), c.lowp(), spec.dtype)) << spec.name();
  if (spec.pad == 0) return;
  const auto out = c.buffers()[AttentionCase::kOut];
  const int64_t row = spec.dv() + spec.pad;
  const int64_t n = static_cast<int64_t>(out.bytes / dtype_size(spec.out_dtype()));
  int64_t written = 0;
  for (int64_t i = 0; i < n; ++i)
    if (i % row >= spec.dv() && !std::isnan(load_float(out.host, i, spec.out_dtype()))) ++written;
  EXPECT_EQ(written, 0) << spec.name() << ": elements of out past head_dim_v were written";
}

// The head dims FlashAttention-2 compiles besides ours, and ones between them.
const int64_t kDims[] = {32, 40, 72, 96, 136, 160, 192, 224, 248};
// q/k head dim != v head dim: DeepSeek's 192/128 first; v's smaller, and larger.
const std::pair<int64_t, int64_t> kUnequal[] = {{192, 128}, {128, 64}, {96, 64},
                                                {256, 128}, {64, 128}, {40, 96}};

std::vector<CaseSpec> head_dim_cases() {
  std::vector<CaseSpec> v;
  std::vector<std::pair<int64_t, int64_t>> all;
  for (int64_t d : kDims) all.push_back({d, d});
  for (auto p : kUnequal) all.push_back(p);
  for (auto [d, dv] : all) {
    const DType other = d % 16 == 0 ? fp16 : bf16;
    // Odd lengths, GQA 4, unmasked (the masked tiles without a mask) and causal, padded rows.
    for (bool causal : {false, true})
      v.push_back(padded_rows(spec(bf16, d, dv, 2, {127}, {127}, 4, 1, causal)));
    // A chunk over a cached prefix (GQA 8), causal; more queries than keys (rows that see none).
    v.push_back(spec(other, d, dv, 1, {77}, {300}, 8, 1, true));
    v.push_back(padded_rows(spec(bf16, d, dv, 1, {300}, {77}, 2, 2, true)));
    // Decode: a group of 4 packed, automatic splits; 8 heads of one KV head, 3 splits forced.
    v.push_back(padded_rows(spec(bf16, d, dv, 3, {1}, {1000}, 32, 8)));
    CaseSpec split = spec(other, d, dv, 2, {1}, {3000}, 8, 1);
    split.num_splits = 3;
    v.push_back(split);
  }
  // Varlen, windows, paged K/V, split prefill for a few of them.
  for (auto [d, dv] : std::vector<std::pair<int64_t, int64_t>>{
           {40, 40}, {96, 96}, {160, 160}, {192, 128}, {64, 128}}) {
    // Varlen with an empty sequence and a decode row (a decode launch and a prefill launch).
    CaseSpec s =
        varlen(spec(bf16, d, dv, 5, {33, 0, 1, 200, 64}, {33, 0, 513, 200, 129}, 8, 2, true));
    v.push_back(padded_rows(s));
    s.causal = false;
    s.window_left = 40;
    s.window_right = 7;
    v.push_back(s);
    CaseSpec sliding = spec(fp16, d, dv, 2, {500}, {500}, 4, 4, true);
    sliding.window_left = 100;
    v.push_back(sliding);
    // Paged: 16-key pages causal; 7-key pages unmasked, without lse.
    v.push_back(
        padded_rows(paged(spec(bf16, d, dv, 3, {1, 17, 64}, {700, 17, 300}, 8, 2, true), 16)));
    CaseSpec odd_pages = paged(spec(bf16, d, dv, 3, {1, 17, 64}, {700, 17, 300}, 8, 2), 7);
    odd_pages.with_lse = false;
    v.push_back(odd_pages);
    // Paged decode of 24 heads per KV head (two packed tiles), an empty query, 4 splits.
    CaseSpec pd = paged(spec(bf16, d, dv, 3, {1, 0, 1}, {300, 20, 1100}, 48, 2), 16);
    pd.num_splits = 4;
    v.push_back(padded_rows(pd));
    // A prefill chunk split over its keys, then the combine (8 warps' shares at 70 splits).
    CaseSpec chunk = spec(bf16, d, dv, 2, {64}, {1500}, 8, 2, true);
    chunk.num_splits = 3;
    v.push_back(padded_rows(chunk));
    CaseSpec many = spec(fp16, d, dv, 2, {1}, {9000}, 8, 2);
    many.num_splits = 70;
    v.push_back(many);
    // Dense KV with seqused_k below the stored keys.
    CaseSpec used = spec(bf16, d, dv, 3, {16}, {100, 31, 250}, 4, 1, true);
    used.use_seqused_k = true;
    used.kv_extra = 20;
    v.push_back(used);
  }
  return v;
}

// The small subset that compute-sanitizer runs (its instantiation is named Sanitize).
std::vector<CaseSpec> sanitize_cases() {
  std::vector<CaseSpec> v;
  v.push_back(padded_rows(varlen(spec(bf16, 96, 96, 2, {130, 3}, {130, 200}, 4, 2, true))));
  v.push_back(padded_rows(varlen(spec(bf16, 192, 128, 2, {130, 3}, {130, 200}, 4, 2))));
  CaseSpec pd = paged(spec(bf16, 40, 40, 3, {1, 0, 1}, {300, 20, 1100}, 48, 2), 16);
  pd.num_splits = 4;
  v.push_back(padded_rows(pd));
  CaseSpec chunk = paged(spec(fp16, 160, 160, 2, {5, 40}, {200, 90}, 4, 2, true), 16);
  chunk.num_splits = 3;
  v.push_back(chunk);
  return v;
}

class GpuHeadDim : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(GpuHeadDim, MatchesFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv padded_on("FLASHSERVE_PADDED_HEAD_DIMS", "1");
  CaseSpec s = GetParam();
  s.seed = seed_for(s.name(), 41);
  check_case(s);
}

// On by default since their device run (kPaddedHeadDimsByDefault); FLASHSERVE_PADDED_HEAD_DIMS=0
// refuses them naming q with how to turn them on, and the variable is read strictly; the compiled
// head dims never read it.
TEST(GpuHeadDimPlan, PaddedHeadDimsRunUnlessTurnedOff) {
  SKIP_WITHOUT_CUDA();
  const CaseSpec s = spec(bf16, 192, 128, 1, {64}, {64}, 2, 2, true);
  for (const char* value : {static_cast<const char*>(nullptr), "0"}) {
    ScopedEnv env("FLASHSERVE_PADDED_HEAD_DIMS", value);
    AttentionCase c(s);
    DeviceCopy dev(c);
    try {
      attention_forward(dev.params());
      if (!attention::kPaddedHeadDimsByDefault || value != nullptr)
        ADD_FAILURE() << "ran while off";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "q") << e.what();
      EXPECT_NE(std::string(e.what()).find("FLASHSERVE_PADDED_HEAD_DIMS=1"), std::string::npos);
    }
  }
  ScopedEnv bad("FLASHSERVE_PADDED_HEAD_DIMS", "yes");
  {
    AttentionCase c(s);
    DeviceCopy dev(c);
    try {
      attention_forward(dev.params());
      ADD_FAILURE() << "FLASHSERVE_PADDED_HEAD_DIMS=yes accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHSERVE_PADDED_HEAD_DIMS") << e.what();
    }
  }
  AttentionCase c(spec(bf16, 128, 128, 1, {64}, {64}, 2, 2, true));
  DeviceCopy dev(c);
  attention_forward(dev.params());  // a compiled head dim ignores the variable
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuHeadDim, ::testing::ValuesIn(head_dim_cases()),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(Sanitize, GpuHeadDim, ::testing::ValuesIn(sanitize_cases()),
                         [](const auto& info) { return info.param.name(); });

// The plan runs them on sm80's padded kernels, also where it would take sm90 at a compiled head
// dim; a forced sm80 runs them too; a forced sm90 refuses them naming FLASHSERVE_KERNEL; score
// modifiers with them are refused by the modifier's name; head dims off the rule are refused
// naming q or v.
TEST(GpuHeadDimPlan, PaddedOnSm80AndRefusalsByName) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv padded_on("FLASHSERVE_PADDED_HEAD_DIMS", "1");
  auto refused_by = [](const CaseSpec& s) {
    AttentionCase c(s);
    DeviceCopy dev(c);
    try {
      attention_forward(dev.params());
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
      return e.argument();
    }
    ADD_FAILURE() << "no refusal of " << s.name();
    return std::string();
  };
  const CaseSpec base = spec(bf16, 192, 128, 1, {512}, {1024}, 4, 4, true);
  {
    AttentionCase c(base);
    DeviceCopy dev(c);
    const std::string summary = plan_attention(dev.params()).summary();
    EXPECT_EQ(summary.rfind("prefill masked padded d256", 0), 0u) << summary;
  }
  {
    ScopedEnv env("FLASHSERVE_KERNEL", "sm80");
    check_case(with(base, [](CaseSpec& s) { s.seed = 43; }));
  }
  {
    ScopedEnv env("FLASHSERVE_KERNEL", "sm90");
    EXPECT_EQ(refused_by(base), "FLASHSERVE_KERNEL");
    EXPECT_EQ(refused_by(with(base, [](CaseSpec& s) { s.head_dim = s.head_dim_v = 96; })),
              "FLASHSERVE_KERNEL");
  }
  EXPECT_EQ(refused_by(with(base, [](CaseSpec& s) { s.softcap = 30.0f; })), "softcap");
  EXPECT_EQ(refused_by(with(base, [](CaseSpec& s) { s.alibi = 1; })), "alibi_slopes");
  EXPECT_EQ(refused_by(with(base, [](CaseSpec& s) { s.head_dim = 36; })), "q");
  EXPECT_EQ(refused_by(with(base, [](CaseSpec& s) { s.head_dim = 24; })), "q");
  EXPECT_EQ(refused_by(with(base, [](CaseSpec& s) { s.head_dim_v = 264; })), "v");
}

}  // namespace
}  // namespace flashserve::testing
