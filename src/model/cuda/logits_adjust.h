// The rows' LogitsAdjust (model/logits_adjust.h) on the GPU: a copy of the logits with each
// row's allowed mask and token adjustments applied, for the sampler to read (the logits the
// forward kept stay the model's, for logprobs). The same float arithmetic as the CPU's
// apply_logits_adjust (adjusted_logit is shared), so both samplers see the same logits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "model/logits_adjust.h"

namespace flashserve::model::cuda {

// The flattened adjustments of `rows` rows, on the device.
struct DeviceAdjust {
  const int64_t* offsets = nullptr;     // [rows + 1]: row r's tokens are [offsets[r], offsets[r+1])
  const TokenAdjust* tokens = nullptr;  // distinct tokens within a row
  // [rows, words] bits (words = (vocab + 31) / 32), or null when no row has a mask; a row
  // without one has every bit set.
  const uint32_t* allowed = nullptr;
};

// out[r, :] = logits[r, :] with row r's mask (-inf outside it) and token adjustments.
void adjust_logits(const float* logits, float* out, const DeviceAdjust& adjust, int64_t rows,
                   int64_t vocab, cudaStream_t stream);

}  // namespace flashserve::model::cuda
