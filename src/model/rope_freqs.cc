#include "model/rope_freqs.h"

#include <cmath>

namespace flashserve::model {

std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling) {
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    // torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all float32.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(theta), expo);
  }
  if (scaling.type != "llama3") return inv;
  const RopeScaling* llama3 = &scaling;
  const float factor = static_cast<float>(llama3->factor);
  const float low = static_cast<float>(llama3->low_freq_factor);
  const float high = static_cast<float>(llama3->high_freq_factor);
  const float old_len = static_cast<float>(llama3->original_max_position_embeddings);
  const float low_wavelen = old_len / low, high_wavelen = old_len / high;
  constexpr float kPi = 3.14159265358979323846f;
  for (float& f : inv) {
    const float wavelen = 2.0f * kPi / f;
    float scaled = wavelen > low_wavelen ? f / factor : f;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    if (medium) {
      const float smooth = (old_len / wavelen - low) / (high - low);
      scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
    }
    f = scaled;
  }
  return inv;
}

}  // namespace flashserve::model
