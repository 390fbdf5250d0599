// float8_e4m3fn storage for host code: the OCP 8-bit format FlashAttention-3's FP8 path and vLLM's
// fp8 KV cache use (CUDA's __nv_fp8_e4m3, PyTorch's torch.float8_e4m3fn have the same bits).
//
//   bits  S.EEEE.MMM, exponent bias 7; E = 0 is subnormal (m * 2^-9); no infinities; the only NaN
//         codes are S.1111.111 (0x7f, 0xff); the largest finite value is 448 (0x7e).
//   to_e4m3 rounds to nearest, ties to even. Out of range it either saturates to +-448
//         (Fp8Saturation::kFinite: CUDA's __NV_SATFINITE; infinities too) or gives NaN
//         (kNone: CUDA's __NV_NOSAT and PyTorch's plain `x.to(torch.float8_e4m3fn)`, where every
//         |x| past 464, the midpoint between 448 and the NaN code, turns NaN). Every NaN is 0x7f,
//         whatever the sign, as CUDA's conversion gives it (PyTorch's keeps the sign: 0xff for a
//         negative input; the same value, NaN).
//
// flashserve quantises with kFinite: FA3 and vLLM scale a tensor by its descale factor so that
// its values fit (amax / 448), and an outlier past the calibrated range then costs accuracy on
// that element instead of turning a whole attention row NaN. kNone is the plain cast's rule, for
// comparisons with PyTorch and CUDA.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>

namespace flashserve {

struct fp8_e4m3_t {
  uint8_t bits;
};

inline constexpr float kE4m3Max = 448.0f;

enum class Fp8Saturation { kFinite, kNone };

namespace detail {

constexpr float e4m3_value(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0xfu, m = b & 0x7u;
  if (e == 0xf && m == 0x7) return std::bit_cast<float>(sign | 0x7fc00000u);  // NaN
  if (e == 0) {  // subnormal: m * 2^-9, exact in float
    const float v = static_cast<float>(m) * (1.0f / 512.0f);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((e + 120u) << 23) | (m << 20));  // rebias 7 -> 127
}

constexpr std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) t[i] = e4m3_value(static_cast<uint8_t>(i));
  return t;
}

}  // namespace detail

// Every code's value: the decode is one load (the CPU attention converts K/V rows with it).
inline constexpr std::array<float, 256> kE4m3Table = detail::make_e4m3_table();

inline float to_float(fp8_e4m3_t x) {
  return kE4m3Table[x.bits];
}

inline fp8_e4m3_t to_e4m3(float f, Fp8Saturation sat = Fp8Saturation::kFinite) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t au = u & 0x7fffffffu;
  const uint8_t overflow = sat == Fp8Saturation::kFinite ? 0x7e : 0x7f;
  if (au > 0x7f800000u) return {0x7f};  // NaN, its sign dropped as CUDA's conversion does
  if (au == 0x7f800000u) return {static_cast<uint8_t>(sign | overflow)};
  if (au < 0x3c800000u) {  // below 2^-6, the smallest normal: units of 2^-9 (8 units is 2^-6)
    const float units = std::nearbyint(std::bit_cast<float>(au) * 512.0f);  // exact scaling, RNE
    return {static_cast<uint8_t>(sign | static_cast<uint8_t>(units))};
  }
  const uint32_t r = au + 0x7ffffu + ((au >> 20) & 1u);  // round to nearest even at bit 20
  const uint32_t e = (r >> 23) - 120u, m = (r >> 20) & 7u;
  if (e > 15 || (e == 15 && m == 7)) return {static_cast<uint8_t>(sign | overflow)};
  return {static_cast<uint8_t>(sign | (e << 3) | m)};
}

// x rounded to e4m3 and back: what storing it costs.
inline float round_to_e4m3(float x, Fp8Saturation sat = Fp8Saturation::kFinite) {
  return to_float(to_e4m3(x, sat));
}

}  // namespace flashserve
