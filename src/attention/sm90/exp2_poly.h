// 2^x on the FMA pipe, for the softmax's exponentials that the MUFU unit cannot keep up with
// (tile_config.h Exp2Fma; docs/kernel-notes.md, "exp2 on the FMA pipe"): FlashAttention-4's idea on
// Blackwell, here with our own polynomial. 2^x = 2^j 2^f with j = round(x) and f = x - j in
// [-1/2, 1/2]: 2^f by a degree-6 polynomial (Horner, six FMAs), 2^j by writing j + 127 into a
// float's exponent bits, and one multiply that puts them together and flushes to zero as
// ex2.approx.ftz.f32 does. Host and device run the same code (tests/attention/exp2_poly_test.cc
// checks it against std::exp2 in double); the device spells the two steps the host emulates.
#pragma once

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "attention/mask.h"  // FS_HOST_DEVICE

namespace flashserve::attention::sm90 {

// 2^f ~ 1 + f (c1 + f (c2 + f (c3 + f (c4 + f (c5 + f c6))))) on [-1/2, 1/2]: minimax in relative
// error by Remez exchange with the constant term held at 1 (so that integer x give 2^x exactly),
// rounded to float: `scripts/exp2_poly_fit.py --degree 6`. Relative error 2.6e-9 before rounding;
// evaluated in float, at most 8.5e-8 (2^-23.5, 1.01 ulp) against ex2.approx.f32's ~2^-22 (2 ulp).
// Degree 5 (one FMA less) measured 3 ulp (1.9e-7) with the best float constant term, above
// ex2.approx's.
inline constexpr float kExp2PolyC1 = 0x1.62e432p-1f;
inline constexpr float kExp2PolyC2 = 0x1.ebfbe2p-3f;
inline constexpr float kExp2PolyC3 = 0x1.c6ae72p-5f;
inline constexpr float kExp2PolyC4 = 0x1.3b270ep-7f;
inline constexpr float kExp2PolyC5 = 0x1.5f7276p-10f;
inline constexpr float kExp2PolyC6 = 0x1.470b4ap-13f;
// x + kExp2PolyRound (1.5 2^23 + 127) lands in [2^23, 2^24), where floats are the integers: the
// add rounds x to j (to nearest even) and leaves j + 127 in the sum's low 9 bits, which a shift
// by 23 turns into the float 2^j (for -127 <= j <= 127; j = -127 gives +0).
inline constexpr float kExp2PolyRound = 0x1.8p23f + 127.0f;
// Inputs are clamped here first: 2^-127 is below the normal range (ex2.approx.ftz flushes it to
// 0, and so does the shift: exponent bits 0), and -inf would make f NaN (-inf - -inf).
inline constexpr float kExp2PolyLowest = -127.0f;

// The steps the device spells in PTX and the host emulates, one pair of definitions each:
// - a float's bits and back (a shift on them is the integer part of 2^x);
// - max(x, lo) that keeps a NaN (fmaxf would return lo): a NaN score must leave its row NaN
//   (fwd_epilogue.h FwdEpilogue::store, issue 9's rule), as ex2.approx's NaN does;
// - a b with a result below the normal range flushed to +0 (ex2.approx.ftz's subnormal results).
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ uint32_t exp2_poly_bits(float v) {
  return __float_as_uint(v);
}
__device__ __forceinline__ float exp2_poly_float(uint32_t b) {
  return __uint_as_float(b);
}
__device__ __forceinline__ float exp2_poly_clamp(float x, float lo) {
  float y;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(x), "f"(lo));
  return y;
}
__device__ __forceinline__ float exp2_poly_mul_ftz(float a, float b) {
  float y;
  asm("mul.ftz.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
  return y;
}
#else
inline uint32_t exp2_poly_bits(float v) {
  return std::bit_cast<uint32_t>(v);
}
inline float exp2_poly_float(uint32_t b) {
  return std::bit_cast<float>(b);
}
inline float exp2_poly_clamp(float x, float lo) {
  return std::isnan(x) ? x : std::fmax(x, lo);
}
inline float exp2_poly_mul_ftz(float a, float b) {
  const float y = a * b;
  return std::fabs(y) < FLT_MIN ? 0.0f * y : y;
}
#endif

// 2^x for x < 127.5 (the softmax's x <= 0, or <= 8 with lazy rescaling), as ex2.approx.ftz.f32:
// 0 below 2^-126 (x < -126) and for -inf, NaN for NaN. On the device: one max, three adds, six
// FMAs and a multiply on the FP32 pipes, one shift on the integer pipe.
FS_HOST_DEVICE float exp2_poly(float x) {
  x = exp2_poly_clamp(x, kExp2PolyLowest);
  const float t = x + kExp2PolyRound;        // j + 127 in the low bits
  const float f = x - (t - kExp2PolyRound);  // x - j, exact: in [-1/2, 1/2]
  float p = kExp2PolyC6;
  p = fmaf(p, f, kExp2PolyC5);
  p = fmaf(p, f, kExp2PolyC4);
  p = fmaf(p, f, kExp2PolyC3);
  p = fmaf(p, f, kExp2PolyC2);
  p = fmaf(p, f, kExp2PolyC1);
  p = fmaf(p, f, 1.0f);
  // 2^j, exact (+0 for j = -127; with a NaN x, -inf, and p is NaN); for j = -126 and f < 0 the
  // product is below 2^-126 and flushes, as 2^x does there.
  const float two_j = exp2_poly_float(exp2_poly_bits(t) << 23);
  return exp2_poly_mul_ftz(p, two_j);
}

}  // namespace flashserve::attention::sm90
