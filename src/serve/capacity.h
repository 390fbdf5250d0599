// Serving capacity as Sarathi-Serve defines it: the highest request rate at which the P99 TBT meets
// the SLO and the median scheduling delay stays under a bound (2 s in the paper), found by
// bisection.
#pragma once

#include <functional>
#include <vector>

#include "serve/metrics.h"

namespace flashserve::serve {

struct CapacityCriteria {
  double slo_tbt_p99_s = 0.1;
  double max_sched_delay_p50_s = 2.0;
  bool met_by(const ServingMetrics& m) const {
    return m.tbt.p99 <= slo_tbt_p99_s && m.sched_delay.p50 <= max_sched_delay_p50_s;
  }
};

struct CapacityProbe {
  double rate = 0;
  bool ok = false;
  double tbt_p99_s = 0, sched_delay_p50_s = 0;
};

struct CapacityResult {
  double capacity = 0;    // requests/s; 0 if even min_rate fails
  bool at_limit = false;  // met at every rate up to max_rate: capacity is a lower bound, not found
  std::vector<CapacityProbe> probes;  // every rate evaluated, in order
};

// `run(rate)` simulates the workload at `rate`. Starting at `start_rate` the rate doubles (or
// halves) until it brackets the boundary, then bisects until the bracket is within `rel_tol` of its
// top. Assumes the criteria hold below some rate and fail above it (true of a queue, up to noise).
CapacityResult find_capacity(const std::function<ServingMetrics(double)>& run,
                             const CapacityCriteria& criteria, double start_rate = 1.0,
                             double rel_tol = 0.02, double min_rate = 1e-3, double max_rate = 1e4);

// A predicted capacity held against runs just below and just above it: `run(rate)` (a real
// engine, say) at predicted x (1 - margin) should meet the criteria and at predicted x (1 + margin)
// should not. Throws Error(kInvalidArgument) for a prediction that is not positive (nothing to
// confirm) or a margin outside (0, 1).
struct CapacityConfirmation {
  double predicted = 0;
  CapacityProbe below, above;
  bool confirmed() const { return below.ok && !above.ok; }
};
CapacityConfirmation confirm_capacity(double predicted,
                                      const std::function<ServingMetrics(double)>& run,
                                      const CapacityCriteria& criteria, double margin = 0.1);

}  // namespace flashserve::serve
