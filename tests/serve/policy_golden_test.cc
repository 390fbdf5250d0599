// Golden batch compositions, one small script per policy: arrivals (prompt and output lengths) at
// given steps, a small KV pool, and step by step the batch each policy must form, written as
// "A8 B2" (request A computes 8 tokens, B 2, in that order) and "| preempted B". Every expected
// trace is traced by hand from the policy's definition (scheduler.h, policy.h), with the trace
// written out beside it; none was printed from the code.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "serve/scheduler.h"

namespace fs = flashserve::serve;

namespace {

struct Arrival {
  int64_t step;
  char name;  // the request's id is name - 'A'
  int64_t prompt, output;
};

// Runs the script to the end: at each step the arrivals of that step are added, then one batch
// is formed and completed (every entry that samples gets token 1, which stops nothing).
std::vector<std::string> trace(const fs::SchedulerConfig& cfg, fs::BlockManager& blocks,
                               const std::vector<Arrival>& script) {
  auto sched = fs::Scheduler::create(cfg, blocks);
  std::vector<std::string> steps;
  size_t next = 0;
  for (int64_t step = 0; next < script.size() || sched->has_work(); ++step) {
    if (step > 100) {
      ADD_FAILURE() << "no end after 100 steps";
      break;
    }
    for (; next < script.size() && script[next].step == step; ++next) {
      const Arrival& a = script[next];
      auto s = std::make_unique<fs::Sequence>();
      s->id = a.name - 'A';
      s->prompt.assign(static_cast<size_t>(a.prompt), 7);
      s->max_output_tokens = a.output;
      sched->add(std::move(s));
    }
    const fs::Batch b = sched->schedule(static_cast<double>(step));
    std::string line;
    for (const fs::BatchEntry& e : b.entries)
      line += (line.empty() ? "" : " ") + std::string(1, static_cast<char>('A' + e.seq->id)) +
              std::to_string(e.q_len);
    for (int64_t id : b.preempted)
      line += std::string(line.empty() ? "" : " ") + "| preempted " +
              std::string(1, static_cast<char>('A' + id));
    steps.push_back(line);
    sched->complete(b, std::vector<int32_t>(b.entries.size(), 1), static_cast<double>(step + 1));
    blocks.check_invariants(sched->live());
  }
  return steps;
}

using Steps = std::vector<std::string>;

// vllm-v1 under its token budget: running requests first in admission order, then new ones FIFO
// while the budget lasts and max_num_seqs (max_running 2) allows.
// Budget 8. A (prompt 10, 2 out), B (6, 2), C (1, 1) all arrive at step 0; the pool is ample.
//   0: A gets min(10, 8) = 8; nothing is left for B.
//   1: A's last 2 (samples), then B's whole 6 in the 6 left.
//   2: A and B decode (both finish); 6 tokens are left but 2 requests run = max_running: C waits.
//   3: C's prompt of 1 (it finishes).
TEST(PolicyGolden, VllmV1RunsRunningFirstUnderOneBudget) {
  fs::SchedulerConfig cfg;
  cfg.policy = fs::Policy::kVllmV1;
  cfg.max_tokens_per_step = 8;
  cfg.max_running = 2;
  cfg.max_model_len = 16;
  fs::BlockManager blocks(64, 4);
  EXPECT_EQ(trace(cfg, blocks, {{0, 'A', 10, 2}, {0, 'B', 6, 2}, {0, 'C', 1, 1}}),
            (Steps{"A8", "A2 B6", "A1 B1", "C1"}));
}

// vllm-v1 with long_prefill_token_threshold 4 and a pool of 5 blocks of 4 tokens (no watermark),
// budget 16: blocks come chunk by chunk, the latest-admitted request is preempted when blocks run
// out, and nothing is admitted in that step. A (prompt 8, 6 out) and B (prompt 2, 8 out) at step 0.
//   0: A's chunk is capped at 4 (1 block), B's whole prompt of 2 (1 block): 3 blocks free.
//   1: A's last 4 (a second block; A samples), B decodes at 3 keys: 2 free.
//   2: A at 9 keys takes a third block (1 free); B at 4 keys.
//   3: A at 10; B at 5 keys takes the last block (0 free).
//   4, 5: A at 11, 12 and B at 6, 7 fit in their blocks.
//   6: A at 13 keys needs a fourth block, none is free: B, the latest admitted, is preempted
//      (2 blocks back), A takes one. B (8 tokens now) would fit a 4-token chunk in the 1 block
//      left, but nothing is admitted in a step that preempted. A samples its 6th token and ends.
//   7: B is readmitted: a chunk of 4 (the threshold) in 1 block.
//   8: B's last 4 (samples its 7th token).
//   9: B decodes its 8th and ends.
TEST(PolicyGolden, VllmV1PreemptsTheLatestAdmittedAndAdmitsNothingThatStep) {
  fs::SchedulerConfig cfg;
  cfg.policy = fs::Policy::kVllmV1;
  cfg.max_tokens_per_step = 16;
  cfg.max_running = 4;
  cfg.max_model_len = 20;
  cfg.long_prefill_token_threshold = 4;
  fs::BlockManager blocks(5, 4, /*watermark=*/0.2);  // vllm-v1 admits without it
  EXPECT_EQ(trace(cfg, blocks, {{0, 'A', 8, 6}, {0, 'B', 2, 8}}),
            (Steps{"A4 B2", "A4 B1", "A1 B1", "A1 B1", "A1 B1", "A1 B1", "A1 | preempted B", "B4",
                   "B4", "B1"}));
}

// vllm-v0 (prefill-first), cap 8 tokens of whole prompts a step. A (3, 3 out) at step 0; B (6, 2)
// and C (4, 1) at step 1.
//   0: A's prompt.
//   1: B's 6 fit, C's 4 do not fit in the 2 left; A's decode stalls behind the prompt.
//   2: C's prompt (C ends); A and B stall.
//   3: no prompt waits: every decode (B ends).
//   4: A's last decode.
TEST(PolicyGolden, VllmV0RunsPromptsFirstAndStallsDecodes) {
  fs::SchedulerConfig cfg;
  cfg.policy = fs::Policy::kVllmV0;
  cfg.max_tokens_per_step = 8;
  cfg.max_running = 4;
  cfg.max_model_len = 8;
  fs::BlockManager blocks(64, 4);
  EXPECT_EQ(trace(cfg, blocks, {{0, 'A', 3, 3}, {1, 'B', 6, 2}, {1, 'C', 4, 1}}),
            (Steps{"A3", "B6", "C4", "A1 B1", "A1"}));
}

// The old name "vllm" is an alias of vllm-v0; the canonical name is what is printed.
TEST(PolicyGolden, VllmIsAnAliasOfVllmV0) {
  EXPECT_EQ(fs::parse_policy("vllm"), fs::Policy::kVllmV0);
  EXPECT_STREQ(fs::to_string(fs::parse_policy("vllm")), "vllm-v0");
  EXPECT_EQ(fs::parse_policy("vllm-v1"), fs::Policy::kVllmV1);
}

// Sarathi, budget 8, chunk tile 4. A (10, 2 out) and B (7, 2) at step 0.
//   0: A's chunk min(10, 8) = 8, a tile multiple.
//   1: A's last 2 (samples); B gets min(7, 6) = 6, rounded down to the tile: 4.
//   2: A's decode first (A ends), then B's last 3 in the 7 left (samples).
//   3: B's decode (B ends).
TEST(PolicyGolden, SarathiDecodesFirstThenTileRoundedChunks) {
  fs::SchedulerConfig cfg;
  cfg.max_tokens_per_step = 8;
  cfg.max_running = 4;
  cfg.max_model_len = 16;
  cfg.chunk_tile = 4;
  fs::BlockManager blocks(64, 4);
  EXPECT_EQ(trace(cfg, blocks, {{0, 'A', 10, 2}, {0, 'B', 7, 2}}),
            (Steps{"A8", "A2 B4", "A1 B3", "B1"}));
}

// Orca, memory-bound: each admitted request reserves max_model_len = 8 tokens (2 blocks of 4) of a
// 4-block pool with no watermark (the manager's 1-block watermark is not Orca's), max_running 3.
// A (3, 2 out), B (5, 1) and C (2, 1) at step 0.
//   0: A and B take all 4 blocks (with a watermark of 1, B would not have been admitted); C waits
//      for memory, not for max_running. B ends, its 2 blocks come back.
//   1: A's decode with C's whole prompt beside it; both end.
TEST(PolicyGolden, OrcaReservesMaxModelLenWithoutAWatermark) {
  fs::SchedulerConfig cfg;
  cfg.policy = fs::Policy::kOrca;
  cfg.max_running = 3;
  cfg.max_model_len = 8;
  fs::BlockManager blocks(4, 4, /*watermark=*/0.25);
  ASSERT_EQ(blocks.watermark_blocks(), 1);
  EXPECT_EQ(trace(cfg, blocks, {{0, 'A', 3, 2}, {0, 'B', 5, 1}, {0, 'C', 2, 1}}),
            (Steps{"A3 B5", "A1 C2"}));
}

// Orca with ample memory is bounded by max_running (here 1): one request at a time.
//   0: A's prompt. 1: A's decode (A ends). 2: B's prompt (ends). 3: C's prompt (ends).
TEST(PolicyGolden, OrcaAdmitsUpToMaxRunning) {
  fs::SchedulerConfig cfg;
  cfg.policy = fs::Policy::kOrca;
  cfg.max_running = 1;
  cfg.max_model_len = 8;
  fs::BlockManager blocks(64, 4);
  EXPECT_EQ(trace(cfg, blocks, {{0, 'A', 3, 2}, {0, 'B', 5, 1}, {0, 'C', 2, 1}}),
            (Steps{"A3", "A1", "B5", "C2"}));
}

// Static, max_running 2, and a max_tokens_per_step of 4 that static ignores (it has no token cap).
// A (3, 3 out), B (5, 1), C (2, 1) at step 0; D (1, 1) at step 1.
//   0: a batch of max_running = 2 whole prompts, A and B: 8 tokens (B ends).
//   1, 2: A decodes; C and D wait for the batch to drain although a slot is free (A ends at 2).
//   3: the next batch, C and D (both end).
TEST(PolicyGolden, StaticAdmitsUpToMaxRunningOnceTheBatchDrains) {
  fs::SchedulerConfig cfg;
  cfg.policy = fs::Policy::kStatic;
  cfg.max_tokens_per_step = 4;
  cfg.max_running = 2;
  cfg.max_model_len = 16;
  fs::BlockManager blocks(64, 4);
  EXPECT_EQ(trace(cfg, blocks, {{0, 'A', 3, 3}, {0, 'B', 5, 1}, {0, 'C', 2, 1}, {1, 'D', 1, 1}}),
            (Steps{"A3 B5", "A1", "A1", "C2 D1"}));
}

}  // namespace
