// RMSNorm fused with the residual add that precedes it in every decoder layer:
//   residual[src] += delta[src]                       (bf16, as Hugging Face keeps the stream)
//   out[r] = weight * bf16(residual[src] / sqrt(mean(residual[src]^2) + eps))
// with src = rows ? rows[r] : r. Math in float32; the normalized row is rounded to bf16 before the
// weight multiplies it, as Hugging Face's LlamaRMSNorm does.
// `rows` gathers: after the last layer only the sampled rows are normalized (and only they go
// through the LM head), so the final norm is also the gather of the sample rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flashserve::model::cuda {

// delta may be null (the first layer: the residual is the embedding itself, nothing to add).
// hidden a multiple of 8 and at most 32768. out must not alias residual or delta. pdl: launched
// with programmatic dependent launch (common/pdl.cuh; sm_90 and later).
void add_rmsnorm(const __nv_bfloat16* delta, __nv_bfloat16* residual, const __nv_bfloat16* weight,
                 __nv_bfloat16* out, const int32_t* rows, int64_t n_rows, int64_t hidden, float eps,
                 cudaStream_t stream, bool pdl = false);

}  // namespace flashserve::model::cuda
