// RoPE's inverse frequencies, inv_freq[i] = theta^(-2i / head_dim) for i < head_dim / 2, with
// Llama 3's frequency-dependent scaling when asked for: wavelengths longer than
// original_max_position / low_freq_factor are divided by `factor`, shorter than
// original_max_position / high_freq_factor kept, and those between interpolated smoothly
// (Hugging Face's _compute_llama3_parameters, in float32 as it computes them).
#pragma once

#include <cstdint>
#include <vector>

namespace flashserve::model {

struct Llama3RopeScaling {
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

std::vector<float> rope_inv_freq(int64_t head_dim, double theta,
                                 const Llama3RopeScaling* llama3 = nullptr);

}  // namespace flashserve::model
