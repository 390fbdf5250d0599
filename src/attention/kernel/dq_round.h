// dq from the backward's fp32 accumulator: 8 columns scaled by the softmax scale, each rounded to
// nearest into bf16 or fp16 and packed for one 16-byte store. One rounding for sm80's postprocess
// (sm80/bwd_kernel.h bwd_postprocess) and the sm90 kernel's fused conversion (sm90/bwd_kernel.h
// convert_dq_if_last), so that both give dq the same bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace flashserve::attention::kernel {

template <class Elem>
__device__ __forceinline__ uint4 scale_round8(const float4& lo, const float4& hi, float scale) {
  const float x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t b0, b1;
    if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
      b0 = __bfloat16_as_ushort(__float2bfloat16_rn(scale * x[2 * i]));
      b1 = __bfloat16_as_ushort(__float2bfloat16_rn(scale * x[2 * i + 1]));
    } else {
      b0 = __half_as_ushort(__float2half_rn(scale * x[2 * i]));
      b1 = __half_as_ushort(__float2half_rn(scale * x[2 * i + 1]));
    }
    w[i] = b0 | (b1 << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace flashserve::attention::kernel
