// check_capacity_span: a capacity run must last 2 x the P50 scheduling-delay bound / the
// resolution, or a backlog cannot show in it (serve/capacity.h says why).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flashserve/error.h"
#include "serve/capacity.h"

namespace fs = flashserve::serve;
using flashserve::Error;

namespace {

// n requests at `rate`, evenly spaced from t = 0 (i / rate: exact for these rates).
std::vector<fs::Request> even(int64_t n, double rate) {
  std::vector<fs::Request> r;
  for (int64_t i = 0; i < n; ++i) r.push_back({i, static_cast<double>(i) / rate, 100, 100});
  return r;
}

std::string refusal(const std::vector<fs::Request>& reqs, double rate, double bound, double res) {
  try {
    fs::check_capacity_span(reqs, rate, bound, res);
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "requests");
    return e.what();
  }
  return "accepted";
}

// The issue's run: 120 requests at 36 req/s arrive over 3.3 s; with the 2 s bound and a 10%
// resolution a run needs 40 s of arrivals, 1441 requests at that rate.
TEST(CapacitySpan, RefusesTheIssuesThreeSecondBurst) {
  const std::string why = refusal(even(120, 36), 36, 2.0, 0.1);
  EXPECT_NE(why.find("120 requests at 36.000 req/s arrive over 3.3 s"), std::string::npos) << why;
  EXPECT_NE(why.find("40.0 s"), std::string::npos) << why;
  EXPECT_NE(why.find("at least 1441 requests"), std::string::npos) << why;
  EXPECT_EQ(refusal(even(1441, 36), 36, 2.0, 0.1), "accepted");  // 1440 / 36 = 40 s exactly
}

// Bound 1 s, resolution 0.5: 2 x 1 / 0.5 = 4 s. At 10 req/s, 41 requests span exactly 4 s.
TEST(CapacitySpan, TheBoundaryIsTwiceTheDelayBoundOverTheResolution) {
  EXPECT_EQ(refusal(even(41, 10), 10, 1.0, 0.5), "accepted");
  const std::string why = refusal(even(40, 10), 10, 1.0, 0.5);  // 3.9 s
  EXPECT_NE(why.find("at least 41 requests"), std::string::npos) << why;
  // A finer resolution or a looser bound needs a longer run: 8 s either way.
  EXPECT_NE(refusal(even(41, 10), 10, 1.0, 0.25), "accepted");
  EXPECT_NE(refusal(even(41, 10), 10, 2.0, 0.5), "accepted");
  EXPECT_EQ(refusal(even(81, 10), 10, 2.0, 0.5), "accepted");
}

// The span is the arrivals' own (a trace need not be sorted, nor start at 0).
TEST(CapacitySpan, MeasuresTheArrivalsThemselves) {
  std::vector<fs::Request> r = even(41, 10);
  for (auto& q : r) q.arrival_s += 100;
  std::swap(r.front(), r.back());
  EXPECT_EQ(refusal(r, 10, 1.0, 0.5), "accepted");
  EXPECT_NE(refusal({r.front()}, 10, 1.0, 0.5), "accepted");  // one request spans nothing
}

TEST(CapacitySpan, BadArgumentsAreNamed) {
  for (double res : {0.0, 1.0, -0.1}) {
    try {
      fs::check_capacity_span(even(10, 1), 1, 1, res);
      ADD_FAILURE() << "accepted resolution " << res;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "resolution");
    }
  }
  EXPECT_THROW(fs::check_capacity_span(even(10, 1), 0, 1, 0.1), Error);
}

}  // namespace
