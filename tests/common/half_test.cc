// Host fp16/bf16 conversion: round-to-nearest-even on known bit patterns, and exhaustively every
// fp16 value round-trips through float unchanged (NaN stays NaN) and every bf16 value likewise.
#include "common/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace flashserve {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Independent fp16 -> double decoding straight from the IEEE definition.
double fp16_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  double v = exp == 0 ? std::ldexp(man, -24) : std::ldexp(1024 + man, exp - 25);
  if (exp == 31) v = man ? NAN : INFINITY;
  return sign ? -v : v;
}

TEST(Half, Fp16KnownValues) {
  EXPECT_EQ(to_fp16(1.0f).bits, 0x3c00);
  EXPECT_EQ(to_fp16(-2.0f).bits, 0xc000);
  EXPECT_EQ(to_fp16(65504.0f).bits, 0x7bff);                  // largest finite
  EXPECT_EQ(to_fp16(65520.0f).bits, 0x7c00);                  // halfway to 2^16: rounds to inf
  EXPECT_EQ(to_fp16(65519.99f).bits, 0x7bff);                 // just below halfway
  EXPECT_EQ(to_fp16(std::ldexp(1.0f, -24)).bits, 0x0001);     // smallest subnormal
  EXPECT_EQ(to_fp16(std::ldexp(1.0f, -25)).bits, 0x0000);     // halfway to it: ties to even (0)
  EXPECT_EQ(to_fp16(std::ldexp(3.0f, -25)).bits, 0x0002);     // 1.5 units: ties to even (2)
  EXPECT_EQ(to_fp16(std::ldexp(1.0f, -14)).bits, 0x0400);     // smallest normal
  EXPECT_EQ(to_fp16(std::ldexp(1023.5f, -24)).bits, 0x0400);  // subnormal rounding up to normal
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0); 1 + 3 * 2^-11 rounds up.
  EXPECT_EQ(to_fp16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);
  EXPECT_EQ(to_fp16(1.0f + std::ldexp(3.0f, -11)).bits, 0x3c02);
  EXPECT_EQ(to_fp16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)).bits, 0x3c01);
  EXPECT_EQ(to_fp16(-0.0f).bits, 0x8000);
  EXPECT_EQ(to_fp16(INFINITY).bits, 0x7c00);
  EXPECT_EQ(to_fp16(-INFINITY).bits, 0xfc00);
  const uint16_t nan = to_fp16(NAN).bits;
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_EQ(to_fp16(from_bits(0x7f800001u)).bits & 0x7fff, 0x7e00);  // signalling NaN stays NaN
}

TEST(Half, Bf16KnownValues) {
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(to_bf16(from_bits(0x3f808000u)).bits, 0x3f80);  // halfway, even below: down
  EXPECT_EQ(to_bf16(from_bits(0x3f818000u)).bits, 0x3f82);  // halfway, odd below: up
  EXPECT_EQ(to_bf16(from_bits(0x3f808001u)).bits, 0x3f81);  // just above halfway: up
  EXPECT_EQ(to_bf16(from_bits(0x7f7fffffu)).bits, 0x7f80);  // max float rounds to inf
  EXPECT_EQ(to_bf16(-INFINITY).bits, 0xff80);
  EXPECT_EQ(to_bf16(from_bits(0x00000001u)).bits, 0x0000);    // tiny subnormal: to zero
  const uint16_t nan = to_bf16(from_bits(0x7f800001u)).bits;  // low-payload NaN must stay NaN
  EXPECT_EQ(nan & 0x7f80, 0x7f80);
  EXPECT_NE(nan & 0x007f, 0);
}

TEST(Half, EveryFp16RoundTrips) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const fp16_t h{static_cast<uint16_t>(bits)};
    const float f = to_float(h);
    const double expect = fp16_value(h.bits);
    if (std::isnan(expect)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << bits;
      ASSERT_TRUE(std::isnan(to_float(to_fp16(f)))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), expect) << std::hex << bits;
    ASSERT_EQ(to_fp16(f).bits, bits) << std::hex << bits;
  }
}

TEST(Half, Fp16RoundsToNearestEvenBetweenNeighbours) {
  // For every pair of adjacent finite positive fp16 values, points just below, at and just above
  // the midpoint must round to the nearer one, ties to the even bit pattern.
  for (uint16_t a = 0; a < 0x7bff; ++a) {
    const double lo = fp16_value(a), hi = fp16_value(a + 1);
    const double mid = (lo + hi) / 2;  // exact in double, and representable in float
    const float fmid = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(fmid), mid);
    ASSERT_EQ(to_fp16(fmid).bits, (a % 2 == 0) ? a : a + 1) << std::hex << a;
    ASSERT_EQ(to_fp16(std::nextafter(fmid, 0.0f)).bits, a) << std::hex << a;
    ASSERT_EQ(to_fp16(std::nextafter(fmid, INFINITY)).bits, a + 1) << std::hex << a;
    ASSERT_EQ(to_fp16(-std::nextafter(fmid, INFINITY)).bits, 0x8000 | (a + 1)) << std::hex << a;
  }
}

TEST(Half, EveryBf16RoundTrips) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const bf16_t h{static_cast<uint16_t>(bits)};
    const float f = to_float(h);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    ASSERT_EQ(u, bits << 16);
    if (std::isnan(f))
      ASSERT_TRUE(std::isnan(to_float(to_bf16(f))));
    else
      ASSERT_EQ(to_bf16(f).bits, bits) << std::hex << bits;
  }
}

TEST(Half, LoadStoreFloatDispatchOnDtype) {
  uint16_t h[2];
  float f[2];
  double d[2];
  store_float(h, 1, DType::kFloat16, 1.5f);
  EXPECT_EQ(h[1], 0x3e00);
  EXPECT_EQ(load_float(h, 1, DType::kFloat16), 1.5f);
  store_float(h, 0, DType::kBFloat16, -3.0f);
  EXPECT_EQ(h[0], 0xc040);
  EXPECT_EQ(load_float(h, 0, DType::kBFloat16), -3.0f);
  store_float(f, 1, DType::kFloat32, 0.1f);
  EXPECT_EQ(load_float(f, 1, DType::kFloat32), 0.1f);
  store_float(d, 0, DType::kFloat64, 0.1f);
  EXPECT_EQ(d[0], static_cast<double>(0.1f));
}

}  // namespace
}  // namespace flashserve
