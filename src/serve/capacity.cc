#include "serve/capacity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

void check_capacity_span(const std::vector<Request>& requests, double rate,
                         double max_sched_delay_p50_s, double resolution) {
  if (!(resolution > 0 && resolution < 1))
    throw Error(ErrorKind::kInvalidArgument, "resolution",
                std::to_string(resolution) + " not in (0, 1)");
  if (!(max_sched_delay_p50_s > 0) || !(rate > 0))
    throw Error(ErrorKind::kInvalidArgument, "max_sched_delay_p50_s",
                "the delay bound and the rate must be positive");
  const double need_s = 2 * max_sched_delay_p50_s / resolution;
  double first = 0, last = 0;
  if (!requests.empty()) {
    const auto [lo, hi] = std::minmax_element(
        requests.begin(), requests.end(),
        [](const Request& a, const Request& b) { return a.arrival_s < b.arrival_s; });
    first = lo->arrival_s;
    last = hi->arrival_s;
  }
  const double span_s = last - first;
  if (span_s >= need_s) return;
  // n requests at `rate` arrive over about (n - 1) / rate seconds.
  const double need_n = std::ceil(need_s * rate) + 1;
  char why[512];
  std::snprintf(why, sizeof why,
                "%zu requests at %.3f req/s arrive over %.1f s, too short for a backlog to show: "
                "a run %.0f%% past capacity only breaks the %.2f s P50 scheduling-delay bound "
                "after %.1f s of arrivals (2 x bound / %.2f); give at least %.0f requests",
                requests.size(), rate, span_s, resolution * 100, max_sched_delay_p50_s, need_s,
                resolution, need_n);
  throw Error(ErrorKind::kInvalidArgument, "requests", why);
}

void check_capacity_requests(int64_t requests, int64_t min_requests) {
  if (requests >= min_requests) return;
  throw Error(ErrorKind::kInvalidArgument, "requests",
              std::to_string(requests) + " requests are too few for a capacity probe: at least " +
                  std::to_string(min_requests) +
                  " sample the trace's longest prompts often enough for a P99 to be set by more "
                  "than one of them (serve/capacity.h; --min-requests lowers the floor)");
}

}  // namespace flashserve::serve
