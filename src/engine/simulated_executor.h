// The simulator's executor: a step takes what the cost model says, on a clock that jumps from
// step end to step end (or to the next arrival when idle), so an hour of traffic takes seconds.
#pragma once

#include "engine/executor.h"
#include "serve/cost_model.h"

namespace flashserve::engine {

class SimulatedExecutor final : public Executor {
 public:
  // `cost` must outlive the executor.
  explicit SimulatedExecutor(const serve::CostModel& cost, double start = 0)
      : cost_(cost), now_(start) {}
  // Advances the clock by the step's cost. Every sampled token is 1 (the simulation needs only
  // lengths). Throws Error(kInvalidArgument) once the clock is so far out that a double cannot
  // resolve the step.
  std::vector<int32_t> execute(const serve::Batch& batch) override;
  double now() const override { return now_; }
  void wait_until(double t) override;
  std::string describe() const override { return cost_.describe(); }

 private:
  const serve::CostModel& cost_;
  double now_;
};

}  // namespace flashserve::engine
