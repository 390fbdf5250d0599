// The score modifiers (softcap, ALiBi: src/attention/score_mod.h) on their own: the reference and
// the CPU path against attention written out by hand from the definition on a tiny problem, the
// vectorisable tanh against std::tanh, and the plan's check that a run keeps the planned
// modifiers. (The CPU forward and backward against the reference on random shapes:
// cpu_forward_test.cc and cpu_backward_test.cc; validation: validation_test.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention/problem.h"
#include "attention/reference/naive.h"
#include "attention/score_mod.h"
#include "support/compare.h"

namespace flashserve::testing {
namespace {

TensorView f32(float* data, std::initializer_list<int64_t> shape) {
  return make_view(data, DType::kFloat32, shape);
}

// A dense call of one sequence and one head of dim 2: q_len queries, kv_len keys.
AttentionParams one_head(float* q, float* k, float* v, float* out, int64_t q_len, int64_t kv_len) {
  AttentionParams p;
  p.q = f32(q, {1, q_len, 1, 2});
  p.k = f32(k, {1, kv_len, 1, 2});
  p.v = f32(v, {1, kv_len, 1, 2});
  p.out = f32(out, {1, q_len, 1, 2});
  return p;
}

// One sequence, one head, d = 2: 2 queries and 3 keys, so query t sits at position p = 1 + t
// and ALiBi's |p - j| has keys on both sides of query 0. Written out from the definition:
//   s_tj = c tanh(scale q_t.k_j / c) - slope |p - j|,  out_t = sum_j softmax_j(s_t) v_j.
TEST(ScoreMod, ReferenceAndCpuPathMatchTheDefinitionByHand) {
  float q[2 * 2] = {0.9f, -0.4f, -1.3f, 0.7f};
  float k[3 * 2] = {1.5f, 0.2f, -0.8f, 2.1f, 0.3f, -1.7f};
  float v[3 * 2] = {1.0f, 0.0f, 0.0f, 1.0f, 2.0f, 3.0f};
  const float scale = 1.3f, cap = 0.9f, slope = 0.4f;
  for (bool capped : {false, true})
    for (bool alibi : {false, true}) {
      float out[2 * 2], lse[2];
      std::fill(std::begin(out), std::end(out), NAN);
      std::fill(std::begin(lse), std::end(lse), NAN);
      float slopes[1] = {slope};
      AttentionParams p = one_head(q, k, v, out, 2, 3);
      p.lse = f32(lse, {1, 1, 2});
      p.softmax_scale = scale;
      p.softcap = capped ? cap : 0.0f;
      if (alibi) p.alibi_slopes = f32(slopes, {1});
      const auto ref = attention::reference::naive_forward(p);
      attention_forward(p);
      for (int t = 0; t < 2; ++t) {
        double s[3], m = -INFINITY;
        for (int j = 0; j < 3; ++j) {
          const double dot = double(q[2 * t]) * k[2 * j] + double(q[2 * t + 1]) * k[2 * j + 1];
          s[j] = double(scale) * dot;
          if (capped) s[j] = cap * std::tanh(s[j] / cap);
          if (alibi) s[j] -= slope * std::abs(1 + t - j);
          m = std::max(m, s[j]);
        }
        double sum = 0, o[2] = {0, 0};
        for (int j = 0; j < 3; ++j) {
          const double w = std::exp(s[j] - m);
          sum += w;
          o[0] += w * v[2 * j];
          o[1] += w * v[2 * j + 1];
        }
        const double want_lse = m + std::log(sum);
        EXPECT_NEAR(ref.lse[t], want_lse, 1e-12) << "t " << t;
        EXPECT_NEAR(lse[t], want_lse, 2e-6) << "t " << t;
        for (int d = 0; d < 2; ++d) {
          EXPECT_NEAR(ref.out[2 * t + d], o[d] / sum, 1e-12) << "t " << t << " d " << d;
          EXPECT_NEAR(out[2 * t + d], o[d] / sum, 2e-6) << "t " << t << " d " << d;
        }
      }
    }
}

// The CPU path's tanh (one polynomial below 0.3, exp-based above) against std::tanh on both
// sides of the switch and into saturation, plus the special values.
TEST(ScoreMod, VectorisableTanhMatchesStdTanh) {
  double worst = 0;
  for (double x = 1e-7; x < 40; x *= 1.0007)
    for (double sx : {x, -x}) {
      const float xf = static_cast<float>(sx);
      const double want = std::tanh(double(xf));
      worst = std::max(worst, std::abs(attention::tanh_float(xf) - want) / std::abs(want));
    }
  EXPECT_LE(worst, 4e-7);
  EXPECT_EQ(attention::tanh_float(0.0f), 0.0f);
  EXPECT_EQ(attention::tanh_float(INFINITY), 1.0f);
  EXPECT_EQ(attention::tanh_float(-INFINITY), -1.0f);
  EXPECT_TRUE(std::isnan(attention::tanh_float(NAN)));
}

// With softcap, a score of +inf is capped to softcap: the row is finite (without it, NaN).
TEST(ScoreMod, SoftcapCapsAnInfiniteScore) {
  float q[2] = {INFINITY, 0.0f};
  float k[2 * 2] = {1.0f, 0.0f, -1.0f, 0.5f};
  float v[2 * 2] = {1.0f, 2.0f, 3.0f, 4.0f};
  float out[2], lse[1];
  AttentionParams p = one_head(q, k, v, out, 1, 2);
  p.lse = f32(lse, {1, 1, 1});
  p.softcap = 2.0f;
  attention_forward(p);
  // Scores +2 and -2 (tanh(+-inf)): weights e^2 and e^-2.
  const double w0 = std::exp(2.0), w1 = std::exp(-2.0);
  EXPECT_NEAR(out[0], (w0 * 1 + w1 * 3) / (w0 + w1), 1e-6);
  EXPECT_NEAR(out[1], (w0 * 2 + w1 * 4) / (w0 + w1), 1e-6);
  EXPECT_NEAR(lse[0], std::log(w0 + w1), 1e-6);
}

// A plan remembers the modifiers it was made with; a run with others is refused, not silently
// run with the plan's.
TEST(ScoreMod, RunRefusesParamsWhoseModifiersDifferFromThePlan) {
  float q[4] = {1, 2, 3, 4}, k[4] = {1, 0, 0, 1}, v[4] = {1, 2, 3, 4}, out[4], slopes[1] = {0.5f};
  const AttentionParams p = one_head(q, k, v, out, 2, 2);
  const AttentionPlan plan = plan_attention(p);
  for (int which = 0; which < 2; ++which) {
    AttentionParams other = p;
    if (which == 0) other.softcap = 3.0f;
    if (which == 1) other.alibi_slopes = f32(slopes, {1});
    try {
      run_attention(plan, other);
      ADD_FAILURE() << "run_attention accepted different modifiers";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "plan");
      EXPECT_NE(std::string(e.what()).find("softcap or alibi_slopes"), std::string::npos)
          << e.what();
    }
  }
  run_attention(plan, p);  // the planned ones run
}

}  // namespace
}  // namespace flashserve::testing
