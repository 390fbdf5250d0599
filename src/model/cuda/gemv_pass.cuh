// A GEMV lane's inner step, shared by gemv.cu and fused_gemv.cu: both add the same products in
// the same order, so a fused product's output is the plain GEMV's bit for bit.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "model/cuda/vec.cuh"

namespace flashserve::model::cuda {

constexpr int64_t kGemvStep = 32 * kVec;  // elements of a row one warp pass covers

// acc[i] += w . x[i][c, c + kVec) for the M rows of x (row stride k): one vector of a weight row.
template <int M>
__device__ __forceinline__ void fma_vec(const float (&wv)[kVec], const __nv_bfloat16* x, int64_t k,
                                        int64_t c, float (&acc)[M]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
    float xv[kVec];
    load8(x + i * k + c, xv);
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[i] = fmaf(wv[e], xv[e], acc[i]);
  }
}

// One pass of a lane over a weight row from column c: kUnroll vectors kGemvStep apart, loaded
// beforehand and kept as loaded (bf16: half the registers of floats) until used here.
template <int kUnroll, int M>
__device__ __forceinline__ void fma_pass(const Bf16x8 (&wraw)[kUnroll], const __nv_bfloat16* x,
                                         int64_t k, int64_t c, float (&acc)[M]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    float wv[kVec];
    unpack8(wraw[u], wv);
    fma_vec<M>(wv, x, k, c + u * kGemvStep, acc);
  }
}

}  // namespace flashserve::model::cuda
