// Capacity, bisected with the simulator and confirmed by runs just below and just above it, on a
// synthetic cost model whose capacity is known in closed form: one request at a time (max_running
// 1), every step tau seconds, requests of `out` tokens arriving every 1/rate seconds exactly.
// A request takes out steps, so above 1/(out tau) the queue grows and request k waits
// k (out tau - 1/rate); the median over k = 0 .. n-1 is (n - 1)/2 of that, and P50 scheduling
// delay <= D holds exactly up to rate* = 1 / (out tau - 2 D / (n - 1)). TBT is tau throughout.
#include <gtest/gtest.h>

#include <vector>

#include "engine/simulator.h"
#include "flashserve/error.h"
#include "serve/capacity.h"
#include "serve/cost_model.h"

namespace fe = flashserve::engine;
namespace fs = flashserve::serve;

namespace {

struct Constant final : fs::CostModel {
  double tau;
  explicit Constant(double t) : tau(t) {}
  double step_seconds(const fs::Batch&) const override { return tau; }
  std::string describe() const override { return "constant"; }
};

constexpr int64_t kRequests = 101, kOut = 10;
constexpr double kTau = 0.01, kDelay = 2.0;

std::vector<fs::Request> evenly(double rate) {
  std::vector<fs::Request> r;
  for (int64_t k = 0; k < kRequests; ++k) r.push_back({k, static_cast<double>(k) / rate, 8, kOut});
  return r;
}

fe::SimConfig one_at_a_time() {
  fe::SimConfig c;
  c.scheduler.policy = fs::Policy::kSarathi;
  c.scheduler.max_running = 1;
  c.scheduler.max_tokens_per_step = 64;
  c.scheduler.max_model_len = 256;
  c.num_blocks = 256;
  return c;
}

fs::ServingMetrics run(const Constant& cost, double rate) {
  return fe::simulate(evenly(rate), one_at_a_time(), cost).metrics;
}

TEST(CapacityConfirm, BisectionFindsTheKnownThresholdAndRunsAroundItConfirmIt) {
  const double known = 1.0 / (kOut * kTau - 2 * kDelay / (kRequests - 1));  // 16.67 req/s
  const Constant model(kTau);
  const fs::CapacityCriteria crit{2 * kTau, kDelay};
  // The closed form holds: just below passes, just above fails.
  EXPECT_TRUE(crit.met_by(run(model, known * 0.99)));
  EXPECT_FALSE(crit.met_by(run(model, known * 1.01)));
  const fs::CapacityResult cap =
      fs::find_capacity([&](double r) { return run(model, r); }, crit, 1.0);
  EXPECT_FALSE(cap.at_limit);
  EXPECT_LE(cap.capacity, known * (1 + 1e-9));
  EXPECT_GE(cap.capacity, known * 0.98);  // the search stops within 2% of the bracket's top

  // Confirmed by an engine that behaves as predicted...
  const fs::CapacityConfirmation same = fs::confirm_capacity(
      cap.capacity, [&](double r) { return run(model, r); }, crit, 0.1);
  EXPECT_TRUE(same.below.ok);
  EXPECT_FALSE(same.above.ok);
  EXPECT_TRUE(same.confirmed());
  EXPECT_NEAR(same.below.rate, cap.capacity * 0.9, 1e-12);
  EXPECT_NEAR(same.above.rate, cap.capacity * 1.1, 1e-12);
  // ...and not by one 30% slower (its capacity is below the predicted x 0.9)...
  const Constant slower(kTau * 1.3);
  EXPECT_FALSE(fs::confirm_capacity(
                   cap.capacity, [&](double r) { return run(slower, r); }, crit, 0.1)
                   .confirmed());
  // ...nor by one 30% faster (it still passes at x 1.1).
  const Constant faster(kTau / 1.3);
  const fs::CapacityConfirmation fast = fs::confirm_capacity(
      cap.capacity, [&](double r) { return run(faster, r); }, crit, 0.1);
  EXPECT_TRUE(fast.below.ok);
  EXPECT_TRUE(fast.above.ok);
  EXPECT_FALSE(fast.confirmed());
  EXPECT_THROW(fs::confirm_capacity(
                   0, [&](double r) { return run(model, r); }, crit),
               flashserve::Error);
}

}  // namespace
