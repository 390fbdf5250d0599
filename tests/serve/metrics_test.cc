// Metrics: percentiles against a direct reference, and TTFT/TBT/TPOT/E2E/scheduling delay on
// hand-built timelines.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "flashserve/error.h"
#include "serve/metrics.h"

namespace fs = flashserve::serve;
using flashserve::Error;

namespace {

// The textbook definition: rank q/100 * (n-1) in the sorted values, linear between neighbours.
double ref_percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double r = q / 100 * (v.size() - 1);
  const size_t i = static_cast<size_t>(r);
  if (i + 1 >= v.size()) return v.back();
  return v[i] * (1 - (r - i)) + v[i + 1] * (r - i);
}

TEST(Metrics, PercentilesMatchTheDefinition) {
  EXPECT_DOUBLE_EQ(fs::percentile({3, 1, 2, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(fs::percentile({10}, 99), 10);
  EXPECT_DOUBLE_EQ(fs::percentile({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 90), 10);
  std::mt19937_64 rng(7);
  for (int t = 0; t < 200; ++t) {
    std::vector<double> v(1 + rng() % 300);
    for (auto& x : v) x = std::exponential_distribution<double>(3.0)(rng);
    for (double q : {0.0, 50.0, 90.0, 99.0, 100.0})
      EXPECT_NEAR(fs::percentile(v, q), ref_percentile(v, q), 1e-12);
    const fs::Summary s = fs::summarize(v);
    EXPECT_NEAR(s.p50, ref_percentile(v, 50), 1e-12);
    EXPECT_NEAR(s.p90, ref_percentile(v, 90), 1e-12);
    EXPECT_NEAR(s.p99, ref_percentile(v, 99), 1e-12);
    double sum = 0;
    for (double x : v) sum += x;
    EXPECT_NEAR(s.mean, sum / v.size(), 1e-12);
    EXPECT_EQ(s.max, *std::max_element(v.begin(), v.end()));
  }
  EXPECT_TRUE(std::isnan(fs::percentile({}, 50)));
  EXPECT_THROW(fs::percentile({1.0}, 101), Error);
}

fs::Sequence finished(int64_t id, double arrival, double first_sched, std::vector<double> times) {
  fs::Sequence s;
  s.id = id;
  s.prompt = {1, 2, 3};
  s.arrival_time = arrival;
  s.first_scheduled_time = first_sched;
  s.token_times = times;
  s.generated.assign(times.size(), 9);
  s.max_output_tokens = static_cast<int64_t>(times.size());
  s.state = fs::SeqState::kFinished;
  s.finish_time = times.back();
  return s;
}

TEST(Metrics, TimelineQuantities) {
  const fs::Sequence a = finished(0, 1.0, 1.5, {2.0, 2.1, 2.3, 2.6});
  const fs::Sequence b = finished(1, 2.0, 2.0, {2.5});
  const fs::ServingMetrics m = fs::compute_metrics({&a, &b});
  EXPECT_EQ(m.num_requests, 2);
  EXPECT_EQ(m.output_tokens, 5);
  EXPECT_NEAR(m.ttft.mean, (1.0 + 0.5) / 2, 1e-12);
  ASSERT_EQ(m.tbt_samples.size(), 3u);  // b has one token: no gap
  EXPECT_NEAR(m.tbt.max, 0.3, 1e-12);
  EXPECT_NEAR(m.tbt.p50, 0.2, 1e-12);
  EXPECT_NEAR(m.tpot.mean, 0.6 / 3, 1e-12);  // only a has a TPOT
  EXPECT_EQ(m.tpot.count, 1);
  EXPECT_NEAR(m.e2e.max, 1.6, 1e-12);
  EXPECT_NEAR(m.sched_delay.mean, 0.25, 1e-12);
  EXPECT_NEAR(m.duration_s, 1.6, 1e-12);
  EXPECT_NEAR(m.token_throughput, 5 / 1.6, 1e-12);
  fs::Sequence c = a;
  c.state = fs::SeqState::kRunningDecode;
  EXPECT_THROW(fs::compute_metrics({&c}), Error);
}

}  // namespace
