// Comparing an attention result with the float64 reference, by docs/architecture.md's rule: the
// error of the kernel against the exact result may be at most twice the error of the same
// computation done naively in the input's low precision (Emulate::kLowPrecision), plus a small
// absolute floor per dtype scaled to the output's magnitude. NaN never passes; a row the reference
// gives lse = -inf (it sees no key) must have lse = -inf exactly and a zero output row.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "attention/problem.h"
#include "attention/reference/naive.h"
#include "common/half.h"
#include "flashserve/attention.h"

namespace flashserve::testing {

using attention::reference::NaiveOutput;

// Absolute error floor for the output, per unit of the output's largest magnitude.
inline double out_floor(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 1e-3;
    case DType::kBFloat16:
      return 4e-3;
    default:
      return 1e-5;
  }
}
// The lse is float32 whatever the input dtype (scores are accumulated in float32).
inline double lse_floor() {
  return 2e-5;
}

// Reads params.out and params.lse (host memory, any float dtype) as doubles in the NaiveOutput row
// order. Rows of a varlen q that belong to no sequence are NaN. lse is empty when not requested.
inline NaiveOutput read_output(const AttentionParams& params) {
  const attention::Problem pr = attention::describe(params);
  const attention::HostLayout L(params, pr);
  NaiveOutput o;
  o.rows = L.q_rows();
  o.h_q = pr.h_q;
  o.head_dim_v = pr.head_dim_v;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  o.out.assign(o.rows * o.h_q * o.head_dim_v, nan);
  if (params.lse.defined()) o.lse.assign(o.rows * o.h_q, nan);
  for (int64_t b = 0; b < pr.batch; ++b)
    for (int64_t t = 0; t < L.q_len(b); ++t)
      for (int64_t h = 0; h < pr.h_q; ++h) {
        const int64_t row = L.q_row(b, t) * pr.h_q + h;
        const int64_t off = L.out_offset(b, t, h);
        for (int64_t d = 0; d < pr.head_dim_v; ++d)
          o.out[row * pr.head_dim_v + d] = load_float(params.out.data, off + d, params.out.dtype);
        if (params.lse.defined()) o.lse[row] = params.lse.ptr<const float>()[L.lse_offset(b, t, h)];
      }
  return o;
}

namespace detail {

struct MaxErr {
  double err = 0.0;
  int64_t at = -1;
};

// Largest |a - e| over elements where e is not NaN; a NaN (or infinite) a counts as infinite error.
// Infinite e (lse = -inf) is handled by the caller and skipped here.
inline MaxErr max_err(const std::vector<double>& a, const std::vector<double>& e) {
  MaxErr m;
  for (size_t i = 0; i < e.size(); ++i) {
    if (std::isnan(e[i]) || std::isinf(e[i])) continue;
    const double d =
        std::isfinite(a[i]) ? std::abs(a[i] - e[i]) : std::numeric_limits<double>::infinity();
    if (m.at < 0 || d > m.err) m = {d, static_cast<int64_t>(i)};
  }
  return m;
}

inline double max_abs(const std::vector<double>& e) {
  double m = 0.0;
  for (double x : e)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}

}  // namespace detail

inline ::testing::AssertionResult attention_close(const NaiveOutput& actual,
                                                  const NaiveOutput& exact, const NaiveOutput& lowp,
                                                  DType dtype) {
  const int64_t H = exact.h_q, Dv = exact.head_dim_v;
  if (actual.out.size() != exact.out.size() || lowp.out.size() != exact.out.size())
    return ::testing::AssertionFailure()
           << "out sizes differ: actual " << actual.out.size() << ", exact " << exact.out.size()
           << ", lowp " << lowp.out.size();
  std::ostringstream why;
  bool ok = true;
  auto where_out = [&](int64_t i) {
    std::ostringstream w;
    w << "row " << i / (H * Dv) << " head " << (i / Dv) % H << " col " << i % Dv;
    return w.str();
  };
  auto where_row = [&](int64_t i) {
    std::ostringstream w;
    w << "row " << i / H << " head " << i % H;
    return w.str();
  };

  // Rows that see no key: zero output, lse exactly -inf.
  for (size_t r = 0; r < exact.lse.size(); ++r) {
    if (!(std::isinf(exact.lse[r]) && exact.lse[r] < 0)) continue;
    for (int64_t d = 0; d < Dv; ++d)
      if (!(actual.out[r * Dv + d] == 0.0)) {
        why << "fully masked " << where_row(r) << ": out[" << d << "] = " << actual.out[r * Dv + d]
            << ", expected 0\n";
        ok = false;
        break;
      }
    if (!actual.lse.empty() && !(std::isinf(actual.lse[r]) && actual.lse[r] < 0)) {
      why << "fully masked " << where_row(r) << ": lse = " << actual.lse[r] << ", expected -inf\n";
      ok = false;
    }
  }

  // Output: max error against exact vs twice the low-precision naive's max error plus a floor.
  const detail::MaxErr ours = detail::max_err(actual.out, exact.out);
  const detail::MaxErr naive = detail::max_err(lowp.out, exact.out);
  const double largest = detail::max_abs(exact.out);
  const double magnitude = largest > 0 ? largest : 1.0;
  const double allowed = 2.0 * naive.err + out_floor(dtype) * magnitude;
  if (ours.at >= 0 && !(ours.err <= allowed)) {
    why << "out: max |error| " << ours.err << " at " << where_out(ours.at) << " (got "
        << actual.out[ours.at] << ", exact " << exact.out[ours.at] << ") exceeds " << allowed
        << " = 2 x naive " << dtype_name(dtype) << " error " << naive.err << " + floor "
        << out_floor(dtype) << " x |out|max " << magnitude << "\n";
    ok = false;
  }

  // LSE, when the kernel wrote one.
  std::string lse_note;
  if (!actual.lse.empty()) {
    if (actual.lse.size() != exact.lse.size())
      return ::testing::AssertionFailure() << "lse sizes differ";
    const detail::MaxErr lo = detail::max_err(actual.lse, exact.lse);
    const detail::MaxErr ln = detail::max_err(lowp.lse, exact.lse);
    const double lallowed = 2.0 * ln.err + lse_floor() * std::max(1.0, detail::max_abs(exact.lse));
    if (lo.at >= 0 && !(lo.err <= lallowed)) {
      why << "lse: max |error| " << lo.err << " at " << where_row(lo.at) << " (got "
          << actual.lse[lo.at] << ", exact " << exact.lse[lo.at] << ") exceeds " << lallowed
          << "\n";
      ok = false;
    }
    std::ostringstream n;
    n << ", lse err " << lo.err << " (allowed " << lallowed << ")";
    lse_note = n.str();
  }
  if (!ok) return ::testing::AssertionFailure() << why.str();
  return ::testing::AssertionSuccess()
         << "out err " << ours.err << " (allowed " << allowed << ")" << lse_note;
}

inline void expect_attention_close(const NaiveOutput& actual, const NaiveOutput& exact,
                                   const NaiveOutput& lowp, DType dtype) {
  EXPECT_TRUE(attention_close(actual, exact, lowp, dtype));
}

// The same, for an output already read back as doubles (NaiveOutput row order) and an lse (empty
// when the kernel wrote none).
inline void expect_attention_close(const std::vector<double>& actual_out,
                                   const std::vector<double>& actual_lse, const NaiveOutput& exact,
                                   const NaiveOutput& lowp, DType dtype) {
  NaiveOutput a;
  a.out = actual_out;
  a.lse = actual_lse;
  a.rows = exact.rows;
  a.h_q = exact.h_q;
  a.head_dim_v = exact.head_dim_v;
  expect_attention_close(a, exact, lowp, dtype);
}

// Long sequences, where the float64 naive reference would take minutes: against the CPU tiled
// path (float32, itself tested against float64), the relative Frobenius error of the output that
// bf16 operands allow, and the lse within 1e-3; every element finite.
inline void expect_close_to_tiled(const NaiveOutput& got, const NaiveOutput& ref,
                                  const std::string& name) {
  double num = 0, den = 0, lse_err = 0;
  for (size_t i = 0; i < ref.out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got.out[i])) << name << ": element " << i << " is " << got.out[i];
    num += (got.out[i] - ref.out[i]) * (got.out[i] - ref.out[i]);
    den += ref.out[i] * ref.out[i];
  }
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got.lse[i])) << name << ": lse " << i << " is " << got.lse[i];
    lse_err = std::max(lse_err, std::abs(got.lse[i] - ref.lse[i]));
  }
  EXPECT_LT(std::sqrt(num / den), 1e-2) << name;
  EXPECT_LT(lse_err, 1e-3) << name;
}

// Gradients (dq, dk or dv, `name`) against the float64 reference by the same rule as the output:
// max |error| at most twice the low-precision naive backward's plus out_floor(dtype) x the
// gradient's largest magnitude. NaN (an unwritten, poisoned element) never passes.
inline ::testing::AssertionResult grad_close(const std::vector<double>& actual,
                                             const std::vector<double>& exact,
                                             const std::vector<double>& lowp, DType dtype,
                                             const char* name) {
  if (actual.size() != exact.size() || lowp.size() != exact.size())
    return ::testing::AssertionFailure() << name << ": sizes differ: actual " << actual.size()
                                         << ", exact " << exact.size() << ", lowp " << lowp.size();
  const detail::MaxErr ours = detail::max_err(actual, exact);
  const detail::MaxErr naive = detail::max_err(lowp, exact);
  const double largest = detail::max_abs(exact);
  const double allowed = 2.0 * naive.err + out_floor(dtype) * (largest > 0 ? largest : 1.0);
  if (ours.at >= 0 && !(ours.err <= allowed))
    return ::testing::AssertionFailure()
           << name << ": max |error| " << ours.err << " at " << ours.at << " (got "
           << actual[ours.at] << ", exact " << exact[ours.at] << ") exceeds " << allowed
           << " = 2 x naive " << dtype_name(dtype) << " error " << naive.err << " + floor "
           << out_floor(dtype) << " x |" << name << "|max " << largest;
  return ::testing::AssertionSuccess()
         << name << " err " << ours.err << " (allowed " << allowed << ")";
}

}  // namespace flashserve::testing
