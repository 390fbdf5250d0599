// Properties of the float64 reference itself, checked against facts that do not come from it.
#include <gtest/gtest.h>

#include <cmath>

#include "support/attention_case.h"
#include "support/compare.h"

namespace flashserve::testing {
namespace {

using attention::reference::Emulate;
using attention::reference::naive_forward;

// With one key visible per query, the output is that key's value row exactly.
TEST(NaiveReference, SingleVisibleKeyCopiesValue) {
  CaseSpec s;
  s.q_lens = {9};
  s.kv_lens = {9};
  s.head_dim = 16;
  s.causal = true;
  s.window_left = 0;  // query t sees exactly key t
  s.seed = seed_for("single");
  AttentionCase c(s);
  const auto p = c.params();
  const auto o = naive_forward(p);
  for (int64_t t = 0; t < 9; ++t) {
    for (int64_t d = 0; d < 16; ++d)
      EXPECT_EQ(o.out[t * 16 + d], load_float(p.v.data, t * p.v.stride[1] + d, p.v.dtype));
    // lse of a single score is the score itself.
    double dot = 0;
    for (int64_t d = 0; d < 16; ++d)
      dot += double(load_float(p.q.data, t * p.q.stride[1] + d, p.q.dtype)) *
             load_float(p.k.data, t * p.k.stride[1] + d, p.k.dtype);
    EXPECT_NEAR(o.lse[t], dot * (1.0 / std::sqrt(16.0f)), 1e-12);
  }
}

}  // namespace
}  // namespace flashserve::testing
