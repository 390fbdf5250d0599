#include "serve/capacity.h"

#include <cmath>
#include <string>

#include "flashserve/error.h"

namespace flashserve::serve {

CapacityResult find_capacity(const std::function<ServingMetrics(double)>& run,
                             const CapacityCriteria& criteria, double start_rate, double rel_tol,
                             double min_rate, double max_rate) {
  if (!(start_rate > 0) || !(min_rate > 0) || !(max_rate >= start_rate) || start_rate < min_rate)
    throw Error(ErrorKind::kInvalidArgument, "start_rate",
                std::to_string(start_rate) + " is not in [min_rate " + std::to_string(min_rate) +
                    ", max_rate " + std::to_string(max_rate) + "] (min_rate must be positive)");
  if (!(criteria.slo_tbt_p99_s > 0))
    throw Error(ErrorKind::kInvalidArgument, "slo_tbt_p99_s",
                std::to_string(criteria.slo_tbt_p99_s) + " must be positive");
  if (!(criteria.max_sched_delay_p50_s > 0))
    throw Error(ErrorKind::kInvalidArgument, "max_sched_delay_p50_s",
                std::to_string(criteria.max_sched_delay_p50_s) + " must be positive");
  if (!(rel_tol > 0 && rel_tol < 1))
    throw Error(ErrorKind::kInvalidArgument, "rel_tol", std::to_string(rel_tol) + " not in (0, 1)");
  CapacityResult res;
  auto probe = [&](double rate) {
    const ServingMetrics m = run(rate);
    CapacityProbe p{rate, criteria.met_by(m), m.tbt.p99, m.sched_delay.p50};
    res.probes.push_back(p);
    return p.ok;
  };
  double lo, hi;  // lo passes, hi fails
  if (probe(start_rate)) {
    lo = start_rate;
    for (hi = lo * 2; hi <= max_rate && probe(hi); hi *= 2) lo = hi;
    if (hi > max_rate) {
      res.capacity = lo;  // never failed: the highest rate tried, a lower bound
      res.at_limit = true;
      return res;
    }
  } else {
    hi = start_rate;
    for (lo = hi / 2; lo >= min_rate && !probe(lo); lo /= 2) hi = lo;
    if (lo < min_rate) return res;  // capacity 0
  }
  while ((hi - lo) > rel_tol * hi) {
    const double mid = 0.5 * (lo + hi);
    (probe(mid) ? lo : hi) = mid;
  }
  res.capacity = lo;
  return res;
}

CapacityConfirmation confirm_capacity(double predicted,
                                      const std::function<ServingMetrics(double)>& run,
                                      const CapacityCriteria& criteria, double margin) {
  if (!(predicted > 0) || !std::isfinite(predicted))
    throw Error(ErrorKind::kInvalidArgument, "predicted",
                std::to_string(predicted) + " is not a positive capacity to confirm");
  if (!(margin > 0 && margin < 1))
    throw Error(ErrorKind::kInvalidArgument, "margin", std::to_string(margin) + " not in (0, 1)");
  CapacityConfirmation c;
  c.predicted = predicted;
  auto probe = [&](double rate) {
    const ServingMetrics m = run(rate);
    return CapacityProbe{rate, criteria.met_by(m), m.tbt.p99, m.sched_delay.p50};
  };
  c.below = probe(predicted * (1 - margin));
  c.above = probe(predicted * (1 + margin));
  return c;
}

}  // namespace flashserve::serve
