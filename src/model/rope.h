// Rotary position embedding as Hugging Face's Llama applies it: the "rotate half" form (the head's
// first half rotates against its second half, x_i with x_{i + d/2}), with frequencies
// theta^(-2i/d) rescaled by the config's rope type (transformers' modeling_rope_utils.py, the
// definitions of transformers 5): linear, llama3, yarn, and dynamic (NTK), which equals the
// unscaled frequencies for every position below max_position_embeddings and rescales them, from
// the longest sequence of the call, beyond it; since our front ends bound every sequence by
// max_position_embeddings and the runners refuse a position past it (check_rope_positions), that
// rescaling never occurs. yarn also scales cos and sin (rope_attention_scaling). The frequencies
// are computed on the host once; both runners take them from here.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace flashserve::model {

// inv_freq[i] for i in [0, head_dim / 2), in double (each runner rounds to its own precision).
std::vector<double> rope_inv_freq(const ModelConfig& config);

// The factor on cos and sin (transformers' attention_scaling): yarn's attention factor, else 1.
double rope_attention_scaling(const ModelConfig& config);

// Throws Error(kUnsupported) naming the position for one the frequencies above do not cover:
// with rope_type dynamic, any at or past max_position_embeddings (where transformers starts
// changing the base with the sequence's length, and keys cached earlier keep the old one).
void check_rope_positions(const ModelConfig& config, const std::vector<int32_t>& positions);

// Rotates `heads` vectors of `head_dim` (consecutive heads `head_stride` floats apart) in place
// for a token at `position`: for i < d/2, (x_i, x_{i+d/2}) <- (x_i c - x_{i+d/2} s,
// x_{i+d/2} c + x_i s) with angle position * inv_freq[i], c and s multiplied by `scale`.
void apply_rope(float* x, int64_t heads, int64_t head_dim, int64_t head_stride, int64_t position,
                const std::vector<double>& inv_freq, double scale = 1.0);

}  // namespace flashserve::model
