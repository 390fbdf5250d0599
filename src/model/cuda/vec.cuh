// Eight bf16 values moved as one 16-byte access, converted to float for the math. Every small
// kernel of the model streams rows whose width is a multiple of 8 (hidden, head_dim, intermediate
// sizes of the Llama family), so one thread handles 8 contiguous elements per access.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace flashserve::model::cuda {

constexpr int kVec = 8;  // bf16 per 16-byte access

struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

__device__ __forceinline__ Bf16x8 load_raw8(const __nv_bfloat16* p) {
  return *reinterpret_cast<const Bf16x8*>(p);
}

__device__ __forceinline__ void unpack8(const Bf16x8& v, float (&f)[kVec]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(v.h[i]);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}

__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&f)[kVec]) {
  unpack8(load_raw8(p), f);
}

__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&f)[kVec]) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  *reinterpret_cast<Bf16x8*>(p) = v;
}

// Rounds each value to bf16 and back, so later math sees what a bf16 tensor would hold.
__device__ __forceinline__ void round8(float (&f)[kVec]) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) f[i] = __bfloat162float(__float2bfloat16_rn(f[i]));
}

}  // namespace flashserve::model::cuda
