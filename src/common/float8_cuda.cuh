// float8_e4m3fn on the device: the quantiser the fp8 KV cache's writers use and the dequantiser
// its readers use, beside common/float8.h's host versions.
//
//   e4m3_from_float rounds to nearest even and saturates to +-448 (CUDA's __NV_SATFINITE, one
//     cvt.rn.satfinite.e4m3x2.f32 from sm_89 on): bit for bit the host's to_e4m3(x, kFinite),
//     NaN included (0x7f whatever the sign; tests/common/float8_test.cc checks the host against
//     CUDA's conversion, tests/model_gpu/kv_fp8_gpu_test.cc this function against the host).
//   e4m3x8_to_bf16x8 widens eight codes to bfloat16 exactly: every e4m3 value (3 mantissa bits,
//     2^-9 .. 448) is a bfloat16 value, so a kernel that dequantises on load and then multiplies
//     by the scale in float32 computes what it would on the dequantised bf16 tensor.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace flashserve {

__device__ __forceinline__ uint8_t e4m3_from_float(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// Two codes (the low 16 bits of `two`, the lower byte first) as a bfloat16 pair: e4m3 -> f16x2
// is one exact conversion (f16 holds every e4m3 value), f16 -> f32 exact, f32 -> bf16 exact.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint16_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __float22bfloat162_rn(f);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Eight codes (in memory order, as a uint2 load gives them) as eight bfloat16 values in memory
// order (a uint4 to store).
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8(uint2 codes) {
  return make_uint4(e4m3x2_to_bf16x2(static_cast<uint16_t>(codes.x & 0xffffu)),
                    e4m3x2_to_bf16x2(static_cast<uint16_t>(codes.x >> 16)),
                    e4m3x2_to_bf16x2(static_cast<uint16_t>(codes.y & 0xffffu)),
                    e4m3x2_to_bf16x2(static_cast<uint16_t>(codes.y >> 16)));
}

}  // namespace flashserve
