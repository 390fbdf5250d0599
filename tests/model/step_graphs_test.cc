// Which CUDA graph a step of the CUDA runner takes and at how many rows (model/step_graphs.h), on
// the host: the token buckets (shared with the GEMM's tuning), the width buckets, and the kind of
// each step.
#include "model/step_graphs.h"

#include "flashserve/error.h"

#include <gtest/gtest.h>

#include <set>
#include <tuple>
#include <vector>

namespace flashserve::model {
namespace {

// Mixed-step graphs on up to the largest bucket (the default since session 17's measurement:
// kMixedGraphsByDefault; spelled out so that these tests do not depend on it).
StepGraphOptions on() {
  StepGraphOptions o;
  o.mixed_max_tokens = kMixedGraphMaxTokens;
  return o;
}

TEST(StepGraphs, TokenBucketsArePowersOfTwoThenMultiplesOf64ThenOf512) {
  EXPECT_EQ(token_bucket(1), 1);
  EXPECT_EQ(token_bucket(2), 2);
  EXPECT_EQ(token_bucket(3), 4);
  EXPECT_EQ(token_bucket(33), 64);
  EXPECT_EQ(token_bucket(64), 64);
  EXPECT_EQ(token_bucket(65), 128);
  EXPECT_EQ(token_bucket(129), 192);
  EXPECT_EQ(token_bucket(300), 320);
  EXPECT_EQ(token_bucket(511), 512);
  EXPECT_EQ(token_bucket(512), 512);
  EXPECT_EQ(token_bucket(1000), 1024);
  EXPECT_EQ(token_bucket(1025), 1088);
  EXPECT_EQ(token_bucket(1088), 1088);
  EXPECT_EQ(token_bucket(2047), 2048);
  EXPECT_EQ(token_bucket(2048), 2048);
  EXPECT_EQ(token_bucket(2049), 2560);
  EXPECT_EQ(token_bucket(8191), 8192);
}

TEST(StepGraphs, EveryCountUpToTheLargestMixedStepHasABucketThatKeepsIt) {
  std::set<int64_t> buckets;
  int64_t prev = 0;
  for (int64_t t = 1; t <= kMixedGraphMaxTokens; ++t) {
    const int64_t b = token_bucket(t);
    EXPECT_GE(b, t);
    EXPECT_GE(b, prev) << "monotone";
    EXPECT_EQ(token_bucket(b), b) << "a bucket is its own bucket (the GEMM's tuning agrees)";
    // The padding: below the bucket step (64; under 64 less than t): 63 rows at most, 6% of a
    // 1088-token step (steps of 512 past 1024 cost the H200's 1088-token steps 30%).
    EXPECT_LT(b - t, t <= 64 ? t : 64) << t;
    buckets.insert(b);
    prev = b;
  }
  // 1, 2, 4, ..., 64; 128 ... 2048 by 64.
  EXPECT_EQ(buckets.size(), 7u + 31u);
  EXPECT_EQ(*buckets.rbegin(), kMixedGraphMaxTokens);
}

TEST(StepGraphs, WidthBucketIsThePowerOfTwoAbove) {
  EXPECT_EQ(width_bucket(0), 1);
  EXPECT_EQ(width_bucket(1), 1);
  EXPECT_EQ(width_bucket(5), 8);
  EXPECT_EQ(width_bucket(64), 64);
  EXPECT_EQ(width_bucket(65), 128);
}

// q_len, kv_len and whether it samples, per entry (blocks of 16 tokens, ids 1.. in order).
ForwardBatch batch(const std::vector<std::tuple<int64_t, int64_t, bool>>& entries) {
  ForwardBatchBuilder bb(16);
  std::vector<int32_t> ids(4096, 3);
  int32_t next = 0;
  for (const auto& [q, kv, samples] : entries) {
    std::vector<int32_t> blocks;
    for (int64_t i = 0; i < (kv + 15) / 16; ++i) blocks.push_back(next++);
    bb.add(ids.data(), kv - q, q, blocks, samples);
  }
  return std::move(bb).build();
}

TEST(StepGraphs, DecodeOnlyStepsTakeDecodeGraphsAtTheirBatch) {
  const ForwardBatch b = batch({{1, 40, true}, {1, 100, true}, {1, 7, true}});
  const StepGraphShape s = step_graph_shape(b, on());
  EXPECT_EQ(s.kind, StepGraphKind::kDecode);
  EXPECT_EQ(s.rows, 3);
  EXPECT_EQ(s.width, 8);  // 7 pages
}

TEST(StepGraphs, MixedStepsArePaddedToTheirBucket) {
  // Two decodes and two odd chunks: 1 + 1 + 97 + 201 = 300 tokens, run as 320.
  const ForwardBatch b = batch({{1, 40, true}, {1, 33, true}, {97, 300, false}, {201, 201, true}});
  const StepGraphShape s = step_graph_shape(b, on());
  EXPECT_EQ(s.kind, StepGraphKind::kMixed);
  EXPECT_EQ(s.rows, 320);
  EXPECT_EQ(s.width, 32);  // 19 pages
  // Chunks alone are mixed steps too; so is a batch of single tokens that does not sample all.
  EXPECT_EQ(step_graph_shape(batch({{77, 77, true}}), on()).kind, StepGraphKind::kMixed);
  EXPECT_EQ(step_graph_shape(batch({{77, 77, true}}), on()).rows, 128);
  EXPECT_EQ(step_graph_shape(batch({{1, 5, true}, {1, 9, false}}), on()).kind,
            StepGraphKind::kMixed);
}

TEST(StepGraphs, StepsAboveTheLargestBucketAndGraphsOffRunEager) {
  const ForwardBatch big =
      batch({{1, 40, true}, {kMixedGraphMaxTokens, kMixedGraphMaxTokens, true}});
  StepGraphShape s = step_graph_shape(big, on());
  EXPECT_EQ(s.kind, StepGraphKind::kEager);
  EXPECT_EQ(s.rows, kMixedGraphMaxTokens + 1);
  EXPECT_EQ(s.width, big.pages_per_seq);  // unpadded
  const ForwardBatch b = batch({{1, 40, true}, {100, 100, true}});
  StepGraphOptions o;
  o.mixed_max_tokens = 100;
  EXPECT_EQ(step_graph_shape(b, o).kind, StepGraphKind::kEager);  // 101 tokens
  o.mixed_max_tokens = 101;
  EXPECT_EQ(step_graph_shape(b, o).kind, StepGraphKind::kMixed);
  o.mixed_max_tokens = 0;
  EXPECT_EQ(step_graph_shape(b, o).kind, StepGraphKind::kEager);
  o.graphs = false;
  EXPECT_EQ(step_graph_shape(batch({{1, 5, true}}), o).kind, StepGraphKind::kEager);
  s = step_graph_shape(b, o);
  EXPECT_EQ(s.kind, StepGraphKind::kEager);
  EXPECT_EQ(s.rows, 101);
  EXPECT_EQ(step_graph_shape(ForwardBatch{}, on()).kind, StepGraphKind::kEager);
}

// The cost model's rows (mixed_step_rows) are step_graph_shape's for every step that is not
// decode-only: padded where a mixed graph runs it, its own rows where the step runs eager.
TEST(StepGraphs, MixedStepRowsAreTheRowsTheStepRunsAt) {
  StepGraphOptions o = on();
  for (int64_t chunk : {2, 63, 64, 65, 577, 1023, 1024, 1025, 1088, 2047, 2048, 2049, 4000}) {
    const ForwardBatch b = batch({{1, 40, true}, {chunk, chunk, true}});
    for (int64_t max_tokens : {int64_t{0}, int64_t{1024}, kMixedGraphMaxTokens}) {
      o.mixed_max_tokens = max_tokens;
      for (bool graphs : {true, false}) {
        o.graphs = graphs;
        EXPECT_EQ(mixed_step_rows(b.total_q, o), step_graph_shape(b, o).rows)
            << chunk << " tokens, graphs " << graphs << " up to " << max_tokens;
      }
    }
  }
  EXPECT_EQ(mixed_step_rows(1089, on()), 1152);
  EXPECT_EQ(mixed_step_rows(0, on()), 0);
}

TEST(StepGraphs, TheEnvironmentIsReadStrictly) {
  const StepGraphOptions unset = step_graph_options_from_env(nullptr, nullptr);
  EXPECT_TRUE(unset.graphs);
  EXPECT_EQ(unset.mixed_max_tokens, StepGraphOptions{}.mixed_max_tokens);
  EXPECT_TRUE(step_graph_options_from_env("", "").graphs);
  EXPECT_TRUE(step_graph_options_from_env("1", nullptr).graphs);
  EXPECT_FALSE(step_graph_options_from_env("0", nullptr).graphs);
  EXPECT_EQ(step_graph_options_from_env(nullptr, "0").mixed_max_tokens, 0);
  EXPECT_EQ(step_graph_options_from_env(nullptr, "512").mixed_max_tokens, 512);
  for (const char* bad : {"yes", "off", "2", " 1"}) {
    try {
      step_graph_options_from_env(bad, nullptr);
      ADD_FAILURE() << "FLASHSERVE_CUDA_GRAPHS=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHSERVE_CUDA_GRAPHS") << e.what();
    }
  }
  for (const char* bad : {"-1", "5k", "1.5", "99999999999999999999", " 8"}) {
    try {
      step_graph_options_from_env(nullptr, bad);
      ADD_FAILURE() << "FLASHSERVE_MIXED_GRAPH_TOKENS=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHSERVE_MIXED_GRAPH_TOKENS") << e.what();
    }
  }
}

}  // namespace
}  // namespace flashserve::model
