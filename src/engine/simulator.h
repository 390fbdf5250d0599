// Discrete-event simulation of serving: the engine's own loop (replay.h) with the real Scheduler
// and BlockManager and a SimulatedExecutor (a step-cost model, a clock that jumps), so an hour of
// traffic takes seconds and the simulator cannot drift from the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/replay.h"
#include "serve/cost_model.h"
#include "serve/workload.h"

namespace flashserve::engine {

struct SimConfig {
  serve::SchedulerConfig scheduler;
  int64_t num_blocks = 0;
  int32_t block_size = 16;
  double watermark = 0.01;
  // > 0: --budget auto under this P99 TBT SLO (sarathi), with the simulation's cost model.
  double auto_budget_slo_s = 0;
};

using SimResult = ReplayResult;

// Runs the requests on a simulated clock that starts at the first arrival.
SimResult simulate(const std::vector<serve::Request>& requests, const SimConfig& config,
                   const serve::CostModel& cost, const StepObserver& observer = nullptr);

}  // namespace flashserve::engine
