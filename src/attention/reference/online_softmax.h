// The online-softmax recurrence of the tiled CPU path, in one place so a test can check it against
// the textbook softmax. Scores arrive in chunks, in log2 units (the softmax scale times log2(e) is
// folded into q beforehand, so exp(scale * x) = exp2(x')). After every chunk
//   m = max of all scores so far,   l = sum of exp2(score - m) over them,
// and anything accumulated with weights exp2(score - m_old) must be multiplied by the returned
// factor exp2(m_old - m_new) to be relative to the new max. At the end p_j = exp2(x_j - m) / l and
// log-sum-exp (natural log) = (m + log2 l) * ln 2.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace flashserve::attention {

// 2^x for x <= 0 in float (the only range softmax needs: x = score - running max), exactly 0 for
// x < -126 (so -inf, a masked key, gives 0). Branch-free, so loops over it vectorise, unlike a
// call to exp2f: x = n + f with n = round(x), f in [-1/2, 1/2]; 2^f by its degree-7 Taylor
// polynomial in f ln 2 (truncation error < 5e-9 relative, below float rounding); 2^n in the
// exponent bits.
inline float exp2_nonpositive(float x) {
  const float xc = x > -126.0f ? x : -126.0f;  // also maps NaN to a finite value for the cast
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer (ties to even)
  const float n = (xc + magic) - magic;
  const float f = (xc - n) * 0.69314718055994530942f;
  float p = 1.0f / 5040;
  p = p * f + 1.0f / 720;
  p = p * f + 1.0f / 120;
  p = p * f + 1.0f / 24;
  p = p * f + 1.0f / 6;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x < -126.0f ? 0.0f : p * scale + (x - x);  // x - x: 0, or NaN for a NaN x
}

// max(a, b) that propagates NaN (std::max(a, NaN) is a): a NaN anywhere makes the result NaN.
template <typename T>
T nan_max(T a, T b) {
  return (b > a || b != b) ? b : a;
}

inline float exp2_nonpositive_or_std(float x) {
  return exp2_nonpositive(x);
}
inline double exp2_nonpositive_or_std(double x) {
  return std::exp2(x);
}

// NaN and infinity follow the float64 reference and PyTorch: a NaN score (a NaN in q or k, or
// inf * 0) or a +inf score (an overflowing q.k: inf - inf in the exponent) makes the row's l, and
// so its output and LSE, NaN; -inf scores weigh 0 like masked keys, and a row whose every score
// is -inf or masked is "saw no key" (zero output, LSE -inf).
template <typename T>
struct RunningSoftmax {
  T m = -std::numeric_limits<T>::infinity();
  T l = 0;

  // Folds x[0, n) in, overwriting each x_j with exp2(x_j - m_new). Returns the factor that rescales
  // previous accumulations (1 when the max did not grow, 0 when nothing was accumulated before,
  // NaN when the row has just become NaN).
  T add(T* x, int64_t n) {
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j]);  // skips NaN: see below
    T corr = 1;
    if (mx > m) {
      corr = std::exp2(m - mx);  // exp2(-inf) = 0
      l *= corr;
      m = mx;
    }
    if (m == -std::numeric_limits<T>::infinity()) {
      // Every score so far masked or -inf, or NaN (which the max skipped): weights 0, unless a NaN
      // poisons the row.
      bool nan = false;
      for (int64_t j = 0; j < n; ++j) {
        nan |= x[j] != x[j];
        x[j] = 0;
      }
      if (!nan) return corr;
      m = l = std::numeric_limits<T>::quiet_NaN();
      return m;
    }
    // A NaN x_j (or inf - inf) makes its weight NaN, and with it l: no test in the loop.
    for (int64_t j = 0; j < n; ++j) x[j] = exp2_nonpositive_or_std(x[j] - m);  // vectorises
    T sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += x[j];
    l += sum;
    return corr;
  }

  // True when no key contributed (every score masked or -inf); false for a NaN row.
  bool empty() const { return l == 0; }
  // Natural-log log-sum-exp of every score seen (with the log2(e) folding undone); -inf if none,
  // NaN for a NaN row.
  T lse() const {
    if (empty()) return -std::numeric_limits<T>::infinity();
    return (m + std::log2(l)) * static_cast<T>(0.69314718055994530942);
  }
};

}  // namespace flashserve::attention
