// The token-embedding gather: out[t] = table[ids[t]] for every new token of the step.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flashserve::model::cuda {

// table [vocab, hidden], out [n_tokens, hidden], bf16 row-major; hidden a multiple of 8.
// Ids outside [0, vocab) produce a zero row (the loader's callers validate ids on the host; the
// kernel never reads out of bounds).
void embed_tokens(const __nv_bfloat16* table, const int32_t* ids, __nv_bfloat16* out,
                  int64_t n_tokens, int64_t hidden, int64_t vocab, cudaStream_t stream);

}  // namespace flashserve::model::cuda
