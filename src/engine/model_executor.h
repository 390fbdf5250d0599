// The real engine's executor: one step is layout (serve::layout_batch) -> the runner's forward
// over the whole mixed batch -> the runner's sampler with each sequence's SamplingParams and
// LogitsAdjust (penalties over its tokens, logit_bias, its stop tokens banned before min_tokens,
// its grammar's mask), timed on the wall clock (seconds since the executor was made).
#pragma once

#include <chrono>
#include <memory>

#include "common/thread_pool.h"

#include "engine/executor.h"
#include "model/runner.h"

namespace flashserve::engine {

class ModelExecutor final : public Executor {
 public:
  // The runner's KV pool must already hold the blocks the engine's BlockManager hands out; engines
  // made one after another may share a runner (each block is written before it is read).
  ModelExecutor(std::shared_ptr<model::ModelRunner> runner, int32_t block_size, std::string device);
  std::vector<int32_t> execute(const serve::Batch& batch) override;
  std::vector<model::SampledLogprobs> take_logprobs() override { return std::move(logprobs_); }
  double now() const override;
  void wait_until(double t) override;
  std::string describe() const override;
  model::ModelRunner& runner() { return *runner_; }

 private:
  std::shared_ptr<model::ModelRunner> runner_;
  int32_t block_size_;
  std::string device_;
  std::chrono::steady_clock::time_point start_;
  std::vector<model::SampledLogprobs> logprobs_;  // of the last execute(), when any entry asked
  // The grammar masks of a step with several constrained rows, one row per task: each walks the
  // vocabulary's trie (0.1-2 ms a row), and on the engine thread alone 64 of them made a batch-64
  // step 1.77x an unconstrained one on the H200 (bench_constrained, session 20). Started on the
  // first such step; its own threads, not ThreadPool::global(), which the CPU runner's forward
  // uses.
  std::unique_ptr<ThreadPool> mask_pool_;

  // What the sequence's next token is sampled after (empty: nothing to change).
  model::LogitsAdjust logits_adjust(const serve::Sequence& seq) const;
  static int mask_workers();  // mask_pool_'s threads, the calling one included
};

}  // namespace flashserve::engine
