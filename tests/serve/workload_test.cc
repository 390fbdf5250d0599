// Workloads: reproducibility, the arrival processes' statistics, the length distributions'
// quantiles, clipping to the model length, rate scaling, and the CSV trace reader's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "flashserve/error.h"
#include "serve/metrics.h"
#include "serve/workload.h"

namespace fs = flashserve::serve;
using flashserve::Error;

namespace {

std::vector<double> gaps_of(const std::vector<fs::Request>& r) {
  std::vector<double> g;
  double prev = 0;
  for (const auto& x : r) g.push_back(x.arrival_s - prev), prev = x.arrival_s;
  return g;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}
double cv(const std::vector<double>& v) {
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1)) / m;
}

TEST(Workload, SameSeedSameWorkloadOtherSeedOther) {
  fs::WorkloadSpec spec;
  spec.num_requests = 200;
  spec.seed = 5;
  const auto a = fs::generate_workload(spec), b = fs::generate_workload(spec);
  spec.seed = 6;
  const auto c = fs::generate_workload(spec);
  ASSERT_EQ(a.size(), 200u);
  int diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
    EXPECT_EQ(a[i].prompt_tokens, b[i].prompt_tokens);
    EXPECT_EQ(a[i].output_tokens, b[i].output_tokens);
    diff += a[i].prompt_tokens != c[i].prompt_tokens;
  }
  EXPECT_GT(diff, 150);
}

TEST(Workload, PoissonGapsHaveMeanOneOverRateAndUnitCv) {
  fs::WorkloadSpec spec;
  spec.num_requests = 40000;
  spec.rate = 4.0;
  spec.seed = 11;
  const auto g = gaps_of(fs::generate_workload(spec));
  // Standard error of the mean gap is 0.25 / sqrt(40000) = 0.00125: 4 sigma = 0.005.
  EXPECT_NEAR(mean(g), 0.25, 0.005);
  EXPECT_NEAR(cv(g), 1.0, 0.03);
  for (double x : g) ASSERT_GT(x, 0);
}

TEST(Workload, GammaArrivalsHaveTheRequestedBurstiness) {
  for (double want_cv : {0.5, 3.0}) {
    fs::WorkloadSpec spec;
    spec.num_requests = 60000;
    spec.rate = 2.0;
    spec.arrival = fs::ArrivalKind::kGamma;
    spec.cv = want_cv;
    spec.seed = 3;
    const auto g = gaps_of(fs::generate_workload(spec));
    EXPECT_NEAR(mean(g), 0.5, 0.5 * want_cv * 4 / std::sqrt(60000.0));
    EXPECT_NEAR(cv(g), want_cv, 0.06 * want_cv);
  }
}

TEST(Workload, ChangingTheRateOnlyScalesTheArrivals) {
  fs::WorkloadSpec spec;
  spec.num_requests = 300;
  spec.rate = 1.0;
  spec.arrival = fs::ArrivalKind::kGamma;
  spec.cv = 2.0;
  const auto a = fs::generate_workload(spec);
  spec.rate = 8.0;
  const auto b = fs::generate_workload(spec);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i].arrival_s, a[i].arrival_s / 8.0, 1e-9 * a[i].arrival_s);
    EXPECT_EQ(a[i].prompt_tokens, b[i].prompt_tokens);
  }
  const auto c = fs::scale_arrivals(a, 0.5);
  EXPECT_NEAR(fs::mean_rate(c), 2 * fs::mean_rate(a), 1e-9);
}

TEST(Workload, BuiltInLengthsMatchThePapersQuantiles) {
  struct Want {
    fs::LengthKind kind;
    double pm, p90, om, o90;
  };
  for (Want w : {Want{fs::LengthKind::kChat, 1730, 5696, 415, 834},
                 Want{fs::LengthKind::kSummarize, 7059, 12985, 208, 371}}) {
    fs::WorkloadSpec spec;
    spec.lengths = w.kind;
    spec.num_requests = 20000;
    spec.max_model_len = 1 << 20;  // no clipping, to see the distribution itself
    spec.seed = 21;
    std::vector<double> p, o;
    for (const auto& r : fs::generate_workload(spec)) {
      p.push_back(static_cast<double>(r.prompt_tokens));
      o.push_back(static_cast<double>(r.output_tokens));
    }
    EXPECT_NEAR(fs::percentile(p, 50) / w.pm, 1.0, 0.03);
    EXPECT_NEAR(fs::percentile(p, 90) / w.p90, 1.0, 0.04);
    EXPECT_NEAR(fs::percentile(o, 50) / w.om, 1.0, 0.03);
    EXPECT_NEAR(fs::percentile(o, 90) / w.o90, 1.0, 0.04);
  }
}

TEST(Workload, LengthsAreClippedToTheModel) {
  fs::WorkloadSpec spec;
  spec.lengths = fs::LengthKind::kSummarize;
  spec.num_requests = 3000;
  spec.max_model_len = 4096;
  int clipped = 0;
  for (const auto& r : fs::generate_workload(spec)) {
    ASSERT_GE(r.prompt_tokens, 1);
    ASSERT_GE(r.output_tokens, 1);
    ASSERT_LE(r.prompt_tokens + r.output_tokens, 4096);
    clipped += r.prompt_tokens + r.output_tokens == 4096;
  }
  EXPECT_GT(clipped, 1000);  // most summarisation prompts are longer than 4096
}

TEST(Workload, FixedLengths) {
  fs::WorkloadSpec spec;
  spec.lengths = fs::LengthKind::kFixed;
  spec.fixed_prompt = 77;
  spec.fixed_output = 9;
  spec.num_requests = 10;
  for (const auto& r : fs::generate_workload(spec)) {
    EXPECT_EQ(r.prompt_tokens, 77);
    EXPECT_EQ(r.output_tokens, 9);
  }
  spec.fixed_prompt = spec.max_model_len;
  EXPECT_THROW(fs::generate_workload(spec), Error);
}

TEST(Workload, BadSpecsNameTheField) {
  auto field = [](fs::WorkloadSpec s) {
    try {
      fs::generate_workload(s);
    } catch (const Error& e) {
      return e.argument();
    }
    return std::string("accepted");
  };
  fs::WorkloadSpec s;
  s.rate = 0;
  EXPECT_EQ(field(s), "rate");
  s = {};
  s.num_requests = 0;
  EXPECT_EQ(field(s), "num_requests");
  s = {};
  s.cv = -1;
  EXPECT_EQ(field(s), "cv");
  EXPECT_THROW(fs::parse_length_kind("code"), Error);
  EXPECT_THROW(fs::parse_arrival_kind("uniform"), Error);
}

TEST(Trace, ReadsHeaderCommentsAndRows) {
  std::istringstream in(
      "arrival_s,prompt_tokens,output_tokens\n# a "
      "comment\n0.0,100,10\n0.5,2000,3\r\n\n1.25,7,70\n");
  const auto r = fs::read_trace(in, "t.csv");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[1].prompt_tokens, 2000);
  EXPECT_EQ(r[1].output_tokens, 3);
  EXPECT_DOUBLE_EQ(r[2].arrival_s, 1.25);
  EXPECT_EQ(r[2].id, 2);
  EXPECT_NEAR(fs::mean_rate(r), 2 / 1.25, 1e-12);
  // A header after leading comments, and blanks around the cells.
  std::istringstream in2(
      "# made by hand\narrival_s, prompt_tokens, output_tokens\n 0.25 , 31 ,4\n");
  const auto r2 = fs::read_trace(in2, "t2.csv");
  ASSERT_EQ(r2.size(), 1u);
  EXPECT_DOUBLE_EQ(r2[0].arrival_s, 0.25);
  EXPECT_EQ(r2[0].prompt_tokens, 31);
  EXPECT_EQ(r2[0].output_tokens, 4);
}

TEST(Trace, ErrorsNameTheLine) {
  auto err = [](const std::string& text) {
    std::istringstream in(text);
    try {
      fs::read_trace(in, "t.csv");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(err("0,10,1\n1,10\n").find("t.csv:2"), std::string::npos);
  EXPECT_NE(err("1,10,1\n0.5,10,1\n").find("decreases"), std::string::npos);
  EXPECT_NE(err("0,ten,1\n").find("not numbers"), std::string::npos);
  EXPECT_NE(err("0,0,1\n").find("prompt_tokens"), std::string::npos);
  EXPECT_NE(err("0,5,0\n").find("output_tokens"), std::string::npos);
  EXPECT_NE(err("").find("no requests"), std::string::npos);
  // A cell must be its number and nothing more: no silent truncation to 100 or 1.5.
  EXPECT_NE(err("0,100.9,10\n").find("t.csv:1: not numbers"), std::string::npos);
  EXPECT_NE(err("0,100,10x\n").find("not numbers"), std::string::npos);
  EXPECT_NE(err("0,1e3,10\n").find("not numbers"), std::string::npos);
  EXPECT_NE(err("1.5s,100,10\n").find("not numbers"), std::string::npos);
  EXPECT_NE(err("0,,10\n").find("not numbers"), std::string::npos);
  // A malformed first row is an error, not a header to skip; a header is only the first line.
  EXPECT_NE(err(",100,10\n1,100,10\n").find("t.csv:1: not numbers"), std::string::npos);
  EXPECT_NE(err("abc,1,2\n1,100,10\n").find("t.csv:1: not numbers"), std::string::npos);
  EXPECT_NE(err("0,1,2\narrival_s,prompt_tokens,output_tokens\n").find("t.csv:2"),
            std::string::npos);
  EXPECT_NE(err("nan,1,2\n").find("arrival_s must be >= 0"), std::string::npos);
  EXPECT_THROW(fs::load_trace("/nonexistent/trace.csv"), Error);
  // Sizes that would overflow int64 sums downstream, or that no int32 position can hold (issue 9:
  // signed overflow under UBSan), are refused here, naming the column.
  EXPECT_NE(err("0,99999999999999999999,1\n")
                .find("prompt_tokens '99999999999999999999' is out of range"),
            std::string::npos);
  EXPECT_NE(err("0,9223372036854775807,1\n").find("prompt_tokens must be in [1, 2147483647]"),
            std::string::npos);
  EXPECT_NE(err("0,1,2147483648\n").find("output_tokens must be in [1, 2147483647]"),
            std::string::npos);
  EXPECT_NE(err("1e999,1,2\n").find("arrival_s '1e999' is out of range"), std::string::npos);
  std::istringstream edge("0,2147483647,2147483647\n");
  EXPECT_EQ(fs::read_trace(edge, "edge.csv")[0].prompt_tokens, 2147483647);
}

// Gamma arrivals at an extreme coefficient of variation: the sampler's shape 1/cv^2 overflowed to
// inf at cv = 1e-160 and Marsaglia-Tsang never accepted (a hang); now out-of-range cvs are refused
// and the range's ends sample in finite time with the asked-for mean.
TEST(Workload, GammaCvIsBoundedAndItsEndsTerminate) {
  fs::WorkloadSpec s;
  s.arrival = fs::ArrivalKind::kGamma;
  s.num_requests = 2000;
  s.rate = 4;
  for (double bad : {1e-160, 0.0099, 100.01, 1e300}) {
    s.cv = bad;
    try {
      fs::generate_workload(s);
      ADD_FAILURE() << "cv " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "cv");
    }
  }
  for (double cv : {fs::kMinGammaCv, fs::kMaxGammaCv}) {
    s.cv = cv;
    const auto w = fs::generate_workload(s);
    ASSERT_EQ(static_cast<int64_t>(w.size()), s.num_requests);
    EXPECT_TRUE(std::isfinite(w.back().arrival_s));
    if (cv == fs::kMinGammaCv)  // nearly regular gaps of 1/rate
      EXPECT_NEAR(w.back().arrival_s / s.num_requests, 0.25, 0.25 * 0.01);
  }
  s.cv = 1;
  s.num_requests = fs::kMaxGeneratedRequests + 1;
  try {
    fs::generate_workload(s);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "num_requests");
  }
}

TEST(Rng, GammaMatchesItsMoments) {
  fs::Rng rng(99);
  for (double shape : {0.3, 1.0, 4.5}) {
    const double scale = 2.0;
    double s = 0, s2 = 0;
    const int n = 100000;
    for (int i = 0; i < n; ++i) {
      const double x = rng.gamma(shape, scale);
      ASSERT_GT(x, 0);
      s += x, s2 += x * x;
    }
    const double m = s / n, var = s2 / n - m * m;
    EXPECT_NEAR(m / (shape * scale), 1.0, 0.02) << shape;
    EXPECT_NEAR(var / (shape * scale * scale), 1.0, 0.06) << shape;
  }
}

}  // namespace
