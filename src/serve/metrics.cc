#include "serve/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "flashserve/error.h"

namespace flashserve::serve {

namespace {
// The q-th percentile of sorted, non-empty values: linear between the order statistics around rank
// q/100 * (n - 1).
double sorted_percentile(const std::vector<double>& v, double q) {
  const double pos = q / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}
}  // namespace

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  if (!(q >= 0 && q <= 100))
    throw Error(ErrorKind::kInvalidArgument, "q", std::to_string(q) + " is not in [0, 100]");
  std::sort(v.begin(), v.end());
  return sorted_percentile(v, q);
}

Summary summarize(const std::vector<double>& values) {
  Summary s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) return s;
  std::vector<double> v = values;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  s.p50 = sorted_percentile(v, 50);
  s.p90 = sorted_percentile(v, 90);
  s.p99 = sorted_percentile(v, 99);
  s.max = v.back();
  return s;
}

ServingMetrics compute_metrics(const std::vector<const Sequence*>& finished) {
  ServingMetrics m;
  std::vector<double> ttft, tpot, e2e, delay;
  double first_arrival = std::numeric_limits<double>::infinity(), last_finish = 0;
  for (const Sequence* s : finished) {
    const std::string who = "sequence " + std::to_string(s->id);
    if (!s->is_finished() || s->aborted || s->token_times.empty() ||
        s->token_times.size() != s->generated.size() || s->first_scheduled_time < 0)
      throw Error(ErrorKind::kInvalidArgument, who, "is not a finished sequence with timestamps");
    const auto& t = s->token_times;
    ttft.push_back(t.front() - s->arrival_time);
    e2e.push_back(t.back() - s->arrival_time);
    delay.push_back(s->first_scheduled_time - s->arrival_time);
    for (size_t i = 1; i < t.size(); ++i) {
      if (t[i] < t[i - 1]) throw Error(ErrorKind::kInvalidArgument, who, "token times decrease");
      m.tbt_samples.push_back(t[i] - t[i - 1]);
    }
    if (t.size() > 1) tpot.push_back((t.back() - t.front()) / static_cast<double>(t.size() - 1));
    m.output_tokens += static_cast<int64_t>(t.size());
    m.preemptions += s->num_preemptions;
    first_arrival = std::min(first_arrival, s->arrival_time);
    last_finish = std::max(last_finish, t.back());
  }
  m.num_requests = static_cast<int64_t>(finished.size());
  m.ttft = summarize(ttft);
  m.tbt = summarize(m.tbt_samples);
  m.tpot = summarize(tpot);
  m.e2e = summarize(e2e);
  m.sched_delay = summarize(delay);
  if (!finished.empty()) {
    m.duration_s = last_finish - first_arrival;
    if (m.duration_s > 0) {
      m.request_throughput = static_cast<double>(m.num_requests) / m.duration_s;
      m.token_throughput = static_cast<double>(m.output_tokens) / m.duration_s;
    }
  }
  return m;
}

}  // namespace flashserve::serve
