// fp16 and bf16 storage types for host code, with round-to-nearest-even conversion from float.
// (The CUDA side uses cuda_fp16.h / cuda_bf16.h; these have the same bit layouts.)
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/float8.h"
#include "flashserve/tensor.h"

namespace flashserve {

struct bf16_t {
  uint16_t bits;
};
struct fp16_t {
  uint16_t bits;
};

inline float to_float(bf16_t h) {
  const uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return {static_cast<uint16_t>(u >> 16)};
}

inline float to_float(fp16_t h) {
  const uint32_t sign = (h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t man = h.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf / NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: value = man * 2^-24
    float f = std::ldexp(static_cast<float>(man), -24);
    return sign ? -f : f;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline fp16_t to_fp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return {static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (au >= 0x477ff000u) return {static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (au < 0x38800000u) {  // below the smallest normal: subnormal or zero, in units of 2^-24
    float a;
    std::memcpy(&a, &au, 4);
    const float units = std::nearbyint(a * 16777216.0f);  // default rounding mode: to even
    return {static_cast<uint16_t>(sign | static_cast<uint16_t>(units))};
  }
  uint32_t r = au + 0xfffu + ((au >> 13) & 1u);  // round to nearest even at bit 13
  return {static_cast<uint16_t>(sign | (((r >> 23) - 112) << 10) | ((r >> 13) & 0x3ffu))};
}

// Reads element i of a float tensor (float32, float16, bfloat16, float64, float8_e4m3fn: the
// code's value, without any descale) as float.
inline float load_float(const void* base, int64_t i, DType dtype) {
  switch (dtype) {
    case DType::kFloat8E4M3:
      return to_float(static_cast<const fp8_e4m3_t*>(base)[i]);
    case DType::kFloat16:
      return to_float(static_cast<const fp16_t*>(base)[i]);
    case DType::kBFloat16:
      return to_float(static_cast<const bf16_t*>(base)[i]);
    case DType::kFloat64:
      return static_cast<float>(static_cast<const double*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

// Writes a float into element i of a float tensor, rounding to its dtype (e4m3: saturating).
inline void store_float(void* base, int64_t i, DType dtype, float x) {
  switch (dtype) {
    case DType::kFloat8E4M3:
      static_cast<fp8_e4m3_t*>(base)[i] = to_e4m3(x);
      break;
    case DType::kFloat16:
      static_cast<fp16_t*>(base)[i] = to_fp16(x);
      break;
    case DType::kBFloat16:
      static_cast<bf16_t*>(base)[i] = to_bf16(x);
      break;
    case DType::kFloat64:
      static_cast<double*>(base)[i] = x;
      break;
    default:
      static_cast<float*>(base)[i] = x;
      break;
  }
}

// Converts n consecutive elements at base[off] to float, times mul. The switch is outside the loop
// so each case is a simple (vectorisable) conversion loop.
inline void load_row(const void* base, DType dtype, int64_t off, int64_t n, float mul, float* dst) {
  switch (dtype) {
    case DType::kFloat16: {
      const fp16_t* src = static_cast<const fp16_t*>(base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]) * mul;
      break;
    }
    case DType::kBFloat16: {
      const bf16_t* src = static_cast<const bf16_t*>(base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]) * mul;
      break;
    }
    default: {
      const float* src = static_cast<const float*>(base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * mul;
      break;
    }
  }
}

inline void store_row(void* base, DType dtype, int64_t off, int64_t n, const float* src) {
  switch (dtype) {
    case DType::kFloat16: {
      fp16_t* dst = static_cast<fp16_t*>(base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = to_fp16(src[i]);
      break;
    }
    case DType::kBFloat16: {
      bf16_t* dst = static_cast<bf16_t*>(base) + off;
      for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
      break;
    }
    default:
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(base)[off + i] = src[i];
      break;
  }
}

}  // namespace flashserve
