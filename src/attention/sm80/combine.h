// Split-KV combine: each split wrote O_s (normalised by its own row sum) and LSE_s for every
// (row, head); the full result is O = sum_s exp(LSE_s - LSE) O_s with LSE = log sum_s exp(LSE_s).
// Splits that saw no key have LSE_s = -inf and weigh 0; a row no split saw gets O = 0, LSE = -inf;
// a NaN LSE_s (a NaN row in that split) makes O and LSE NaN.
//
// `kWarpsPerItem` warps share one (row, head): each computes the LSE over all splits (a few
// loads per lane), sums its own share of the splits' O (splits w, w + kWarpsPerItem, ...; four at
// a time so that their loads are in flight together) and the shares meet in shared memory. Long
// decode splits 64-128 ways over a handful of rows: one warp looping over every split serially
// was latency-bound there (~0.6 us per split).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fwd_params.h"

namespace flashserve::attention::sm80 {

inline constexpr int kCombineThreads = 256;

template <int kHeadDim>
using CombineShare = float2[kCombineThreads / 32][kHeadDim / 64][32];

// One block of the combine. `cols`: the column chunks of out that are real (smem_tile.h): all of
// kHeadDim, or (a padded kernel's partials) those of the call's head_dim_v; no other is read or
// written.
template <class Elem, int kHeadDim, int kWarpsPerItem, class Chunks>
__device__ __forceinline__ void combine_body(const FwdParams& p, CombineShare<kHeadDim>& share,
                                             Chunks cols) {
  constexpr int kWarps = kCombineThreads / 32, kItemsPerBlock = kWarps / kWarpsPerItem;
  constexpr int kPairs = kHeadDim / 64;  // float2 columns per lane: c = 2 * lane + 64 * j
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % kWarpsPerItem;
  const int64_t item = int64_t{blockIdx.x} * kItemsPerBlock + warp / kWarpsPerItem;
  const int64_t slot_row = item / p.h_q;  // the launch's partial rows
  const int head = static_cast<int>(item % p.h_q);
  bool active = item < p.q_rows * p.h_q;
  int64_t row = p.partial_row0 + slot_row;  // the row of q
  if (p.partials_by_seq) {
    // Decode launches: partial row s is sequence seq_begin + s, whose one query (if it has one:
    // the launch also passes over empty ones and, in an interleaved batch, longer ones) is the row.
    const int b = p.seq_begin + static_cast<int>(slot_row);
    if (active && p.cu_seqlens_q != nullptr) {
      row = p.cu_seqlens_q[b];
      active = p.cu_seqlens_q[b + 1] - row == 1;
    } else {
      row = int64_t{b} * p.seqlen_q;
      active = active && p.seqlen_q == 1;
    }
  } else if (active && p.cu_seqlens_q != nullptr) {
    // A varlen row before the launch's first sequence or past its last, or of a sequence the
    // other launch of a mixed batch took, is not this launch's: nothing wrote its partials, and
    // the memory there is the caller's (as the unsplit path leaves it) or the other launch's.
    const int32_t* cu = p.cu_seqlens_q;
    active = row >= cu[p.seq_begin] && row < cu[p.seq_end];
    if (active && p.only != kAllSeqs) {
      int lo = p.seq_begin, hi = p.seq_end;  // the last b with cu[b] <= row
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (cu[mid] <= row)
          lo = mid;
        else
          hi = mid;
      }
      active = takes_seq(p.only, cu[lo + 1] - cu[lo]);
    }
  }

  const int64_t split_stride = p.q_rows * p.h_q;  // in (row, head) slots
  const float* lse_s = p.lse_partial + slot_row * p.h_q + head;
  float m = -INFINITY, sum = 0.0f;
  bool nan = false;  // a NaN split (NaN input, overflowing score) makes the row NaN
  if (active) {
    for (int s = lane; s < p.num_splits; s += 32) {
      const float x = lse_s[s * split_stride];
      nan |= x != x;
      m = fmaxf(m, x);  // fmaxf skips NaN: hence the flag
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (__any_sync(0xffffffffu, nan)) m = NAN;
  if (active && m != -INFINITY)
    for (int s = lane; s < p.num_splits; s += 32) sum += expf(lse_s[s * split_stride] - m);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const bool seen = m != -INFINITY && sum != 0.0f;  // NaN: seen, and lse, weights, O are NaN
  const float lse = seen ? m + logf(sum) : -INFINITY;

  float2 acc[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) acc[j] = make_float2(0.0f, 0.0f);
  if (active && seen) {
    const float* o_s = p.o_partial + (slot_row * p.h_q + head) * kHeadDim + 2 * lane;
#pragma unroll 4
    for (int s = part; s < p.num_splits; s += kWarpsPerItem) {
      const float w = expf(lse_s[s * split_stride] - lse);
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        if constexpr (!Chunks::kAll)
          if (!cols.has((2 * lane + 64 * j) >> 3)) continue;
        const float2 v =
            *reinterpret_cast<const float2*>(o_s + s * split_stride * kHeadDim + 64 * j);
        acc[j].x += w * v.x;
        acc[j].y += w * v.y;
      }
    }
  }
  if constexpr (kWarpsPerItem > 1) {
#pragma unroll
    for (int j = 0; j < kPairs; ++j) share[warp][j][lane] = acc[j];
    __syncthreads();
    if (part == 0) {
      for (int w = 1; w < kWarpsPerItem; ++w)
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
          acc[j].x += share[warp + w][j][lane].x;
          acc[j].y += share[warp + w][j][lane].y;
        }
    }
  }
  if (!active || part != 0) return;

  int64_t b = 0, t = row;  // dense rows are b * seqlen_q + t
  if (p.cu_seqlens_q == nullptr) {
    b = row / p.seqlen_q;
    t = row % p.seqlen_q;
  }
  Elem* out = static_cast<Elem*>(p.out) + b * p.o_batch_stride + t * p.o_row_stride +
              head * p.o_head_stride + 2 * lane;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    if constexpr (!Chunks::kAll)
      if (!cols.has((2 * lane + 64 * j) >> 3)) continue;
    if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
      *reinterpret_cast<__nv_bfloat162*>(out + 64 * j) = __floats2bfloat162_rn(acc[j].x, acc[j].y);
    } else {
      *reinterpret_cast<__half2*>(out + 64 * j) = __floats2half2_rn(acc[j].x, acc[j].y);
    }
  }
  if (p.lse != nullptr && lane == 0)
    p.lse[b * p.lse_batch_stride + head * p.lse_head_stride + t * p.lse_row_stride] = lse;
}

template <class Elem, int kHeadDim, int kWarpsPerItem>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const __grid_constant__ FwdParams p) {
  __shared__ CombineShare<kHeadDim> share;
  combine_body<Elem, kHeadDim, kWarpsPerItem>(p, share, AllChunks{});
}

// The partials of a padded kernel (fwd_kernel.h fwd_kernel_padded) whose value head dim is below
// kHeadDim: out's columns from p.head_dim_v on are not the call's.
template <class Elem, int kHeadDim, int kWarpsPerItem>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel_padded(const __grid_constant__ FwdPaddedParams p) {
  __shared__ CombineShare<kHeadDim> share;
  combine_body<Elem, kHeadDim, kWarpsPerItem>(p, share, ChunkBound{p.head_dim_v / 8});
}

}  // namespace flashserve::attention::sm80
