// The decode GEMM: y[m, n] = x[m, k] · w[n, k]^T (+ bias) for m of at most kGemvMaxRows, where the
// cost is reading w once. One warp per output row of w streams it in 16-byte loads, several in
// flight per lane, against the few rows of x (cached in L1 across the block's warps); float32
// accumulation, one rounding of the result. cuBLASLt's kernels for such skinny products reach
// 50-90% of the copy bandwidth on the model's matrices (the smaller ones worst); this one aimed at
// the copy rate for every size but measured no faster in the whole decode step (gemm_gate_up
// slower, the small products a little faster): Gemm uses it only when asked (FLASHSERVE_GEMV=1).
// Session 17 chained the four products through 32 layers in one graph (bench_decode_gemv): at
// batch 1 cuBLASLt 3.85-3.99 ms against a 3.25 ms floor, this kernel with PDL 3.93-3.94, two
// streaming designs (16 loads in flight per lane, a block per 8 rows or one wave of warps each
// streaming its rows) 4.3-4.5 (2 blocks per SM at ~110 registers): they were removed
// (docs/model-gpu.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flashserve::model::cuda {

constexpr int64_t kGemvMaxRows = 4;

// k a multiple of 8, pointers 16-byte aligned; bias optional [n]; y bf16 or float32. pdl: launched
// with programmatic dependent launch (common/pdl.cuh; sm_90 and later). early: each lane loads its
// first weights before it waits for the kernel before (model/decode_kernels.h early_weights); the
// result is the same bit for bit.
void gemv(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, void* y,
          bool y_float32, int64_t m, int64_t n, int64_t k, cudaStream_t stream, bool pdl = false,
          bool early = false);

}  // namespace flashserve::model::cuda
