// RoPE's inverse frequencies, inv_freq[i] = theta^(-2i / head_dim) for i < head_dim / 2, with
// Llama 3's frequency-dependent scaling when asked for: wavelengths longer than
// original_max_position / low_freq_factor are divided by `factor`, shorter than
// original_max_position / high_freq_factor kept, and those between interpolated smoothly
// (Hugging Face's _compute_llama3_parameters, in float32 as it computes them).
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace flashserve::model {

// scaling.type "none" or "llama3" (ModelConfig::validate refuses the others).
std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling = {});

}  // namespace flashserve::model
