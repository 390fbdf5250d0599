// sm90/exp2_poly.h, the softmax's 2^x on the FMA pipe (FLASHSERVE_SM90_EXP2_FMA), evaluated on
// the host by the same code the kernel runs, against std::exp2 in double: its relative error
// within ex2.approx.ftz.f32's (~2^-22, 2 ulp) over every input the softmax sees (x <= 0 down to
// where 2^x leaves the normal range, and the lazy rescale's x <= 8), and ex2.approx.ftz's edges:
// 0 below 2^-126, for -inf and for very negative x; NaN for NaN; exact powers of two.
#include "attention/sm90/exp2_poly.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

namespace flashserve::attention::sm90 {
namespace {

// The polynomial measured 2^-23.5 (1.01 ulp) over every f it can see (scripts/exp2_poly_fit.py);
// the bound leaves room for nothing more than that, and stays a factor 2 under ex2.approx's.
constexpr double kMaxRelError = 0x1p-23;

float from_bits(uint32_t b) {
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

struct Worst {
  double rel = 0.0;
  float at = 0.0f;
  void add(float x) {
    const double exact = std::exp2(static_cast<double>(x));
    const double rel_err = std::fabs(static_cast<double>(exp2_poly(x)) - exact) / exact;
    if (!(rel_err <= rel)) rel = rel_err, at = x;  // a NaN result counts as the worst
  }
};

// x = -126 and above: 2^x is a normal float. A dense grid over the whole range (every f on a
// grid of 2^-12 at every integer part), every float in [-1.5, 0] near the polynomial's worst
// points and near 0 in 2^16 random samples, and 2^20 random floats by their bit patterns (so
// small |x| as often as large).
TEST(Exp2Poly, RelativeErrorWithinEx2ApproxOverTheSoftmaxRange) {
  Worst w;
  for (int64_t i = 0; i <= int64_t{126} * 4096; ++i) w.add(-static_cast<float>(i) / 4096.0f);
  for (int64_t i = 1; i <= int64_t{8} * 4096; ++i) w.add(static_cast<float>(i) / 4096.0f);
  std::mt19937 rng(2026);
  std::uniform_real_distribution<float> near(-1.5f, 0.0f);
  for (int i = 0; i < (1 << 16); ++i) w.add(near(rng));
  // Negative floats from -0 (0x80000000) to -126 (0xc2fc0000), by their encodings.
  std::uniform_int_distribution<uint32_t> bits(0x80000000u, 0xc2fc0000u);
  for (int i = 0; i < (1 << 20); ++i) w.add(from_bits(bits(rng)));
  EXPECT_LE(w.rel, kMaxRelError) << "at x = " << w.at << " (2^" << std::log2(w.rel) << ")";
}

// The polynomial's error depends on f = x - round(x) only; every float f in [-1/2, 1/2] that a
// float x can give is an x in [-1/2, 1/2] itself or on the 2^-24 grid: all of the grid.
TEST(Exp2Poly, RelativeErrorOnEveryFractionOfTheGrid) {
  Worst w;
  for (int64_t i = -(int64_t{1} << 23); i <= (int64_t{1} << 23); ++i)
    w.add(std::ldexp(static_cast<float>(i), -24));
  EXPECT_LE(w.rel, kMaxRelError) << "at f = " << w.at << " (2^" << std::log2(w.rel) << ")";
}

// Integers are exact (the constant term is 1): 2^0 = 1 as ex2.approx gives it, the row's
// largest score weighs exactly 1, and 2^-126 is the smallest result.
TEST(Exp2Poly, IntegersArePowersOfTwo) {
  for (int j = -126; j <= 8; ++j)
    EXPECT_EQ(exp2_poly(static_cast<float>(j)), std::ldexp(1.0f, j)) << j;
  EXPECT_EQ(exp2_poly(-0.0f), 1.0f);
  EXPECT_EQ(exp2_poly(-126.0f), FLT_MIN);
}

// Below -126 the result would be subnormal: +0 exactly, as ex2.approx.ftz gives (and as masked
// scores, -inf, need: they weigh nothing). Every float in (-127, -126) near the edge, a grid
// down to -200, and the far end.
TEST(Exp2Poly, FlushesToZeroBelowTheNormalRange) {
  const auto zero = [](float x) {
    const float y = exp2_poly(x);
    return y == 0.0f && !std::signbit(y);
  };
  for (float x = std::nextafter(-126.0f, -200.0f); x > -126.01f; x = std::nextafter(x, -200.0f))
    EXPECT_TRUE(zero(x)) << x << " -> " << exp2_poly(x);
  for (int i = 0; i < 74 * 1024; ++i) {
    const float x = -126.001f - static_cast<float>(i) / 1024.0f;
    EXPECT_TRUE(zero(x)) << x << " -> " << exp2_poly(x);
  }
  for (float x : {-1e4f, -1e30f, -FLT_MAX, -std::numeric_limits<float>::infinity()})
    EXPECT_TRUE(zero(x)) << x << " -> " << exp2_poly(x);
}

// A NaN score leaves its row NaN (issue 9's rule), as ex2.approx's NaN does.
TEST(Exp2Poly, NanStaysNan) {
  EXPECT_TRUE(std::isnan(exp2_poly(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(exp2_poly(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(exp2_poly(from_bits(0x7fa00001u))));  // a signalling payload
}

}  // namespace
}  // namespace flashserve::attention::sm90
