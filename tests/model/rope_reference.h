// RoPE's inverse frequencies and cos/sin factor for each rope_type, in float64, written for the
// tests from the definitions in transformers 5's modeling_rope_utils.py (the _compute_*_parameters
// functions), independently of src/model/rope.cc: per dimension pair i of a head of d,
// theta^(-2i/d), then
//   linear   divided by factor
//   dynamic  unchanged for sequences up to max_position_embeddings (the base only grows past it)
//   llama3   divided by factor for wavelengths above original/low_freq_factor, kept below
//            original/high_freq_factor, blended by (original/wavelength - low) / (high - low)
//   yarn     blended between kept and divided-by-factor with weight ramp(i) = clamp((i - lo) /
//            (hi - lo)), lo/hi the dimensions turning beta_fast/beta_slow times over the original
//            context (floored/ceiled unless truncate is false); cos and sin times the attention
//            factor (given, or mscale(factor, mscale) / mscale(factor, mscale_all_dim), or
//            mscale(factor, 1), with mscale(s, m) = 1 + 0.1 m ln s for s > 1).
#pragma once

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "model/config.h"

namespace flashserve::model::testing {

inline std::vector<double> ref_inv_freq(const ModelConfig& c) {
  const double d = static_cast<double>(c.head_dim);
  const RopeScaling& s = c.rope_scaling;
  std::vector<double> f;
  for (int64_t i = 0; i < c.head_dim; i += 2) f.push_back(std::pow(c.rope_theta, -i / d));
  if (s.type == "linear") {
    for (double& x : f) x = x / s.factor;
  } else if (s.type == "llama3") {
    const double old = static_cast<double>(s.original_max_position_embeddings);
    for (double& x : f) {
      const double wl = 2 * std::numbers::pi / x;
      const double scaled = wl > old / s.low_freq_factor ? x / s.factor : x;
      const double smooth =
          (old / wl - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      const bool medium = !(wl < old / s.high_freq_factor) && !(wl > old / s.low_freq_factor);
      x = medium ? (1 - smooth) * scaled / s.factor + smooth * scaled : scaled;
    }
  } else if (s.type == "yarn") {
    const double ctx = static_cast<double>(s.original_max_position_embeddings);
    auto correction_dim = [&](double rot) {
      return (d * std::log(ctx / (rot * 2 * std::numbers::pi))) / (2 * std::log(c.rope_theta));
    };
    double lo = correction_dim(s.beta_fast), hi = correction_dim(s.beta_slow);
    if (s.truncate) {
      lo = std::floor(lo);
      hi = std::ceil(hi);
    }
    lo = std::max(lo, 0.0);
    hi = std::min(hi, d - 1);
    if (lo == hi) hi += 0.001;
    for (size_t i = 0; i < f.size(); ++i) {
      const double ramp = std::min(1.0, std::max(0.0, (static_cast<double>(i) - lo) / (hi - lo)));
      const double extrapolation_factor = 1 - ramp;
      f[i] = (f[i] / s.factor) * (1 - extrapolation_factor) + f[i] * extrapolation_factor;
    }
  }
  return f;
}

inline double ref_attention_scaling(const ModelConfig& c) {
  const RopeScaling& s = c.rope_scaling;
  if (s.type != "yarn") return 1.0;
  auto mscale = [](double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  if (s.attention_factor != 0) return s.attention_factor;
  if (s.mscale != 0 && s.mscale_all_dim != 0)
    return mscale(s.factor, s.mscale) / mscale(s.factor, s.mscale_all_dim);
  return mscale(s.factor, 1.0);
}

}  // namespace flashserve::model::testing
