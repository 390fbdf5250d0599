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

#include "common/pdl.cuh"
#include "fwd_params.h"

namespace flashserve::attention::sm80 {

inline constexpr int kCombineThreads = 256;

template <class Elem, int kHeadDim, int kWarpsPerItem>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const __grid_constant__ FwdParams p) {
#include "combine_body.inc"
}

// The partials of a padded kernel (fwd_kernel.h fwd_kernel_padded) whose value head dim is below
// kHeadDim: out's columns from p.head_dim_v on are neither read from the partials nor written.
template <class Elem, int kHeadDim, int kWarpsPerItem>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel_padded(const __grid_constant__ FwdPaddedParams p) {
#define FLASHSERVE_COMBINE_PADDED
#include "combine_body.inc"
#undef FLASHSERVE_COMBINE_PADDED
}

}  // namespace flashserve::attention::sm80
