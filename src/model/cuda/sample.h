// Sampling on the GPU: one token per row of float32 logits, by the rule of model/sampling.h
// (greedy at temperature 0; else softmax(logits / T), min-p, top-k, then top-p over the tokens
// ordered by probability descending with ties to the lower index, and the inverse CDF at the
// shared uniform). The logits are the adjusted ones where a row has adjustments
// (model/cuda/logits_adjust.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashserve::model::cuda {

// One row's parameters as the kernel reads them (uniform = sample_uniform(seed, position), drawn
// on the device from the same counter-based generator the CPU sampler uses).
struct RowSampling {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  int64_t position = 0;  // of the token being sampled
};

// logits [rows, vocab] float32; params [rows] and tokens [rows] on the device.
void sample_tokens(const float* logits, const RowSampling* params, int32_t* tokens, int64_t rows,
                   int64_t vocab, cudaStream_t stream);

}  // namespace flashserve::model::cuda
