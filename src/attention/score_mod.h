// The score modifiers of the contract (flashserve/attention.h), in one place for the float64
// reference and the CPU path: tanh soft-capping (Gemma-2) and the ALiBi bias, applied in
// FlashAttention-2's order to the scaled score, before the mask:
//   s = scale * q.k;   s = softcap * tanh(s / softcap);   s -= slope(b, h) * |p - j|
// where p = kv_len - q_len + t is query t's position (the mask's bottom-right alignment).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "attention/reference/online_softmax.h"
#include "flashserve/error.h"

namespace flashserve::attention {

struct ScoreMod {
  float softcap = 0.0f;            // > 0: tanh capping; 0: off
  const float* alibi = nullptr;    // host slopes of params.alibi_slopes (CPU calls); null: none
  int64_t alibi_batch_stride = 0;  // 0 for slopes [h_q] (one per head, every sequence)
  int64_t alibi_head_stride = 0;

  bool capped() const { return softcap > 0.0f; }
  bool has_alibi() const { return alibi != nullptr; }
  bool any() const { return capped() || has_alibi(); }
  float slope(int64_t b, int64_t h) const {
    return alibi[b * alibi_batch_stride + h * alibi_head_stride];
  }

  // The modified score of a scaled score s (double for the exact reference, float for its
  // low-precision emulation): std::tanh, the reference's own.
  template <typename T>
  T apply(T s, int64_t b, int64_t h, int64_t p, int64_t j) const {
    if (capped()) s = static_cast<T>(softcap) * std::tanh(s / static_cast<T>(softcap));
    if (has_alibi()) s -= static_cast<T>(slope(b, h)) * static_cast<T>(std::llabs(p - j));
    return s;
  }
  // d(modified score) / d(scaled score) at a scaled score s: 1 - tanh^2 when capped (ALiBi is an
  // additive constant). The gradient of q.k is the modified score's times this.
  template <typename T>
  T derivative(T s) const {
    if (!capped()) return T(1);
    const T t = std::tanh(s / static_cast<T>(softcap));
    return T(1) - t * t;
  }
};

// What a kernel lacks (`who`: the CUDA backward, the sm90 forward), refused alike by the
// argument's name.
inline void refuse_score_mods(const ScoreMod& m, const char* who) {
  const std::string why = std::string(" is not supported by ") + who;
  if (m.capped()) throw Error(ErrorKind::kUnsupported, "softcap", "logit soft-capping" + why);
  if (m.has_alibi()) throw Error(ErrorKind::kUnsupported, "alibi_slopes", "ALiBi" + why);
}

// tanh(x) in float, branch-free so that loops over it vectorise (std::tanh does not): an odd
// polynomial below |x| = 0.3 (its Taylor series to x^11, truncation < 1e-8 relative), and
// (1 - e) / (1 + e) with e = exp(-2|x|) above, where 1 - e >= 0.45 loses no digits. About 2e-7
// relative; tanh(+-inf) = +-1 and tanh(NaN) = NaN.
inline float tanh_float(float x) {
  const float a = std::fabs(x);
  const float x2 = x * x;
  float poly = -1382.0f / 155925;
  poly = poly * x2 + 62.0f / 2835;
  poly = poly * x2 - 17.0f / 315;
  poly = poly * x2 + 2.0f / 15;
  poly = poly * x2 - 1.0f / 3;
  poly = poly * x2 * x + x;
  const float e = exp2_nonpositive(-2.0f * 1.44269504088896340736f * a);
  const float far = std::copysign((1.0f - e) / (1.0f + e), x);
  return a < 0.3f ? poly : far;
}

}  // namespace flashserve::attention
