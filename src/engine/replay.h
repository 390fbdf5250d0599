// Drives an engine through a list of timed requests: each request is added when the engine's clock
// reaches its arrival, the engine steps while it has work, and it idles (Executor::wait_until)
// until the next arrival when it has none. The simulator (a simulated clock) and bench-serve (the
// wall clock) are both this loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "serve/metrics.h"
#include "serve/workload.h"

namespace flashserve::engine {

struct ReplayOptions {
  // Prompt token ids: `vocab_size` > 0 draws them uniformly from [0, vocab_size) seeded by
  // (seed, request id); 0 fills them with 1 (the simulator needs only lengths).
  int64_t vocab_size = 0;
  uint64_t seed = 0;
  // Called after every step with the requests finished so far and the total (a progress line).
  std::function<void(int64_t finished, int64_t total, double now)> progress;
  // Called after every step that ran a forward, with the step, the time it ended (relative to the
  // replay's start) and the token budget it ran with (bench-serve --step-log).
  std::function<void(const StepResult& step, double end_s, int64_t budget)> on_step;
};

struct ReplayResult {
  serve::ServingMetrics metrics;
  int64_t steps = 0;
  int64_t max_step_tokens = 0;
  // The scheduler's token budget when the run started and when it ended, the least and most it
  // was after any step, and how often it changed (they differ only under --budget auto, which
  // adjusts it from the step times).
  int64_t budget_first = 0, budget_last = 0, budget_min = 0, budget_max = 0, budget_changes = 0;
  double start_time = 0, end_time = 0;                     // on the executor's clock
  std::vector<std::unique_ptr<serve::Sequence>> finished;  // in finishing order
};

// "576 at the start, 1024 at the end; 256 to 2048 over 37 changes": a --budget auto run's budget,
// as the CLIs print it.
std::string budget_trace(const ReplayResult& r);

// Requests are run with max_tokens = output_tokens and no stop (benchmarks measure fixed
// lengths), greedy. Throws Error naming a request the engine refuses.
ReplayResult replay(Engine& engine, const std::vector<serve::Request>& requests,
                    const ReplayOptions& options = {});

// The prompt replay gives a request: seeded, so every policy sees the same tokens.
std::vector<int32_t> synthetic_prompt(const serve::Request& r, int64_t vocab_size, uint64_t seed);

}  // namespace flashserve::engine
