// NaN and infinity in attention inputs (issue 9): poisons chosen elements of an AttentionCase's
// inputs and predicts, from the mask rule alone (no attention code), which output rows must come
// out NaN. The contract, as in PyTorch and FlashAttention: a NaN in q or in a key a row sees, or a
// score that overflows to +inf, makes that row's output and LSE NaN; a row that sees no key stays
// zero with LSE -inf, whatever its q holds; every other row is unaffected.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <vector>

#include "attention/problem.h"
#include "support/attention_case.h"

namespace flashserve::testing {

enum class Poison {
  kNanQ,      // one element of q in a row that sees keys, one in a row that sees none (if any)
  kNanK,      // one element of one key
  kOverflow,  // a row of q (1e36) and a key it sees (1e4): that score overflows float32
  kNegInf,    // the same with the key -1e4: that score is -inf, which weighs 0 (no NaN row)
};

inline const char* poison_name(Poison p) {
  return p == Poison::kNanQ       ? "NanQ"
         : p == Poison::kNanK     ? "NanK"
         : p == Poison::kOverflow ? "Overflow"
                                  : "NegInf";
}

// nan[row * h_q + h] (NaiveOutput's row order): whether that output row must be NaN.
struct PoisonPlan {
  std::vector<uint8_t> nan;
  int64_t count = 0;
};

// Poisons the host inputs of `c` (before any device copy) and returns the rows that must be NaN.
inline PoisonPlan poison_inputs(AttentionCase& c, Poison kind, uint64_t seed) {
  const AttentionParams p = c.params();
  const attention::Problem pr = attention::describe(p);
  const attention::HostLayout L(p, pr);
  const int64_t G = pr.h_q / pr.h_kv;
  PoisonPlan plan;
  plan.nan.assign(L.q_rows() * pr.h_q, 0);
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  auto sees_keys = [&](int64_t b, int64_t t) {
    return pr.mask.first_key(t, L.q_len(b), L.kv_len(b)) <=
           pr.mask.last_key(t, L.q_len(b), L.kv_len(b));
  };
  auto mark = [&](int64_t b, int64_t t, int64_t h) {
    uint8_t& m = plan.nan[L.q_row(b, t) * pr.h_q + h];
    plan.count += !m;
    m = 1;
  };
  // The rows (b, t) that see at least one key, and those that see none.
  std::vector<std::pair<int64_t, int64_t>> seeing, blind;
  for (int64_t b = 0; b < pr.batch; ++b)
    for (int64_t t = 0; t < L.q_len(b); ++t) (sees_keys(b, t) ? seeing : blind).push_back({b, t});
  if (kind == Poison::kNegInf) {  // a row with another key to see: one -inf score among finite
    std::erase_if(seeing, [&](const std::pair<int64_t, int64_t>& r) {
      return pr.mask.last_key(r.second, L.q_len(r.first), L.kv_len(r.first)) <=
             pr.mask.first_key(r.second, L.q_len(r.first), L.kv_len(r.first));
    });
  }
  if (seeing.empty()) return plan;
  const auto [b, t] = seeing[pick(static_cast<int64_t>(seeing.size()))];
  const int64_t h = pick(pr.h_q), hk = h / G;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  switch (kind) {
    case Poison::kNanQ: {
      store_float(p.q.data, L.q_offset(b, t, h) + pick(pr.head_dim), p.q.dtype, nan);
      mark(b, t, h);
      if (!blind.empty()) {  // stays "saw no key"
        const auto [bb, tb] = blind[pick(static_cast<int64_t>(blind.size()))];
        store_float(p.q.data, L.q_offset(bb, tb, pick(pr.h_q)) + pick(pr.head_dim), p.q.dtype, nan);
      }
      break;
    }
    case Poison::kNanK: {  // a key that row t sees (so that some row is NaN), and maybe others
      const int64_t first = pr.mask.first_key(t, L.q_len(b), L.kv_len(b));
      const int64_t j = first + pick(pr.mask.last_key(t, L.q_len(b), L.kv_len(b)) - first + 1);
      store_float(p.k.data, L.k_offset(b, j, hk) + pick(pr.head_dim), p.k.dtype, nan);
      for (int64_t tt = 0; tt < L.q_len(b); ++tt)
        if (pr.mask.visible(tt, j, L.q_len(b), L.kv_len(b)))
          for (int64_t hh = hk * G; hh < (hk + 1) * G; ++hh) mark(b, tt, hh);
      break;
    }
    case Poison::kOverflow:
    case Poison::kNegInf: {
      const int64_t first = pr.mask.first_key(t, L.q_len(b), L.kv_len(b));
      const int64_t j = first + pick(pr.mask.last_key(t, L.q_len(b), L.kv_len(b)) - first + 1);
      // q[t] = 1e36 and k[j] = 1e4 everywhere: each product is 1e40, above float32's 3.4e38, so
      // row t's score for key j is +inf (float64 holds it). Other rows that see key j get scores
      // near 1e4, which every path computes exactly. (Scaled scores beyond about 2^31 would not
      // be: the sm80 softmax forms exp2(s * c - max * c) with one FFMA, whose rounding residual
      // then exceeds 128 and the row comes out NaN, as in FlashAttention; docs/hardening.md.)
      // kNegInf: key j = -1e4, so row t's score for it is -inf in float32 and about -1e41 in
      // float64; either way its weight is 0 and the row is what the reference gives, not NaN.
      const float kv = kind == Poison::kOverflow ? 1e4f : -1e4f;
      for (int64_t d = 0; d < pr.head_dim; ++d) {
        store_float(p.q.data, L.q_offset(b, t, h) + d, p.q.dtype, 1e36f);
        store_float(p.k.data, L.k_offset(b, j, hk) + d, p.k.dtype, kv);
      }
      if (kind == Poison::kOverflow) mark(b, t, h);
      break;
    }
  }
  return plan;
}

// Every element of a planned row is NaN (out, and lse when given); no other row holds a NaN.
inline ::testing::AssertionResult nan_rows_as_planned(const NaiveOutput& actual,
                                                      const PoisonPlan& plan) {
  const int64_t Dv = actual.head_dim_v;
  std::ostringstream why;
  int bad = 0;
  for (size_t r = 0; r < plan.nan.size() && bad < 5; ++r) {
    int nans = 0;
    for (int64_t d = 0; d < Dv; ++d) nans += std::isnan(actual.out[r * Dv + d]);
    const bool lse_nan = actual.lse.empty() ? plan.nan[r] != 0 : std::isnan(actual.lse[r]);
    if (plan.nan[r] ? (nans != Dv || !lse_nan) : (nans != 0 || lse_nan)) {
      why << "row " << r / actual.h_q << " head " << r % actual.h_q << ": " << nans << " of " << Dv
          << " outputs NaN, lse " << (actual.lse.empty() ? NAN : actual.lse[r]) << "; expected "
          << (plan.nan[r] ? "all NaN" : "none NaN") << "\n";
      ++bad;
    }
  }
  if (bad) return ::testing::AssertionFailure() << why.str();
  return ::testing::AssertionSuccess();
}

// The planned rows set to NaN in a reference, so that the tolerance check skips them (the float64
// reference does not overflow where float32 does).
inline void skip_planned_rows(NaiveOutput& ref, const PoisonPlan& plan) {
  const int64_t Dv = ref.head_dim_v;
  for (size_t r = 0; r < plan.nan.size(); ++r)
    if (plan.nan[r]) {
      for (int64_t d = 0; d < Dv; ++d) ref.out[r * Dv + d] = NAN;
      ref.lse[r] = NAN;
    }
}

}  // namespace flashserve::testing
