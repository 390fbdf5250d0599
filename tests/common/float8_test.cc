// float8_e4m3fn (common/float8.h): every one of the 256 codes decodes to the format's definition
// written independently in float64, every finite code round-trips, and the encoder rounds to the
// nearest code with ties to even (both saturation modes) against a float64 search over the codes:
// at every midpoint between neighbours, one float on either side of it, every code itself and
// random floats of every magnitude. Where CUDA's cuda_fp8.h is on the host (its conversions are
// host-callable), the encoder and decoder are bit-equal to __nv_cvt_float_to_fp8 /
// __nv_cvt_fp8_to_halfraw on the same inputs and on random bit patterns.
#include "common/float8.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#if defined(FLASHSERVE_HAVE_CUDA_FP8_H)
#include <cuda_fp8.h>
#endif

namespace flashserve {
namespace {

// The value of code b from the format's definition (S.EEEE.MMM, bias 7, S.1111.111 NaN).
double e4m3_definition(int b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return s ? -v : v;
}

// The code to_e4m3 must give for x, found by searching the 127 non-negative finite codes in
// float64: the nearest, ties to the even code (mantissa LSB 0); past 448 per `sat`.
int reference_encode(float xf, Fp8Saturation sat) {
  const double x = xf;
  if (std::isnan(x)) return -1;  // any NaN code
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  // 464 is the midpoint between 448 and 480 (the would-be next code, which is NaN): it ties to
  // 448's even code; anything larger overflows.
  if (a > 464.0 || std::isinf(a)) return sign | (sat == Fp8Saturation::kFinite ? 0x7e : 0x7f);
  int best = 0;
  double best_err = a;
  for (int c = 1; c <= 0x7e; ++c) {
    const double err = std::fabs(e4m3_definition(c) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) best = c, best_err = err;
  }
  return sign | best;
}

bool is_nan_code(uint8_t b) {
  return (b & 0x7f) == 0x7f;
}

// The inputs every encoder check runs over: each code, each midpoint between neighbouring codes
// and one float either side of it, the range edges, and random floats (log-uniform magnitude in
// [2^-14, 2^10], random sign), for both signs.
std::vector<float> encoder_inputs(uint64_t seed) {
  std::vector<float> xs;
  for (int c = 0; c <= 0x7e; ++c) {
    const float v = static_cast<float>(e4m3_definition(c));
    const float next = c < 0x7e ? static_cast<float>(e4m3_definition(c + 1)) : 480.0f;
    const float mid = (v + next) / 2;  // exact: at most 5 significant bits
    for (float x : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)})
      xs.insert(xs.end(), {x, -x});
  }
  for (float x : {448.0f, 464.0f, 465.0f, 480.0f, 1e4f, 3.4e38f, std::ldexp(1.0f, -10),
                  std::ldexp(1.0f, -126), std::ldexp(1.0f, -149), 0.0f,
                  std::numeric_limits<float>::infinity()})
    xs.insert(xs.end(), {x, -x});
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log2mag(-14.0, 10.0);
  for (int i = 0; i < 100000; ++i) {
    const float x = static_cast<float>(std::exp2(log2mag(rng)));
    xs.push_back(rng() & 1 ? -x : x);
  }
  return xs;
}

uint64_t logged_seed() {
  const uint64_t seed = std::random_device{}();
  std::cout << "seed " << seed << "\n";
  return seed;
}

TEST(Float8, EveryCodeDecodesToTheDefinition) {
  for (int b = 0; b < 256; ++b) {
    const double want = e4m3_definition(b);
    const float got = to_float(fp8_e4m3_t{static_cast<uint8_t>(b)});
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << b;
      EXPECT_TRUE(is_nan_code(static_cast<uint8_t>(b)));
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "code " << b;
      EXPECT_EQ(std::signbit(got), b >= 128) << "code " << b;  // -0 is 0x80
    }
  }
  EXPECT_EQ(to_float(fp8_e4m3_t{0x7e}), kE4m3Max);
  EXPECT_EQ(to_float(fp8_e4m3_t{0x01}), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(to_float(fp8_e4m3_t{0x08}), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(to_float(fp8_e4m3_t{0x07}), std::ldexp(7.0f, -9));  // largest subnormal
}

TEST(Float8, EveryFiniteCodeRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    if (is_nan_code(static_cast<uint8_t>(b))) continue;
    const float v = to_float(fp8_e4m3_t{static_cast<uint8_t>(b)});
    for (Fp8Saturation sat : {Fp8Saturation::kFinite, Fp8Saturation::kNone})
      EXPECT_EQ(to_e4m3(v, sat).bits, b) << "code " << b;
  }
}

TEST(Float8, KnownRoundings) {
  EXPECT_EQ(to_e4m3(1.0f).bits, 0x38);
  EXPECT_EQ(to_e4m3(1.0625f).bits, 0x38);  // halfway 1 -> 1.125: ties to even (1)
  EXPECT_EQ(to_e4m3(1.1875f).bits, 0x3a);  // halfway 1.125 -> 1.25: ties to even (1.25)
  EXPECT_EQ(to_e4m3(1.07f).bits, 0x39);    // past halfway: up
  EXPECT_EQ(to_e4m3(std::ldexp(1.0f, -10)).bits, 0x00);   // half the smallest subnormal: to 0
  EXPECT_EQ(to_e4m3(std::ldexp(3.0f, -10)).bits, 0x02);   // 1.5 units: ties to even (2)
  EXPECT_EQ(to_e4m3(std::ldexp(15.0f, -10)).bits, 0x08);  // 7.5 units: up to the smallest normal
  EXPECT_EQ(to_e4m3(-0.0f).bits, 0x80);
  EXPECT_EQ(to_e4m3(464.0f).bits, 0x7e);  // ties to 448
  EXPECT_EQ(to_e4m3(465.0f).bits, 0x7e);
  EXPECT_EQ(to_e4m3(465.0f, Fp8Saturation::kNone).bits, 0x7f);
  EXPECT_EQ(to_e4m3(-1e30f).bits, 0xfe);
  EXPECT_EQ(to_e4m3(-std::numeric_limits<float>::infinity()).bits, 0xfe);
  EXPECT_EQ(to_e4m3(std::numeric_limits<float>::infinity(), Fp8Saturation::kNone).bits, 0x7f);
  EXPECT_TRUE(is_nan_code(to_e4m3(std::numeric_limits<float>::quiet_NaN()).bits));
  EXPECT_TRUE(is_nan_code(to_e4m3(std::bit_cast<float>(0x7f800001u)).bits));  // signalling NaN
}

TEST(Float8, RoundsToNearestEvenAgainstAFloat64Search) {
  const std::vector<float> xs = encoder_inputs(logged_seed());
  for (Fp8Saturation sat : {Fp8Saturation::kFinite, Fp8Saturation::kNone})
    for (float x : xs) {
      const int want = reference_encode(x, sat);
      const uint8_t got = to_e4m3(x, sat).bits;
      ASSERT_EQ(got, want) << "x = " << x << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(x)
                           << "), saturation " << (sat == Fp8Saturation::kFinite);
    }
}

// The relative error of a normal-range value is at most 2^-4 (half of a 3-bit mantissa's ulp),
// the absolute error of a subnormal one at most 2^-10: the bounds the fp8 tolerances build on.
TEST(Float8, RoundingErrorBounds) {
  std::mt19937_64 rng(logged_seed());
  std::uniform_real_distribution<double> log2mag(-12.0, 8.8);
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>(std::exp2(log2mag(rng)));
    const double err = std::fabs(static_cast<double>(round_to_e4m3(x)) - x);
    if (x >= std::ldexp(1.0f, -6))
      ASSERT_LE(err, std::ldexp(x, -4)) << x;
    else
      ASSERT_LE(err, std::ldexp(1.0, -10)) << x;
  }
}

#if defined(FLASHSERVE_HAVE_CUDA_FP8_H)
TEST(Float8, BitEqualToCudaConversions) {
  for (int b = 0; b < 256; ++b) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
    const float cuda = __half2float(__half(h));
    const float ours = to_float(fp8_e4m3_t{static_cast<uint8_t>(b)});
    if (std::isnan(cuda))
      EXPECT_TRUE(std::isnan(ours)) << "code " << b;
    else
      EXPECT_EQ(std::bit_cast<uint32_t>(ours), std::bit_cast<uint32_t>(cuda)) << "code " << b;
  }
  const uint64_t seed = logged_seed();
  std::vector<float> xs = encoder_inputs(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int i = 0; i < 1000000; ++i)
    xs.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (float nan : {std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0xffc00000u),
                    std::bit_cast<float>(0x7f800001u)})
    xs.push_back(nan);
  const std::pair<Fp8Saturation, __nv_saturation_t> modes[] = {
      {Fp8Saturation::kFinite, __NV_SATFINITE}, {Fp8Saturation::kNone, __NV_NOSAT}};
  for (const auto& [ours, theirs] : modes)
    for (float x : xs) {
      const uint8_t want = __nv_cvt_float_to_fp8(x, theirs, __NV_E4M3);
      ASSERT_EQ(to_e4m3(x, ours).bits, want)
          << "x = " << x << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(x) << ")";
    }
}
#else
TEST(Float8, BitEqualToCudaConversions) {
  GTEST_SKIP() << "cuda_fp8.h is not on this host's include path";
}
#endif

}  // namespace
}  // namespace flashserve
