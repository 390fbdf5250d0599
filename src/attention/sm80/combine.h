// Split-KV combine: each split wrote O_s (normalised by its own row sum) and LSE_s for every
// (row, head); the full result is O = sum_s exp(LSE_s - LSE) O_s with LSE = log sum_s exp(LSE_s).
// Splits that saw no key have LSE_s = -inf and weigh 0; a row no split saw gets O = 0, LSE = -inf.
// One warp per (row, head); lanes split the head dim.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fwd_params.h"

namespace flashserve::attention::sm80 {

template <class Elem>
__global__ void __launch_bounds__(256)
    combine_kernel(const __grid_constant__ FwdParams p, int batch, int head_dim) {
  const int lane = threadIdx.x & 31;
  const int64_t item = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) >> 5;
  if (item >= p.q_rows * p.h_q) return;
  const int64_t row = item / p.h_q;
  const int head = static_cast<int>(item % p.h_q);
  // A varlen row before the first sequence or past the last belongs to no sequence: nothing wrote
  // its partials, and the caller's memory there must stay untouched (as the unsplit path leaves
  // it).
  if (p.cu_seqlens_q != nullptr && (row < p.cu_seqlens_q[0] || row >= p.cu_seqlens_q[batch]))
    return;

  const int64_t split_stride = p.q_rows * p.h_q;  // in (row, head) slots
  const float* lse_s = p.lse_partial + row * p.h_q + head;
  float m = -INFINITY;
  for (int s = lane; s < p.num_splits; s += 32) m = fmaxf(m, lse_s[s * split_stride]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float sum = 0.0f;
  if (m != -INFINITY)
    for (int s = lane; s < p.num_splits; s += 32) sum += expf(lse_s[s * split_stride] - m);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const bool seen = m != -INFINITY && sum > 0.0f;
  const float lse = seen ? m + logf(sum) : -INFINITY;

  int64_t b = 0, t = row;  // dense rows are b * seqlen_q + t
  if (p.cu_seqlens_q == nullptr) {
    b = row / p.seqlen_q;
    t = row % p.seqlen_q;
  }
  Elem* out = static_cast<Elem*>(p.out) + b * p.o_batch_stride + t * p.o_row_stride +
              head * p.o_head_stride;
  const float* o_s = p.o_partial + (row * p.h_q + head) * head_dim;
  for (int c = 2 * lane; c < head_dim; c += 64) {
    float x = 0.0f, y = 0.0f;
    if (seen) {
      for (int s = 0; s < p.num_splits; ++s) {
        const float w = expf(lse_s[s * split_stride] - lse);
        const float2 v = *reinterpret_cast<const float2*>(o_s + s * split_stride * head_dim + c);
        x += w * v.x;
        y += w * v.y;
      }
    }
    if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
      *reinterpret_cast<__nv_bfloat162*>(out + c) = __floats2bfloat162_rn(x, y);
    } else {
      *reinterpret_cast<__half2*>(out + c) = __floats2half2_rn(x, y);
    }
  }
  if (p.lse != nullptr && lane == 0)
    p.lse[b * p.lse_batch_stride + head * p.lse_head_stride + t * p.lse_row_stride] = lse;
}

}  // namespace flashserve::attention::sm80
