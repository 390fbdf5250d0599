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
#include <limits>

namespace flashserve::attention {

template <typename T>
struct RunningSoftmax {
  T m = -std::numeric_limits<T>::infinity();
  T l = 0;

  // Folds x[0, n) in, overwriting each x_j with exp2(x_j - m_new). Returns the factor that rescales
  // previous accumulations (1 when the max did not grow, 0 when nothing was accumulated before).
  T add(T* x, int64_t n) {
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j]);
    T corr = 1;
    if (mx > m) {
      corr = std::exp2(m - mx);  // exp2(-inf) = 0
      l *= corr;
      m = mx;
    }
    if (m == -std::numeric_limits<T>::infinity()) return corr;  // every score so far masked
    T sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += (x[j] = std::exp2(x[j] - m));
    l += sum;
    return corr;
  }

  bool empty() const { return !(l > 0); }
  // Natural-log log-sum-exp of every score seen (with the log2(e) folding undone); -inf if none.
  T lse() const {
    if (empty()) return -std::numeric_limits<T>::infinity();
    return (m + std::log2(l)) * static_cast<T>(0.69314718055994530942);
  }
};

}  // namespace flashserve::attention
