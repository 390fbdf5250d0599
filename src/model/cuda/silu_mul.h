// SwiGLU's activation on the fused gate/up projection: out[t, i] = silu(gu[t, i]) * gu[t, I + i]
// (the gate rows come first in the concatenated weight), float32 math, one rounding to bf16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flashserve::model::cuda {

// gate_up [n_tokens, 2 * intermediate], out [n_tokens, intermediate]; intermediate a multiple of 8.
// pdl: launched with programmatic dependent launch (common/pdl.cuh; sm_90 and later): it waits for
// the kernel before and then lets the next one's blocks be scheduled.
void silu_mul(const __nv_bfloat16* gate_up, __nv_bfloat16* out, int64_t n_tokens,
              int64_t intermediate, cudaStream_t stream, bool pdl = false);

}  // namespace flashserve::model::cuda
