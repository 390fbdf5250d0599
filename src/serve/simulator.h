// Discrete-event simulation of serving: the real Scheduler and BlockManager run against a step-cost
// model instead of a GPU. The clock jumps from step end to step end (or to the next arrival when
// idle), so an hour of traffic takes seconds.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "serve/cost_model.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"
#include "serve/workload.h"

namespace flashserve::serve {

struct SimConfig {
  SchedulerConfig scheduler;
  int64_t num_blocks = 0;
  int32_t block_size = 16;
  double watermark = 0.01;
};

// KV blocks that fit in `gpu_memory_utilization` of the GPU's memory once the weights are loaded
// (activations are small next to the KV cache and share the leftover margin). Throws if none fit.
int64_t kv_blocks_for(const ModelShape& model, double gpu_memory_bytes,
                      double gpu_memory_utilization, int32_t block_size);

struct SimResult {
  ServingMetrics metrics;
  int64_t steps = 0;
  int64_t max_step_tokens = 0;
  double end_time = 0;
  std::vector<std::unique_ptr<Sequence>> finished;  // in finishing order
};

// Called after each schedule() with the batch about to run, before complete().
using StepObserver = std::function<void(const Scheduler&, const Batch&)>;

SimResult simulate(const std::vector<Request>& requests, const SimConfig& config,
                   const CostModel& cost, const StepObserver& observer = nullptr);

}  // namespace flashserve::serve
