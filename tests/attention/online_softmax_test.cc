// The online-softmax recurrence (RunningSoftmax, used by the tiled CPU path) equals the textbook
// softmax, whatever the chunking: in double to ~1e-15 and in float to float rounding.
#include "attention/reference/online_softmax.h"
#include "support/worst.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace flashserve::attention {
namespace {

// Streams x through RunningSoftmax in random chunks, accumulating sum_j p_j * y_j the way the
// attention accumulator does; returns (weighted sum / l, lse) and the probabilities.
template <typename T>
void streamed(const std::vector<T>& x, const std::vector<T>& y, std::mt19937_64& rng, T& avg,
              T& lse) {
  RunningSoftmax<T> sm;
  T acc = 0;
  std::vector<T> chunk;
  for (size_t i = 0; i < x.size();) {
    const size_t n = std::min<size_t>(x.size() - i, 1 + rng() % 40);
    chunk.assign(x.begin() + i, x.begin() + i + n);
    acc *= sm.add(chunk.data(), static_cast<int64_t>(n));
    for (size_t j = 0; j < n; ++j) acc += chunk[j] * y[i + j];
    i += n;
  }
  avg = sm.empty() ? T(0) : acc / sm.l;
  lse = sm.lse();
}

// Textbook: p = exp(s - max) / sum, lse = max + log(sum), in long double; x in log2 units.
void textbook(const std::vector<double>& x, const std::vector<double>& y, long double& avg,
              long double& lse) {
  long double m = -INFINITY;
  for (double v : x) m = std::max<long double>(m, v);
  long double sum = 0, acc = 0;
  for (size_t j = 0; j < x.size(); ++j) {
    const long double p = std::exp2(static_cast<long double>(x[j]) - m);
    sum += p;
    acc += p * y[j];
  }
  avg = acc / sum;
  lse = (m + std::log2(sum)) * std::log(2.0L);
}

TEST(OnlineSoftmax, MatchesTextbookInDoubleAndFloat) {
  std::mt19937_64 rng(20261129);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 1 + rng() % 500;
    const double spread = trial % 4 == 0 ? 60.0 : 6.0;  // some rows with huge score ranges
    std::normal_distribution<double> normal(trial % 7 - 3.0, spread);
    std::vector<double> x(n), y(n);
    std::vector<float> xf(n), yf(n);
    for (size_t j = 0; j < n; ++j) {
      xf[j] = static_cast<float>(normal(rng));
      yf[j] = static_cast<float>(normal(rng) / spread);
      x[j] = xf[j];
      y[j] = yf[j];
    }
    long double avg_ref, lse_ref;
    textbook(x, y, avg_ref, lse_ref);
    double avg_d, lse_d;
    streamed(x, y, rng, avg_d, lse_d);
    float avg_f, lse_f;
    streamed(xf, yf, rng, avg_f, lse_f);
    // |avg| <= max|y|; errors are relative to that scale.
    double ymax = 0;
    for (double v : y) ymax = std::max(ymax, std::abs(v));
    EXPECT_NEAR(avg_d, static_cast<double>(avg_ref), 1e-15 * ymax * (1 + std::log2(n)))
        << "trial " << trial;
    EXPECT_NEAR(lse_d, static_cast<double>(lse_ref), 1e-15 * (1 + std::abs(lse_d)) * 4)
        << "trial " << trial;
    EXPECT_NEAR(avg_f, static_cast<double>(avg_ref), 2e-6 * ymax * (1 + std::log2(n)))
        << "trial " << trial;
    EXPECT_NEAR(lse_f, static_cast<double>(lse_ref), 2e-6 * (1 + std::abs(lse_ref)))
        << "trial " << trial;
  }
}

TEST(OnlineSoftmax, Exp2NonPositiveIsAccurateToFloatRounding) {
  // Every float in [-126, 0] with a stride, plus random ones: relative error within 2 ulp.
  double worst = 0;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-126.0f, 0.0f);
  auto check = [&](float x) {
    const double ref = std::exp2(static_cast<double>(x));
    const double got = exp2_nonpositive(x);
    worst = testing::worse(worst, std::abs(got - ref) / ref);
  };
  for (float x = 0.0f; x >= -126.0f; x -= 0.000977f) check(x);
  for (int i = 0; i < 100000; ++i) check(u(rng));
  for (float x : {0.0f, -0.5f, -1.0f, -2.5f, -125.5f, -126.0f}) check(x);
  EXPECT_LE(worst, 2.5e-7);
  EXPECT_EQ(exp2_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp2_nonpositive(-1.0f), 0.5f);
  EXPECT_EQ(exp2_nonpositive(-INFINITY), 0.0f);  // masked keys contribute exactly nothing
  EXPECT_EQ(exp2_nonpositive(-126.5f), 0.0f);
  EXPECT_TRUE(std::isnan(exp2_nonpositive(NAN)));
}

TEST(OnlineSoftmax, MaskedChunksAndEmpty) {
  const float inf = INFINITY;
  RunningSoftmax<float> sm;
  EXPECT_TRUE(sm.empty());
  EXPECT_EQ(sm.lse(), -inf);
  std::vector<float> masked = {-inf, -inf};
  sm.add(masked.data(), 2);  // a chunk with every key masked changes nothing
  EXPECT_TRUE(sm.empty());
  // ...and its probabilities are 0 (they were left at -inf, which P V turned into -inf * v).
  EXPECT_EQ(masked[0], 0.0f);
  EXPECT_EQ(masked[1], 0.0f);
  std::vector<float> x = {1.0f, -inf, 3.0f};
  EXPECT_EQ(sm.add(x.data(), 3), 0.0f);  // nothing accumulated before: factor 0
  EXPECT_EQ(x[1], 0.0f);
  EXPECT_EQ(x[2], 1.0f);
  EXPECT_FLOAT_EQ(x[0], 0.25f);
  std::vector<float> y = {2.0f};  // below the max: no rescale
  EXPECT_EQ(sm.add(y.data(), 1), 1.0f);
  EXPECT_FLOAT_EQ(sm.l, 1.25f + 0.5f);
  std::vector<float> z = {5.0f};  // above: rescale by 2^(3-5)
  EXPECT_EQ(sm.add(z.data(), 1), 0.25f);
  EXPECT_FLOAT_EQ(sm.lse(),
                  std::log(std::exp2(1.0f) + std::exp2(3.0f) + std::exp2(2.0f) + std::exp2(5.0f)));
}

// NaN semantics (issue 9), against PyTorch's softmax: a NaN score anywhere in the row, or a +inf
// one, makes l and the LSE NaN whatever chunk it arrives in; -inf scores are masked keys.
TEST(OnlineSoftmax, NanAndInfinityPoisonTheRow) {
  const float inf = INFINITY, nan = NAN;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (int where = 0; where < 3; ++where)  // the bad chunk first, in the middle, last
    for (float bad : {nan, inf}) {
      for (bool alone : {false, true}) {  // the bad score alone in its chunk, or among finite ones
        RunningSoftmax<float> sm;
        for (int c = 0; c < 3; ++c) {
          std::vector<float> x(alone && c == where ? 1 : 5);
          for (float& v : x) v = normal(rng);
          if (c == where) x[x.size() / 2] = bad;
          sm.add(x.data(), static_cast<int64_t>(x.size()));
        }
        EXPECT_FALSE(sm.empty()) << where << " " << bad << " " << alone;
        EXPECT_TRUE(std::isnan(sm.l)) << where << " " << bad << " " << alone;
        EXPECT_TRUE(std::isnan(sm.lse())) << where << " " << bad << " " << alone;
      }
    }
  // Every score NaN: NaN, not "saw no key".
  RunningSoftmax<float> all_nan;
  std::vector<float> x = {nan, nan};
  EXPECT_TRUE(std::isnan(all_nan.add(x.data(), 2)));  // the rescale factor poisons the output
  EXPECT_TRUE(std::isnan(all_nan.lse()));
  // -inf scores and masked keys only: empty, LSE -inf.
  RunningSoftmax<float> none;
  std::vector<float> y = {-inf, -inf, -inf};
  none.add(y.data(), 3);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(none.lse(), -inf);
}

}  // namespace
}  // namespace flashserve::attention
