// The float64 backward reference against central finite differences of the float64 forward, for
// the loss L = sum(dO o O): every element of q, k and v on small shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attention/problem.h"
#include "support/attention_case.h"
#include "support/finite_diff.h"

namespace flashserve::testing {
namespace {

using attention::reference::naive_backward;
using attention::reference::naive_forward;

void check_grads(CaseSpec s) {
  s.dtype = DType::kFloat32;
  s.with_lse = false;
  s.seed = seed_for(s.name(), 77);
  AttentionCase c(s);
  AttentionParams p = c.params();
  const auto ref = naive_forward(p);
  std::mt19937_64 rng(s.seed + 1);
  std::normal_distribution<double> normal;
  std::vector<double> dout(ref.out.size());
  for (double& x : dout) x = normal(rng);
  TensorView dv_view = p.out;  // out's shape, contiguous float64
  dv_view.data = dout.data();
  dv_view.dtype = DType::kFloat64;
  int64_t st = 1;
  for (int i = dv_view.rank - 1; i >= 0; --i) dv_view.stride[i] = st, st *= dv_view.shape[i];

  const auto g = naive_backward(p, dv_view);
  const FiniteDiffResult ck = finite_diff_check(p, dout, g);
  ASSERT_GT(ck.checked, 0);
  ASSERT_GT(ck.largest, 0.01) << "gradients too small to test anything";
  // Central differences with h = 2^-8 are accurate to O(h^2): ~1e-6 relative on these shapes.
  // (Dropping a tenth of the rowsum(dO o O) term makes the error ~0.1.)
  EXPECT_LE(ck.worst, 2e-5 * ck.largest) << s.name() << ": " << ck.checked << " elements";
}

TEST(NaiveBackward, DenseMatchesFiniteDifferences) {
  CaseSpec s;
  s.q_lens = {5};
  s.kv_lens = {7};
  s.head_dim = 8;
  s.batch = 2;
  check_grads(s);
}

TEST(NaiveBackward, GqaCausalMatchesFiniteDifferences) {
  CaseSpec s;
  s.q_lens = {6};
  s.kv_lens = {9};
  s.h_q = 4;
  s.h_kv = 2;
  s.head_dim = 8;
  s.head_dim_v = 4;
  s.causal = true;
  check_grads(s);
}

TEST(NaiveBackward, MqaWindowQLongerThanKv) {
  CaseSpec s;
  s.q_lens = {7};
  s.kv_lens = {4};  // causal: the first 3 queries see no key and have no gradient
  s.h_q = 3;
  s.h_kv = 1;
  s.head_dim = 4;
  s.causal = true;
  s.window_left = 2;
  check_grads(s);
}

TEST(NaiveBackward, VarlenWithEmptySequence) {
  CaseSpec s;
  s.batch = 3;
  s.q_lens = {3, 0, 5};
  s.kv_lens = {4, 3, 6};
  s.h_q = 2;
  s.h_kv = 1;
  s.head_dim = 8;
  s.q_layout = QLayout::kVarlen;
  s.kv_layout = KVLayout::kVarlen;
  s.window_left = 3;
  s.window_right = 1;
  check_grads(s);
}

}  // namespace
}  // namespace flashserve::testing
