#include "engine/simulated_executor.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/str_cat.h"
#include "flashserve/error.h"

namespace flashserve::engine {

std::vector<int32_t> SimulatedExecutor::execute(const serve::Batch& batch) {
  const double dt = cost_.step_seconds(batch);
  if (!(dt > 0) || !std::isfinite(dt))
    throw Error(ErrorKind::kInternal, "cost model", "step time " + std::to_string(dt));
  // Past ~1e10 s a double cannot resolve a millisecond step any more: latencies would come out
  // as rounding noise (all zeros, at 1e300 s). Refused instead of reported.
  const double next = now_ + dt;
  if (std::abs((next - now_) - dt) > 1e-3 * dt)
    throw Error(ErrorKind::kInvalidArgument, "requests",
                str_cat("arrival times reach ", now_,
                        " s, where the simulated clock cannot resolve a step of ", dt,
                        " s; use earlier arrivals (a higher rate)"));
  now_ = next;
  return std::vector<int32_t>(batch.entries.size(), 1);
}

void SimulatedExecutor::wait_until(double t) {
  now_ = std::max(now_, t);
}

}  // namespace flashserve::engine
