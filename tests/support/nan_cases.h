// The NaN/infinity cases the CPU and the GPU tests share (see nan_inputs.h): masks with rows that
// see no key, paged KV, GQA and MQA, split-KV, every poison kind. Dense q (the plan's row order).
#pragma once

#include <string>
#include <vector>

#include "support/attention_case.h"
#include "support/compare.h"
#include "support/nan_inputs.h"

namespace flashserve::testing {

struct NanCase {
  CaseSpec spec;
  Poison poison;
  std::string name() const { return spec.name() + "_" + poison_name(poison); }
};

inline void PrintTo(const NanCase& c, std::ostream* os) {
  *os << c.name();
}

// head_dims: what the backend under test supports (the CPU any, sm80 64/128/256).
inline std::vector<NanCase> nan_cases(const std::vector<DType>& dtypes) {
  std::vector<CaseSpec> shapes;
  {
    CaseSpec s;  // causal with more queries than keys: the first 10 rows see no key
    s.batch = 2, s.q_lens = {40}, s.kv_lens = {30}, s.h_q = 4, s.h_kv = 4, s.head_dim = 64;
    s.causal = true;
    shapes.push_back(s);
  }
  {
    CaseSpec s;  // paged, GQA 4, sliding window
    s.batch = 2, s.q_lens = {17}, s.kv_lens = {200}, s.h_q = 8, s.h_kv = 2, s.head_dim = 64;
    s.kv_layout = KVLayout::kPaged, s.page_size = 16, s.window_left = 50, s.window_right = 0;
    shapes.push_back(s);
  }
  {
    CaseSpec s;  // decode, MQA, split-KV
    s.batch = 3, s.q_lens = {1}, s.kv_lens = {300}, s.h_q = 8, s.h_kv = 1, s.head_dim = 128;
    s.num_splits = 3;
    shapes.push_back(s);
  }
  {
    CaseSpec s;  // no mask, split-KV, head dim 256
    s.batch = 1, s.q_lens = {64}, s.kv_lens = {130}, s.h_q = 2, s.h_kv = 2, s.head_dim = 256;
    s.num_splits = 2;
    shapes.push_back(s);
  }
  std::vector<NanCase> cases;
  for (const CaseSpec& shape : shapes)
    for (DType dt : dtypes)
      for (Poison p : {Poison::kNanQ, Poison::kNanK, Poison::kOverflow}) {
        if (p == Poison::kOverflow && dt == DType::kFloat16) continue;  // 1e36 is inf in fp16
        NanCase c{shape, p};
        c.spec.dtype = dt;
        c.spec.seed = seed_for(c.name());
        cases.push_back(c);
      }
  return cases;
}

// The NaN rule on one case, for any path: poisons the case's inputs as planned, runs
// `run(case)` (which returns the output read back), and expects the planned rows NaN (out and
// lse) in the reference and the output, no other row NaN, and the rest within the tests'
// tolerance. A -inf score poisons no row (it weighs 0); every other poison at least one.
template <class Run>
void expect_nan_rule(const NanCase& nc, Run run, const std::string& path) {
  AttentionCase c(nc.spec);
  const PoisonPlan plan = poison_inputs(c, nc.poison, nc.spec.seed);
  if (nc.poison == Poison::kNegInf)
    ASSERT_EQ(plan.count, 0);
  else
    ASSERT_GT(plan.count, 0);
  NaiveOutput exact = c.exact(), lowp = c.lowp();
  // The references first: float64 sees the NaNs; only float32 arithmetic overflows.
  EXPECT_TRUE(nan_rows_as_planned(nc.poison == Poison::kOverflow ? lowp : exact, plan))
      << "reference";
  const NaiveOutput actual = run(c);
  EXPECT_TRUE(nan_rows_as_planned(actual, plan)) << path;
  skip_planned_rows(exact, plan);
  skip_planned_rows(lowp, plan);
  expect_attention_close(actual, exact, lowp, nc.spec.dtype);
}

}  // namespace flashserve::testing
