// --budget auto's offline choice (serve/auto_budget.h) on a synthetic profile whose step costs are
// closed forms (tests/support/linear_profile.h), against budgets computed by hand.
#include "serve/auto_budget.h"

#include <gtest/gtest.h>

#include "flashserve/error.h"
#include "support/linear_profile.h"

namespace fs = flashserve::serve;

namespace {

constexpr double kBase = 2e-3, kPerToken = 1e-5;  // linear(T) = 2 ms + 10 us x T

fs::AutoBudgetConfig config(double slo, int64_t pool_tokens = 100000) {
  fs::AutoBudgetConfig c;
  c.slo_tbt_s = slo;
  c.tile = 64;
  c.max_running = 16;
  c.max_model_len = 8192;
  c.pool_tokens = pool_tokens;
  return c;
}

// Without attention costs every step of B tokens costs linear(B): the budget is the largest
// multiple of 64 with 2 ms + 10 us x B <= SLO.
TEST(AutoBudget, WithoutAttentionTheBudgetIsTheLargestTileUnderTheSlo) {
  const fs::ProfileCostModel cost(flashserve::testing::linear_profile(kBase, kPerToken, 0), "lin");
  // 6.7 ms: B <= 470 -> 448 (512 would take 7.12 ms).
  const fs::BudgetChoice c = fs::choose_budget(cost, config(6.7e-3));
  EXPECT_EQ(c.budget, 448);
  EXPECT_TRUE(c.meets);
  EXPECT_NEAR(c.worst_s, kBase + kPerToken * 448, 1e-12);
  EXPECT_EQ(fs::choose_budget(cost, config(7.2e-3)).budget, 512);  // 7.12 ms fits now
}

// With decode attention (10 ns per key), the worst step of a budget holds max_running (16)
// decodes at the reference context, 4096 keys each: 16 x 4096 x 10 ns = 0.655 ms more, so under
// 6.7 ms B <= 404.5 -> 384.
TEST(AutoBudget, TheWorstMixedStepHoldsEveryDecodeAtTheReferenceContext) {
  const fs::ProfileCostModel cost(flashserve::testing::linear_profile(kBase, kPerToken, 1e-8),
                                  "lin");
  const fs::AutoBudgetConfig c = config(6.7e-3);
  EXPECT_NEAR(fs::worst_mixed_step_s(cost, c, 448), kBase + kPerToken * 448 + 1e-8 * 16 * 4096,
              1e-12);
  EXPECT_EQ(fs::choose_budget(cost, c).budget, 384);
}

// A pool of 8192 + 16 x 1000 tokens holds the longest chunk's keys and 1000 keys per decode: the
// decodes cost 16 x 1000 x 10 ns = 0.16 ms, so B <= 454 -> 448.
TEST(AutoBudget, ThePoolBoundsTheDecodesContexts) {
  const fs::ProfileCostModel cost(flashserve::testing::linear_profile(kBase, kPerToken, 1e-8),
                                  "lin");
  const fs::AutoBudgetConfig c = config(6.7e-3, 8192 + 16 * 1000);
  EXPECT_NEAR(fs::worst_mixed_step_s(cost, c, 448), kBase + kPerToken * 448 + 1e-8 * 16 * 1000,
              1e-12);
  EXPECT_EQ(fs::choose_budget(cost, c).budget, 448);
}

// An SLO no budget meets: the smallest budget (max_running in tiles), flagged.
TEST(AutoBudget, NoBudgetMeetingTheSloStartsAtTheSmallest) {
  const fs::ProfileCostModel cost(flashserve::testing::linear_profile(kBase, kPerToken, 0), "lin");
  fs::AutoBudgetConfig c = config(1e-3);
  c.max_running = 100;  // 128 in tiles of 64
  const fs::BudgetChoice b = fs::choose_budget(cost, c);
  EXPECT_EQ(b.budget, 128);
  EXPECT_FALSE(b.meets);
  EXPECT_NEAR(b.worst_s, kBase + kPerToken * 128, 1e-12);
}

TEST(AutoBudget, BadConfigurationsAreNamed) {
  const fs::ProfileCostModel cost(flashserve::testing::linear_profile(kBase, kPerToken, 0), "lin");
  auto field = [&](fs::AutoBudgetConfig c) {
    try {
      fs::choose_budget(cost, c);
    } catch (const flashserve::Error& e) {
      return e.argument();
    }
    return std::string("accepted");
  };
  fs::AutoBudgetConfig c = config(0);
  EXPECT_EQ(field(c), "slo_tbt_s");
  c = config(1e-2, 100);
  EXPECT_EQ(field(c), "pool_tokens");
  c = config(1e-2);
  c.max_budget = 10;
  EXPECT_EQ(field(c), "max_budget");
}

}  // namespace
