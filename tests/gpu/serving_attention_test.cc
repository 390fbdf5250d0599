// Attention as a serving step runs it (issue 15), against the float64 reference: mixed batches of
// prefill chunks and single-token decodes over a paged cache, through plan_attention +
// run_attention with the host-side lengths (the engine's form) and through attention_forward (the
// plan knows only max_seqlen_q/k). Odd lengths, page sizes 16/64/256 (and 7), GQA groups of
// 1/4/8, chunks whose cached context is not a multiple of the page, decodes and chunks
// interleaved (each launch then skips the other's sequences), automatic and explicit splits. A
// plan is reused over several runs with other tensors of the same shapes. Outputs start poisoned
// (NaN), as do unused pages and the tails of last pages. The instantiation ServeSanitize runs
// under compute-sanitizer (scripts/gpu-check.sh runs *Sanitize*). On a compute capability 9.0
// device the same steps also run forced onto the sm90 kernel (each launch of the plan's grouping
// on sm90, paged K/V by TMA), where its page size allows.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "attention/backends.h"
#include "support/attention_case.h"
#include "support/compare.h"
#include "support/device_copy.h"
#include "support/scoped_env.h"
#include "support/serving_step.h"

namespace flashserve::testing {
namespace {

// Plans the case from its host lengths, runs the plan on the device copies, compares.
void check_planned(const CaseSpec& spec) {
  AttentionCase c(spec);
  const HostLens lens(spec);
  DeviceCopy dev(c);
  const AttentionPlan plan = plan_attention(dev.params(), lens.view(spec));
  run_attention(plan, dev.params(plan.workspace_bytes()));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download();
  EXPECT_TRUE(attention_close(read_output(c.params()), c.exact(), c.lowp(), spec.dtype))
      << spec.name() << " planned: " << plan.summary();
}

// The same through attention_forward.
void check_forward(const CaseSpec& spec) {
  AttentionCase c(spec);
  DeviceCopy dev(c);
  attention_forward(dev.params());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download();
  EXPECT_TRUE(attention_close(read_output(c.params()), c.exact(), c.lowp(), spec.dtype))
      << spec.name() << " through attention_forward";
}

std::vector<CaseSpec> serving_cases() {
  std::vector<CaseSpec> v;
  for (int64_t page : {16, 64, 256})
    for (auto [h_q, h_kv] : {std::pair<int64_t, int64_t>{8, 8}, {16, 4}, {16, 2}}) {
      // A chunk of 77 over 45 cached keys (not a page multiple) first, then decodes: the
      // engine's order. Then the kinds interleaved with an empty sequence, and a long decode
      // that splits.
      v.push_back(serving_step(128, page, h_q, h_kv, {77, 1, 1, 1}, {122, 700, 33, 1}));
      v.push_back(serving_step(128, page, h_q, h_kv, {1, 130, 1, 0, 17, 1},
                               {2049, 130 + 333, 1, 9, 17, 300}));
    }
  // Head dims 64 and 256, fp16, non-causal, no lse, and explicit splits in both launches.
  CaseSpec d64 = serving_step(64, 16, 16, 4, {1, 200, 1}, {3000, 200 + 19, 65});
  v.push_back(d64);
  CaseSpec d256 = serving_step(256, 64, 8, 2, {33, 1, 1, 129}, {33 + 100, 1500, 2, 129 + 7}, false);
  d256.dtype = DType::kFloat16;
  v.push_back(d256);
  CaseSpec nolse = serving_step(128, 16, 32, 8, {1, 1, 512}, {4097, 2048, 512 + 1000});
  nolse.with_lse = false;
  v.push_back(nolse);
  CaseSpec forced = serving_step(128, 7, 8, 2, {1, 60, 1}, {900, 60 + 31, 1200});
  forced.num_splits = 3;
  v.push_back(forced);
  return v;
}

// The small subset compute-sanitizer runs (memcheck, racecheck): both launches, interleaved kinds
// (the skips and the combine's row search), splits in both, page 16.
std::vector<CaseSpec> serving_sanitize_cases() {
  std::vector<CaseSpec> v;
  v.push_back(serving_step(128, 16, 16, 4, {1, 70, 1, 0, 17}, {1500, 70 + 21, 40, 3, 17}));
  CaseSpec forced = serving_step(128, 64, 8, 2, {33, 1, 1}, {33 + 50, 700, 2000});
  forced.num_splits = 3;
  v.push_back(forced);
  return v;
}

class GpuServing : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(GpuServing, PlannedMatchesFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  CaseSpec s = GetParam();
  s.seed = seed_for(s.name(), 31);
  check_planned(s);
}

TEST_P(GpuServing, ForwardMatchesFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  CaseSpec s = GetParam();
  s.seed = seed_for(s.name(), 37);
  check_forward(s);
}

// Forced onto sm90: the plan keeps its decode and prefill launches, each on the sm90 kernel over
// its own range. Skips off compute capability 9.0, in builds without 90a, and for what the sm90
// kernel refuses (pages of 7 keys, explicit splits).
TEST_P(GpuServing, PlannedOnSm90MatchesFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != 9 || minor != 0 || !attention::cuda_sm90_built())
    GTEST_SKIP() << "skipped: not a compute capability 9.0 device or built without 90a";
  CaseSpec s = GetParam();
  if (s.page_size % 8 != 0 || s.num_splits > 1) GTEST_SKIP() << "skipped: sm90 refuses it";
  s.seed = seed_for(s.name(), 43);
  ScopedEnv env("FLASHSERVE_KERNEL", "sm90");
  check_planned(s);
  check_forward(s);
}

INSTANTIATE_TEST_SUITE_P(Mixed, GpuServing, ::testing::ValuesIn(serving_cases()),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(ServeSanitize, GpuServing, ::testing::ValuesIn(serving_sanitize_cases()),
                         [](const auto& info) { return info.param.name(); });

// One plan, several runs: other tensors of the same shapes (fresh inputs, other device buffers),
// then the first again. Each run must match its own reference: the plan holds no pointer.
TEST(GpuServingPlan, ReusedAcrossRunsWithOtherTensors) {
  SKIP_WITHOUT_CUDA();
  const CaseSpec base = serving_step(128, 16, 32, 8, {1, 300, 1, 1}, {2000, 300 + 77, 129, 5});
  std::vector<AttentionCase> cases;
  for (uint64_t seed : {41, 42, 43}) {
    CaseSpec s = base;
    s.seed = seed;
    cases.emplace_back(s);
  }
  const HostLens lens(base);
  DeviceCopy first(cases[0]);
  const AttentionPlan plan = plan_attention(first.params(), lens.view(base));
  EXPECT_GT(plan.workspace_bytes(), 0u) << plan.summary();  // the long decode splits
  for (int round = 0; round < 2; ++round)
    for (AttentionCase& c : cases) {
      c.poison_outputs();
      DeviceCopy dev(c);
      run_attention(plan, dev.params(plan.workspace_bytes()));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      dev.download();
      EXPECT_TRUE(attention_close(read_output(c.params()), c.exact(), c.lowp(), base.dtype))
          << "round " << round << ", seed " << c.spec().seed << ": " << plan.summary();
    }
}

// A run captured in a CUDA graph and replayed matches the reference (no host sync, no allocation
// in run_attention with the plan's workspace).
TEST(GpuServingPlan, RunCapturedInACudaGraph) {
  SKIP_WITHOUT_CUDA();
  CaseSpec s = serving_step(128, 16, 32, 8, {200, 1, 1}, {200 + 300, 3000, 70});
  s.seed = 51;
  AttentionCase c(s);
  const HostLens lens(s);
  DeviceCopy dev(c);
  AttentionParams p = dev.params();
  const AttentionPlan plan = plan_attention(p, lens.view(s));
  p = dev.params(plan.workspace_bytes());
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  p.stream = stream;
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  run_attention(plan, p);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  dev.download();
  EXPECT_TRUE(attention_close(read_output(c.params()), c.exact(), c.lowp(), s.dtype))
      << plan.summary();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Params that do not match the plan are refused, naming "plan".
TEST(GpuServingPlan, RefusesParamsOfAnotherShape) {
  SKIP_WITHOUT_CUDA();
  const CaseSpec s = serving_step(128, 16, 8, 2, {5, 1}, {40, 90});
  AttentionCase c(s);
  const HostLens lens(s);
  DeviceCopy dev(c);
  const AttentionPlan plan = plan_attention(dev.params(), lens.view(s));
  AttentionParams other = dev.params(plan.workspace_bytes());
  other.causal = false;
  other.window_right = -1;
  try {
    run_attention(plan, other);
    ADD_FAILURE() << "no error for params of another mask";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "plan") << e.what();
  }
}

// The layers of a step: one plan, one workspace, the same length tensors, each layer its own
// q, K/V pools and block table; layer 0 builds the by-length decode launch's item map and the
// layers after it reuse it (AttentionRunOptions::reuse_step_state, as StepAttention runs them),
// eagerly and captured in one CUDA graph. Each layer matches its own reference.
TEST(GpuServingPlan, LayersAfterTheFirstReuseTheStepState) {
  SKIP_WITHOUT_CUDA();
  const ScopedEnv by_length("FLASHSERVE_DECODE_BALANCE", "1");
  const CaseSpec base =
      serving_step(128, 16, 32, 8, {1, 1, 1, 1, 1, 1}, {4000, 33, 900, 1, 2500, 130});
  std::vector<AttentionCase> layers;
  for (uint64_t seed : {61, 62, 63}) {
    CaseSpec s = base;
    s.seed = seed;
    layers.emplace_back(s);
  }
  std::vector<std::unique_ptr<DeviceCopy>> devs;
  for (AttentionCase& c : layers) devs.push_back(std::make_unique<DeviceCopy>(c));
  const HostLens lens(base);
  const AttentionPlan plan = plan_attention(devs[0]->params(), lens.view(base));
  ASSERT_NE(plan.summary().find("by length"), std::string::npos) << plan.summary();
  const AttentionParams first = devs[0]->params(plan.workspace_bytes());
  auto layer_params = [&](size_t i) {
    AttentionParams p = devs[i]->params();
    p.cu_seqlens_q = first.cu_seqlens_q;
    p.cu_seqlens_k = first.cu_seqlens_k;
    p.seqused_k = first.seqused_k;
    p.workspace = first.workspace;
    p.workspace_bytes = first.workspace_bytes;
    return p;
  };
  auto run_layers = [&](cudaStream_t stream) {
    for (size_t i = 0; i < layers.size(); ++i) {
      AttentionParams p = layer_params(i);
      p.stream = stream;
      AttentionRunOptions options;
      options.reuse_step_state = i > 0;
      run_attention(plan, p, options);
    }
  };
  auto check = [&](const char* how) {
    for (size_t i = 0; i < layers.size(); ++i) {
      devs[i]->download();
      EXPECT_TRUE(attention_close(read_output(layers[i].params()), layers[i].exact(),
                                  layers[i].lowp(), base.dtype))
          << how << ", layer " << i << ": " << plan.summary();
    }
  };
  run_layers(nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  check("eager");

  for (AttentionCase& c : layers) c.poison_outputs();
  for (size_t i = 0; i < layers.size(); ++i) devs[i]->upload_outputs();
  ASSERT_EQ(cudaMemset(first.workspace, 0xff, first.workspace_bytes), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  run_layers(stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  check("graph");
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);

  // Without a workspace there is no state to reuse: refused, naming it.
  AttentionParams none = layer_params(1);
  none.workspace = nullptr;
  none.workspace_bytes = 0;
  AttentionRunOptions reuse;
  reuse.reuse_step_state = true;
  try {
    run_attention(plan, none, reuse);
    ADD_FAILURE() << "reuse_step_state without a workspace was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "workspace") << e.what();
  }
}

}  // namespace
}  // namespace flashserve::testing
