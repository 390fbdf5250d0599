// What runs a step's batch, and the clock the step is timed on. The engine's loop is the same for
// both implementations, so the simulator and the real engine cannot drift apart:
//   ModelExecutor      a model runner's forward and sampler; the wall clock (model_executor.h)
//   SimulatedExecutor  a step-cost model; a simulated clock that jumps (simulated_executor.h)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/logprobs.h"
#include "serve/batch.h"

namespace flashserve::engine {

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs the batch and returns one token per entry (the value of an entry that does not sample is
  // unused). When it returns, now() is the time the step ended.
  virtual std::vector<int32_t> execute(const serve::Batch& batch) = 0;
  // The log-probabilities of what the last execute() drew, one per batch entry: those of entries
  // that sampled for a sequence asking for them (Sequence::logprobs >= 0); sampled.token is -1
  // for the others. Empty when no entry asked, and always for an executor without logits (the
  // cost model). Moves them out: a second call returns nothing.
  virtual std::vector<model::SampledLogprobs> take_logprobs() { return {}; }
  // Seconds on this executor's clock.
  virtual double now() const = 0;
  // Idles until `t` on this clock: sleeps, or moves the simulated clock there.
  virtual void wait_until(double t) = 0;
  virtual std::string describe() const = 0;
};

}  // namespace flashserve::engine
