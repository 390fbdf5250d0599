// The one builder of a step's attention (model/step_attention.h) that the CPU and CUDA runners
// share: the params it makes from a ForwardBatch (every field against the batch and the model),
// its refusals, and one layer's run on the CPU through plan/run against the float64 reference
// with that layer's own pools (not the pool the step was planned with), output poisoned first.
#include "model/step_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attention/reference/naive.h"
#include "flashserve/error.h"
#include "model/presets.h"
#include "support/compare.h"

namespace flashserve::model {
namespace {

constexpr int32_t kBlock = 4;

// A mixed batch: a decode at position 9 (10 keys), then a chunk of 5 tokens after 4 cached ones
// (9 keys), each in its own blocks.
ForwardBatch mixed_batch() {
  ForwardBatchBuilder bb(kBlock);
  const std::vector<int32_t> ids(5, 1);
  bb.add(ids.data(), 9, 1, {3, 0, 5}, true);
  bb.add(ids.data(), 4, 5, {1, 2, 4}, true);
  return std::move(bb).build();
}

struct Pools {
  ModelConfig cfg = preset_config("tiny");
  int64_t num_blocks = 6;
  std::vector<float> q, out, k0, k1, v1;  // k0: the planned pool; k1/v1: the layer's
  StepAttentionTensors t;

  explicit Pools(const ForwardBatch& b) {
    const int64_t hq = cfg.num_attention_heads, hkv = cfg.num_key_value_heads, d = cfg.head_dim;
    std::mt19937 rng(7);
    std::normal_distribution<float> n;
    auto fill = [&](std::vector<float>& v, size_t size) {
      v.resize(size);
      for (float& x : v) x = n(rng);
    };
    const size_t pool = static_cast<size_t>(num_blocks * kBlock * hkv * d);
    // q rows twice as wide as q (a fused qkv's stride), so that the builder keeps the stride.
    fill(q, static_cast<size_t>(b.total_q * 2 * hq * d));
    fill(k0, pool);
    fill(k1, pool);
    fill(v1, pool);
    out.assign(static_cast<size_t>(b.total_q * hq * d), std::numeric_limits<float>::quiet_NaN());
    t.q = make_view(q.data(), DType::kFloat32, {b.total_q, hq, d});
    t.q.stride[0] = 2 * hq * d;
    t.out = make_view(out.data(), DType::kFloat32, {b.total_q, hq, d});
    t.kv_pool = make_view(k0.data(), DType::kFloat32, {num_blocks, kBlock, hkv, d});
    t.cu_seqlens_q = b.cu_seqlens_q.data();
    t.seqused_k = b.seqused_k.data();
    t.block_table = b.block_table.data();
    t.table_width = b.pages_per_seq;
    t.num_splits = 1;
  }
};

TEST(StepAttention, ParamsAreTheBatchsPagedCausalCall) {
  const ForwardBatch b = mixed_batch();
  Pools p(b);
  p.cfg.sliding_window = 6;
  const AttentionParams a = step_attention_params(p.cfg, b, p.t);
  EXPECT_EQ(a.q.data, p.q.data());
  EXPECT_EQ(a.q.stride[0], p.t.q.stride[0]);
  EXPECT_EQ(a.out.data, p.out.data());
  EXPECT_EQ(a.k.data, p.k0.data());
  EXPECT_EQ(a.v.data, p.k0.data());
  EXPECT_EQ(a.k.shape[0], p.num_blocks);
  EXPECT_EQ(a.k.shape[1], kBlock);
  EXPECT_EQ(a.cu_seqlens_q.data, b.cu_seqlens_q.data());
  EXPECT_EQ(a.cu_seqlens_q.shape[0], 3);
  EXPECT_EQ(a.seqused_k.data, b.seqused_k.data());
  EXPECT_EQ(a.block_table.shape[0], 2);
  EXPECT_EQ(a.block_table.shape[1], b.pages_per_seq);
  EXPECT_EQ(a.max_seqlen_q, 5);
  EXPECT_EQ(a.max_seqlen_k, 10);
  EXPECT_TRUE(a.causal);
  EXPECT_EQ(a.window_left, 5);  // itself and the 5 keys before it
  EXPECT_EQ(a.num_splits, 1);
  p.cfg.sliding_window = 0;
  p.t.kv_bound = 16;  // a graph's bound: the kernels get it as max_seqlen_k
  p.t.num_splits = 0;
  const AttentionParams g = step_attention_params(p.cfg, b, p.t);
  EXPECT_EQ(g.window_left, -1);
  EXPECT_EQ(g.max_seqlen_k, 16);
  EXPECT_EQ(g.num_splits, 0);
}

TEST(StepAttention, RefusesTablesAndBoundsThatDoNotFitTheBatch) {
  const ForwardBatch b = mixed_batch();
  Pools p(b);
  p.t.table_width = b.pages_per_seq - 1;
  try {
    step_attention_params(p.cfg, b, p.t);
    ADD_FAILURE() << "a narrow table was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "table_width");
  }
  p.t.table_width = b.pages_per_seq;
  p.t.kv_bound = 9;  // the decode has 10 keys
  try {
    step_attention_params(p.cfg, b, p.t);
    ADD_FAILURE() << "a bound below the longest sequence was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "kv_bound");
  }
}

// Planned on layer 0's pool, run on another layer's K and V: the float64 reference on those.
TEST(StepAttention, RunsALayersOwnPoolsThroughThePlan) {
  const ForwardBatch b = mixed_batch();
  for (int32_t window : {0, 3}) {
    Pools p(b);
    p.cfg.sliding_window = window;
    const StepAttention step(p.cfg, b, p.t);
    step.run(1, p.k1.data(), p.v1.data());
    AttentionParams ref = step.params();
    ref.k.data = p.k1.data();
    ref.v.data = p.v1.data();
    const attention::reference::NaiveOutput exact = attention::reference::naive_forward(ref);
    const attention::reference::NaiveOutput lowp =
        attention::reference::naive_forward(ref, attention::reference::Emulate::kLowPrecision);
    testing::expect_attention_close(testing::read_output(ref), exact, lowp, DType::kFloat32);
  }
}

TEST(StepAttention, AStepWithoutQueriesRunsNothing) {
  const ForwardBatch b = ForwardBatchBuilder(kBlock).build();
  Pools p(b);
  const StepAttention step(p.cfg, b, p.t);
  EXPECT_NO_THROW(step.run(0, p.k1.data(), p.v1.data()));
}

}  // namespace
}  // namespace flashserve::model
