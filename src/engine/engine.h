// The engine: one Executor (a model runner, or a cost model), the paged-KV BlockManager and a
// Scheduler, driven one step at a time. A step is
//   schedule -> Executor::execute (layout, one mixed forward, sampling) -> complete
// and returns every request's new tokens and, when it ends, why (eos / stop / length / abort).
// Not thread-safe: one thread drives it (the front door, front_door.h, is the way in from others).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_set>
#include <vector>

#include "engine/executor.h"
#include "model/logprobs.h"
#include "model/sampling.h"
#include "serve/auto_budget.h"
#include "serve/block_manager.h"
#include "serve/scheduler.h"
#include "serve/sequence.h"

namespace flashserve::engine {

struct EngineConfig {
  serve::SchedulerConfig scheduler;
  int64_t num_blocks = 0;  // KV blocks in the pool (the runner's pool must hold as many)
  int32_t block_size = 16;
  double watermark = 0.01;
  int64_t vocab_size = 0;           // token ids must be below it; 0: not checked (the simulator)
  std::vector<int32_t> eos_tokens;  // each ends a request unless it asks to ignore them
  // Keep computed full blocks by content and reuse them for prompts that start the same way
  // (serve/block_manager.h). Only where prompts are real tokens: not the simulator's.
  bool prefix_caching = false;
};

struct NewRequest {
  std::vector<int32_t> prompt;
  model::SamplingParams sampling;
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // -1: none; 0..model::kMaxTopLogprobs: each token's log-probability and that many alternatives.
  int32_t logprobs = -1;
  // What it may generate (a grammar: structured output); null: anything.
  std::shared_ptr<model::TokenConstraint> constraint;
  int64_t id = -1;           // -1: the engine numbers it; else the caller's (unique among live)
  double arrival_time = -1;  // -1: now, on the executor's clock
};

// What one request got from one step.
struct RequestOutput {
  int64_t id = 0;
  std::vector<int32_t> new_tokens;
  // One per new token when the request asked for logprobs; empty otherwise.
  std::vector<model::SampledLogprobs> logprobs;
  serve::FinishReason finish = serve::FinishReason::kNone;  // kNone while it runs
  int64_t cached_tokens = 0;  // prompt tokens found in the prefix cache (Sequence's)
};

struct StepResult {
  std::vector<RequestOutput> outputs;  // requests that got tokens or finished (aborts included)
  // Requests that finished in this step (not aborted ones), with their token times for metrics.
  std::vector<std::unique_ptr<serve::Sequence>> finished;
  int64_t num_tokens = 0;  // tokens in the step's forward (0: nothing ran)
  int64_t decodes = 0;     // of its entries, the decodes (one token each, not prefill)
  double seconds = 0;      // the forward's time on the executor's clock (what --budget auto sees)
  int64_t preempted = 0;
};

// Called after schedule() with the batch about to run, before it runs.
using StepObserver = std::function<void(const serve::Scheduler&, const serve::Batch&)>;

class Engine {
 public:
  // Throws Error(kInvalidArgument) naming the field of a bad config (or a pool too small for one
  // max_model_len sequence).
  Engine(const EngineConfig& config, std::unique_ptr<Executor> executor);

  // Queues a request and returns its id. A request that could never run (empty prompt, ids
  // outside the vocabulary, prompt + max_tokens over max_model_len, bad sampling parameters, an id
  // already live) is refused with Error(kInvalidArgument) and changes nothing.
  int64_t add_request(NewRequest request);
  // The checks of add_request that depend only on the configuration: safe from any thread.
  void check_request(const NewRequest& request) const;
  // Drops a request wherever it is and frees its blocks; the next step reports it with
  // FinishReason::kAbort. Returns whether the engine held it. Not from inside an observer.
  bool abort(int64_t id);
  // One step. With nothing runnable it runs nothing (num_tokens 0) and only reports aborts.
  StepResult step();

  bool has_work() const { return scheduler_->has_work(); }
  const EngineConfig& config() const { return config_; }
  const serve::Scheduler& scheduler() const { return *scheduler_; }
  const serve::BlockManager& blocks() const { return *blocks_; }
  Executor& executor() { return *executor_; }
  double now() const { return executor_->now(); }
  void set_observer(StepObserver observer) { observer_ = std::move(observer); }
  // --budget auto: the scheduler's token budget from `budget` (its offline choice now, then its
  // adjustments from each step's time on the executor's clock). Sarathi only; throws
  // Error(kInvalidArgument) for another policy.
  void set_auto_budget(std::unique_ptr<serve::AutoBudget> budget);
  const serve::AutoBudget* auto_budget() const { return auto_budget_.get(); }

 private:
  EngineConfig config_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<serve::BlockManager> blocks_;
  std::unique_ptr<serve::Scheduler> scheduler_;
  std::unordered_set<int64_t> live_;
  std::vector<int64_t> aborted_;  // reported by the next step
  int64_t next_id_ = 0;
  StepObserver observer_;
  std::unique_ptr<serve::AutoBudget> auto_budget_;
};

}  // namespace flashserve::engine
