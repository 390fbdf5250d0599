// Split-KV: cutting each sequence's keys into splits, then merging the partials with the combine
// step, gives the unsplit result to float rounding; and the combine itself is checked on partials
// computed independently in double.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "attention/backends.h"
#include "attention/reference/combine.h"
#include "attention/reference/cpu_forward.h"
#include "common/thread_pool.h"
#include "support/attention_case.h"
#include "support/compare.h"

namespace flashserve::testing {
namespace {

NaiveOutput run_with_splits(AttentionCase& c, int32_t splits) {
  AttentionParams p = c.params();
  p.num_splits = splits;
  c.poison_outputs();
  attention_forward(p);
  return read_output(p);
}

// Max |a - b| relative to the largest |b|; NaN counts as infinitely wrong. -inf must match.
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i]) && a[i] == b[i]) continue;
    if (std::isnan(b[i])) continue;
    const double d = std::abs(a[i] - b[i]);
    m = std::max(m, std::isnan(d) ? INFINITY : d);
    scale = std::max(scale, std::abs(b[i]));
  }
  return m / std::max(scale, 1.0);
}

struct SplitCase {
  CaseSpec spec;
  double out_tol;  // relative to the output's magnitude
};

void expect_splits_match(CaseSpec s, double out_tol) {
  s.seed = seed_for(s.name(), 5);
  AttentionCase c(s);
  const NaiveOutput whole = run_with_splits(c, 1);
  expect_attention_close(whole, c.exact(), c.lowp(), s.dtype);
  for (int32_t splits : {2, 3, 7, 0}) {
    const NaiveOutput split = run_with_splits(c, splits);
    EXPECT_LE(rel_diff(split.out, whole.out), out_tol) << s.name() << " splits " << splits;
    EXPECT_LE(rel_diff(split.lse, whole.lse), 2e-6) << s.name() << " splits " << splits;
  }
}

TEST(SplitKv, DecodeLongContextFloat32) {
  CaseSpec s;
  s.q_lens = {1};
  s.kv_lens = {1000};
  s.batch = 2;
  s.h_q = 8;
  s.h_kv = 2;
  expect_splits_match(s, 2e-6);
}

TEST(SplitKv, PagedVarlenCausalWithShortSequences) {
  // Sequence lengths 2 and 0 leave most splits empty (lse -inf partials); 1 query sees no key.
  CaseSpec s;
  s.batch = 4;
  s.q_lens = {3, 1, 4, 2};
  s.kv_lens = {700, 2, 0, 129};
  s.q_layout = QLayout::kVarlen;
  s.kv_layout = KVLayout::kPaged;
  s.page_size = 16;
  s.h_q = 4;
  s.h_kv = 4;
  s.causal = true;
  s.window_left = 300;
  expect_splits_match(s, 2e-6);
}

TEST(SplitKv, MoreQueriesThanKeysCausalWindow) {
  // q_len > kv_len: the first 100 queries sit before every key (fully masked in every split), and
  // the window leaves the later queries keys in only some of the splits.
  CaseSpec s;
  s.q_lens = {400};
  s.kv_lens = {300};
  s.h_q = 2;
  s.h_kv = 1;
  s.causal = true;
  s.window_left = 100;
  expect_splits_match(s, 2e-6);
}

TEST(SplitKv, Bf16OutputWithinOneRounding) {
  CaseSpec s;
  s.q_lens = {5};
  s.kv_lens = {513};
  s.dtype = DType::kBFloat16;
  s.h_q = 2;
  s.h_kv = 1;
  expect_splits_match(s, 1.0 / 128);  // one bf16 ulp near the output's magnitude
}

// Many splits over many rows: the CPU path holds the partials of a bounded chunk of rows at a time
// (issue 9), so here the chunks end inside sequences and between them, across varlen sequences
// of unequal (and zero) lengths; every row is still combined once and matches the reference.
TEST(SplitKv, ChunkedPartialsAcrossVarlenSequences) {
  CaseSpec s;
  s.batch = 5;
  s.q_layout = QLayout::kVarlen;
  s.kv_layout = KVLayout::kVarlen;
  s.q_lens = {700, 0, 333, 1, 129};
  s.kv_lens = {900, 5, 333, 64, 1000};
  s.h_q = 4;
  s.h_kv = 2;
  s.head_dim = 32;
  s.causal = true;
  s.num_splits = 200;  // partials of 200 x 4 x 33 floats a row: ~250 rows per chunk
  s.seed = seed_for(s.name());
  AttentionCase c(s);
  const attention::Problem pr = attention::describe(c.params());
  ASSERT_LT(attention::cpu_scratch_bytes(pr, c.q_rows(), ThreadPool::global().size()),
            attention::SplitPartials::bytes(200, c.q_rows(), 4, 32))
      << "the rows must not fit one chunk";
  c.poison_outputs();
  attention_forward(c.params());
  expect_attention_close(read_output(c.params()), c.exact(), c.lowp(), s.dtype);
}

TEST(SplitKv, AutomaticSplitsOnlyWhenTilesAreFewAndKeysLong) {
  CaseSpec s;
  s.q_lens = {1};
  s.kv_lens = {4096};
  s.num_splits = 0;
  AttentionCase c(s);
  const attention::Problem decode = attention::describe(c.params());
  EXPECT_GT(attention::cpu_num_splits(decode, 8), 1);
  EXPECT_EQ(attention::cpu_num_splits(decode, 1), 1);  // one worker: nothing to gain
  CaseSpec t = s;
  t.kv_lens = {100};  // too few keys for several blocks per split
  AttentionCase c2(t);
  EXPECT_EQ(attention::cpu_num_splits(attention::describe(c2.params()), 8), 1);
  CaseSpec u = s;
  u.q_lens = {4096};  // many query tiles already
  AttentionCase c3(u);
  EXPECT_EQ(attention::cpu_num_splits(attention::describe(c3.params()), 8), 1);
}

TEST(SplitKv, AutomaticSplitRunsAndMatchesWithFourWorkers) {
  ThreadPool::set_global_workers(4);
  CaseSpec s;
  s.q_lens = {1};
  s.kv_lens = {2048};
  s.h_q = 2;
  s.h_kv = 1;
  s.seed = seed_for("auto4");
  AttentionCase c(s);
  ASSERT_GT(attention::cpu_num_splits(
                [&] {
                  auto p = c.params();
                  p.num_splits = 0;
                  return attention::describe(p);
                }(),
                4),
            1);
  const NaiveOutput whole = run_with_splits(c, 1);
  const NaiveOutput automatic = run_with_splits(c, 0);
  ThreadPool::set_global_workers(0);
  EXPECT_LE(rel_diff(automatic.out, whole.out), 2e-6);
  EXPECT_LE(rel_diff(automatic.lse, whole.lse), 2e-6);
  expect_attention_close(automatic, c.exact(), c.lowp(), s.dtype);
}

// combine_row against partials computed in double from explicit scores, including empty splits.
TEST(Combine, MergesPartialsLikeOneSoftmax) {
  std::mt19937_64 rng(99);
  std::normal_distribution<double> normal(0, 3);
  const int64_t S = 5, Dv = 7, n = 40;
  std::vector<double> x(n), v(n * Dv);
  for (auto& e : x) e = normal(rng);
  for (auto& e : v) e = normal(rng);
  // Whole softmax in double.
  double m = -INFINITY, sum = 0;
  for (double e : x) m = std::max(m, e);
  std::vector<double> ref(Dv, 0);
  for (int64_t j = 0; j < n; ++j) {
    const double p = std::exp(x[j] - m);
    sum += p;
    for (int64_t d = 0; d < Dv; ++d) ref[d] += p * v[j * Dv + d];
  }
  for (auto& e : ref) e /= sum;
  const double ref_lse = m + std::log(sum);
  // Splits [0,10) [10,10) [10,25) [25,40) [40,40): two are empty.
  const int64_t cuts[S + 1] = {0, 10, 10, 25, 40, 40};
  std::vector<float> out(S * Dv), lse(S);
  for (int64_t s = 0; s < S; ++s) {
    double ms = -INFINITY, ls = 0;
    for (int64_t j = cuts[s]; j < cuts[s + 1]; ++j) ms = std::max(ms, x[j]);
    std::vector<double> o(Dv, 0);
    for (int64_t j = cuts[s]; j < cuts[s + 1]; ++j) {
      const double p = std::exp(x[j] - ms);
      ls += p;
      for (int64_t d = 0; d < Dv; ++d) o[d] += p * v[j * Dv + d];
    }
    lse[s] = ls > 0 ? static_cast<float>(ms + std::log(ls)) : -INFINITY;
    for (int64_t d = 0; d < Dv; ++d) out[s * Dv + d] = ls > 0 ? static_cast<float>(o[d] / ls) : 0;
  }
  attention::SplitPartials parts{out.data(), lse.data(), S, 1, 1, Dv};
  std::vector<float> merged(Dv);
  float merged_lse;
  attention::combine_row(parts, 0, 0, merged.data(), &merged_lse);
  for (int64_t d = 0; d < Dv; ++d) EXPECT_NEAR(merged[d], ref[d], 1e-5) << d;
  EXPECT_NEAR(merged_lse, ref_lse, 1e-5);

  // Every split empty: zero output, lse -inf.
  std::fill(lse.begin(), lse.end(), -INFINITY);
  std::fill(out.begin(), out.end(), 0.0f);
  attention::combine_row(parts, 0, 0, merged.data(), &merged_lse);
  EXPECT_EQ(merged_lse, -INFINITY);
  for (float e : merged) EXPECT_EQ(e, 0.0f);
}

}  // namespace
}  // namespace flashserve::testing
