// Central finite differences of the float64 forward, for checking an analytic backward: the loss
// L = sum(dout o out) (out from reference::naive_forward), perturbed element by element in q, k
// and v as they are stored (float32 inputs: x +- h is what the tensor holds after rounding).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention/problem.h"
#include "attention/reference/naive.h"
#include "common/half.h"
#include "support/worst.h"

namespace flashserve::testing {

struct FiniteDiffResult {
  double worst = 0;    // largest |finite difference - analytic| (NaN: infinite)
  double largest = 0;  // largest |analytic|
  int64_t checked = 0;
};

// Checks grads (naive_backward's order) against (L(x + h) - L(x - h)) / (x+ - x-) for every
// element of q, k and v that a sequence uses; dout is in naive_forward's output order. Writes
// into the tensors of p and restores them.
inline FiniteDiffResult finite_diff_check(const AttentionParams& p, const std::vector<double>& dout,
                                          const attention::reference::NaiveGrads& g) {
  using attention::reference::naive_forward;
  auto loss = [&] {
    const auto o = naive_forward(p);
    double l = 0;
    for (size_t i = 0; i < o.out.size(); ++i) l += dout[i] * o.out[i];
    return l;
  };
  FiniteDiffResult r;
  auto element = [&](const TensorView& x, int64_t off, double analytic) {
    const float x0 = load_float(x.data, off, x.dtype);
    const float h = 1.0f / 256;
    store_float(x.data, off, x.dtype, x0 + h);
    const float xp = load_float(x.data, off, x.dtype);
    const double lp = loss();
    store_float(x.data, off, x.dtype, x0 - h);
    const float xm = load_float(x.data, off, x.dtype);
    const double lm = loss();
    store_float(x.data, off, x.dtype, x0);
    const double fd = (lp - lm) / (double(xp) - double(xm));
    r.worst = worse(r.worst, std::abs(fd - analytic));
    r.largest = std::max(r.largest, std::abs(analytic));
    ++r.checked;
  };
  const attention::Problem pr = attention::describe(p);
  const attention::HostLayout L(p, pr);
  const int64_t D = pr.head_dim, Dv = pr.head_dim_v;
  for (int64_t b = 0; b < pr.batch; ++b) {
    const int64_t qrow0 = L.q_row(b, 0);
    const int64_t krow0 = pr.varlen_k ? p.cu_seqlens_k.ptr<const int32_t>()[b] : b * p.k.shape[1];
    for (int64_t t = 0; t < L.q_len(b); ++t)
      for (int64_t h = 0; h < pr.h_q; ++h)
        for (int64_t d = 0; d < D; ++d)
          element(p.q, L.q_offset(b, t, h) + d, g.dq[((qrow0 + t) * pr.h_q + h) * D + d]);
    for (int64_t j = 0; j < L.kv_len(b); ++j)
      for (int64_t hk = 0; hk < pr.h_kv; ++hk) {
        for (int64_t d = 0; d < D; ++d)
          element(p.k, L.k_offset(b, j, hk) + d, g.dk[((krow0 + j) * pr.h_kv + hk) * D + d]);
        for (int64_t d = 0; d < Dv; ++d)
          element(p.v, L.v_offset(b, j, hk) + d, g.dv[((krow0 + j) * pr.h_kv + hk) * Dv + d]);
      }
  }
  return r;
}

}  // namespace flashserve::testing
