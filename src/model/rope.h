// Rotary position embedding as Hugging Face's Llama applies it: the "rotate half" form (the head's
// first half rotates against its second half, x_i with x_{i + d/2}), with frequencies
// theta^(-2i/d), optionally rescaled by Llama 3's rule (rope_scaling llama3). The frequencies are
// computed on the host once; both runners take them from here.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace flashserve::model {

// inv_freq[i] for i in [0, head_dim / 2), in double (each runner rounds to its own precision).
std::vector<double> rope_inv_freq(const ModelConfig& config);

// Rotates `heads` vectors of `head_dim` (consecutive heads `head_stride` floats apart) in place
// for a token at `position`: for i < d/2, (x_i, x_{i+d/2}) <- (x_i c - x_{i+d/2} s,
// x_{i+d/2} c + x_i s) with angle position * inv_freq[i].
void apply_rope(float* x, int64_t heads, int64_t head_dim, int64_t head_stride, int64_t position,
                const std::vector<double>& inv_freq);

}  // namespace flashserve::model
