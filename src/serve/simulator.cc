#include "serve/simulator.h"

#include "common/checked_math.h"
#include "common/str_cat.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "flashserve/error.h"

namespace flashserve::serve {

int64_t kv_blocks_for(const ModelShape& model, double gpu_memory_bytes,
                      double gpu_memory_utilization, int32_t block_size) {
  if (block_size < 1)
    throw Error(ErrorKind::kInvalidArgument, "block_size",
                std::to_string(block_size) + " must be positive");
  if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1))
    throw Error(ErrorKind::kInvalidArgument, "gpu_memory_utilization",
                std::to_string(gpu_memory_utilization) + " is not in (0, 1]");
  const double left =
      gpu_memory_bytes * gpu_memory_utilization - static_cast<double>(model.weight_bytes());
  const double block_bytes = static_cast<double>(model.kv_bytes_per_token()) * block_size;
  const int64_t n = left > 0 ? static_cast<int64_t>(left / block_bytes) : 0;
  if (n < 1)
    throw Error(ErrorKind::kInvalidArgument, "model",
                model.name + "'s weights (" +
                    std::to_string(static_cast<double>(model.weight_bytes()) / 1e9) +
                    " GB) leave no room for a KV cache in " +
                    std::to_string(gpu_memory_bytes * gpu_memory_utilization / 1e9) + " GB");
  return n;
}

SimResult simulate(const std::vector<Request>& requests, const SimConfig& config,
                   const CostModel& cost, const StepObserver& observer) {
  for (size_t i = 1; i < requests.size(); ++i)
    if (requests[i].arrival_s < requests[i - 1].arrival_s)
      throw Error(ErrorKind::kInvalidArgument, "requests", "arrivals must not decrease");
  BlockManager blocks(config.num_blocks, config.block_size, config.watermark);
  auto sched = Scheduler::create(config.scheduler, blocks);
  SimResult result;
  std::vector<int32_t> sampled;
  size_t next = 0;
  double now = requests.empty() ? 0 : requests.front().arrival_s;
  while (next < requests.size() || sched->has_work()) {
    for (; next < requests.size() && requests[next].arrival_s <= now; ++next) {
      const Request& r = requests[next];
      auto seq = std::make_unique<Sequence>();
      seq->id = r.id;
      // Token ids do not matter to the simulation; the lengths do. A prompt that can never run
      // is refused before its (possibly huge) token vector is allocated.
      if (saturating_add(r.prompt_tokens, r.output_tokens) > config.scheduler.max_model_len)
        throw Error(ErrorKind::kInvalidArgument, "request " + std::to_string(r.id),
                    str_cat("prompt ", r.prompt_tokens, " + output ", r.output_tokens,
                            " tokens exceeds max_model_len ", config.scheduler.max_model_len));
      seq->prompt.assign(static_cast<size_t>(std::max<int64_t>(r.prompt_tokens, 0)), 1);
      seq->max_output_tokens = r.output_tokens;
      seq->arrival_time = r.arrival_s;
      sched->add(std::move(seq));  // throws naming the request if it can never run
    }
    if (!sched->has_work()) {
      now = requests[next].arrival_s;
      continue;
    }
    Batch batch = sched->schedule(now);
    if (batch.empty()) {
      if (next >= requests.size())
        throw Error(ErrorKind::kInternal, "simulate",
                    "the scheduler has work but formed an empty batch with no arrival to wait for");
      now = requests[next].arrival_s;
      continue;
    }
    if (observer) observer(*sched, batch);
    const double dt = cost.step_seconds(batch);
    if (!(dt > 0) || !std::isfinite(dt))
      throw Error(ErrorKind::kInternal, "cost model", "step time " + std::to_string(dt));
    // Past ~1e10 s a double cannot resolve a millisecond step any more: latencies would come out
    // as rounding noise (all zeros, at 1e300 s). Refused instead of reported.
    const double next_now = now + dt;
    if (std::abs((next_now - now) - dt) > 1e-3 * dt)
      throw Error(ErrorKind::kInvalidArgument, "requests",
                  str_cat("arrival times reach ", now,
                          " s, where the simulated clock cannot resolve a step of ", dt,
                          " s; use earlier arrivals (a higher rate)"));
    now = next_now;
    sampled.assign(batch.entries.size(), 1);
    ++result.steps;
    result.max_step_tokens = std::max(result.max_step_tokens, batch.num_tokens());
    for (auto& s : sched->complete(batch, sampled, now)) result.finished.push_back(std::move(s));
  }
  result.end_time = now;
  std::vector<const Sequence*> done;
  for (const auto& s : result.finished) done.push_back(s.get());
  result.metrics = compute_metrics(done);
  return result;
}

}  // namespace flashserve::serve
