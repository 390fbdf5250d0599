#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "flashserve/error.h"

namespace flashserve::model {

namespace {

// Llama 3: wavelengths longer than the original context / low_freq_factor are slowed down by
// `factor`, those shorter than original / high_freq_factor are kept, and the band between is a
// linear blend of the two (transformers' _compute_llama3_parameters).
void llama3(const RopeScaling& s, std::vector<double>& f) {
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
}

// YaRN (transformers' _compute_yarn_parameters): dimensions that turn more than beta_fast times
// over the original context keep their frequency, those that turn fewer than beta_slow times are
// slowed down by `factor` (interpolated), and the dimensions between blend the two linearly.
void yarn(const RopeScaling& s, double theta, int64_t head_dim, std::vector<double>& f) {
  const double d = static_cast<double>(head_dim);
  const double context = static_cast<double>(s.original_max_position_embeddings);
  // The (fractional) dimension index whose wavelength fits `rotations` times in the context.
  auto dim_turning = [&](double rotations) {
    return d * std::log(context / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
  };
  double low = dim_turning(s.beta_fast), high = dim_turning(s.beta_slow);
  if (s.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, d - 1);
  if (low == high) high += 0.001;  // as transformers does, to keep the ramp finite
  for (size_t i = 0; i < f.size(); ++i) {
    const double interpolated = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    f[i] = f[i] / s.factor * interpolated + f[i] * (1 - interpolated);
  }
}

// YaRN's mscale: 1 + 0.1 * m * ln(factor), 1 for no growth.
double yarn_mscale(double factor, double m) {
  return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

}  // namespace

std::vector<double> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[i] =
        1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "linear") {
    for (double& x : f) x /= s.factor;
  } else if (s.type == "llama3") {
    llama3(s, f);
  } else if (s.type == "yarn") {
    yarn(s, c.rope_theta, c.head_dim, f);
  }
  // "none", and "dynamic" below max_position_embeddings: transformers' base is rope_theta there.
  return f;
}

double rope_attention_scaling(const ModelConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  if (s.type != "yarn") return 1.0;
  if (s.attention_factor > 0) return s.attention_factor;
  if (s.mscale != 0 && s.mscale_all_dim != 0)
    return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  return yarn_mscale(s.factor, 1.0);
}

void check_rope_positions(const ModelConfig& c, const std::vector<int32_t>& positions) {
  if (c.rope_scaling.type != "dynamic") return;
  for (int32_t p : positions)
    if (p >= c.max_position_embeddings)
      throw Error(ErrorKind::kUnsupported, "positions",
                  std::to_string(p) + " is at or past max_position_embeddings " +
                      std::to_string(c.max_position_embeddings) +
                      ", where rope_type dynamic changes its frequencies with the sequence's "
                      "length (not implemented)");
}

void apply_rope(float* x, int64_t heads, int64_t head_dim, int64_t head_stride, int64_t position,
                const std::vector<double>& inv_freq, double scale) {
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * inv_freq[i];
    const float c = static_cast<float>(std::cos(angle) * scale);
    const float s = static_cast<float>(std::sin(angle) * scale);
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + h * head_stride;
      const float a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

}  // namespace flashserve::model
