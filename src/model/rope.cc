#include "model/rope.h"

#include <cmath>
#include <numbers>

namespace flashserve::model {

std::vector<double> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[i] =
        1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
  if (c.rope_scaling.type != "llama3") return f;
  // Llama 3: wavelengths longer than the original context / low_freq_factor are slowed down by
  // `factor`, those shorter than original / high_freq_factor are kept, and the band between is a
  // linear blend of the two (transformers' _compute_llama3_parameters).
  const RopeScaling& s = c.rope_scaling;
  const double old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_len / s.low_freq_factor;
  const double high_wavelen = old_len / s.high_freq_factor;
  for (double& x : f) {
    const double wavelen = 2 * std::numbers::pi / x;
    if (wavelen > low_wavelen) {
      x /= s.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      x = (1 - smooth) * x / s.factor + smooth * x;
    }
  }
  return f;
}

void apply_rope(float* x, int64_t heads, int64_t head_dim, int64_t head_stride, int64_t position,
                const std::vector<double>& inv_freq) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * inv_freq[i];
    const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + h * head_stride;
      const float a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

}  // namespace flashserve::model
