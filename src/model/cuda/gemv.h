// The decode GEMM: y[m, n] = x[m, k] · w[n, k]^T (+ bias) for m of at most kGemvMaxRows, where the
// cost is reading w once. One warp per output row of w streams it in 16-byte loads, many in
// flight per lane, against the few rows of x (cached in L1 across the block's warps); float32
// accumulation, one rounding of the result. cuBLASLt's kernels for such skinny products reach
// 50-90% of the copy bandwidth on the model's matrices (the smaller ones worst).
//
// Two kernels are here while session 17 measures them (bench/bench_decode_gemv.cu): the first
// one (kWarpPerRow: a block per 8 rows, four loads in flight per lane; measured no faster in the
// whole decode step on 2026-11-30) and kStreaming (one wave of blocks, each warp streaming its
// share of the rows with 16 loads in flight per lane across row ends, the first ones issued
// before the kernel waits for x under programmatic dependent launch, pdl.cuh). One stays.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flashserve::model::cuda {

constexpr int64_t kGemvMaxRows = 4;

enum class GemvKernel { kWarpPerRow, kStreaming };

struct GemvConfig {
  GemvKernel kernel = GemvKernel::kStreaming;
  bool pdl = false;  // launch with programmatic dependent launch (sm_90 and later only)
};

// k a multiple of 8, pointers 16-byte aligned; bias optional [n]; y bf16 or float32.
void gemv(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, void* y,
          bool y_float32, int64_t m, int64_t n, int64_t k, cudaStream_t stream,
          GemvConfig config = {});

// The MLP's first product and its activation in one pass: w_gate_up is [2 * inter, k] with the
// gate rows first (as the runner fuses them), and act[m, inter] = silu(g) * u with g and u each
// rounded to bf16 first: the same bits as gemv into a [m, 2 * inter] buffer and then silu_mul.
// Always the streaming kernel.
void gemv_silu(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up, __nv_bfloat16* act,
               int64_t m, int64_t inter, int64_t k, cudaStream_t stream, bool pdl = false);

}  // namespace flashserve::model::cuda
