// The P99 TBT SLOs of a capacity search (serve/tbt_slo.h): the list's syntax, Sarathi-Serve's
// strict and relaxed SLOs as 5x and 25x the reference decode step of a synthetic profile whose
// costs are closed forms, and the capacity probe's request floor (serve/capacity.h).
#include "serve/tbt_slo.h"

#include <gtest/gtest.h>

#include "flashserve/error.h"
#include "serve/capacity.h"
#include "support/linear_profile.h"

namespace fs = flashserve::serve;

namespace {

std::string refusal(const std::string& list) {
  try {
    fs::parse_tbt_slos(list);
  } catch (const flashserve::Error& e) {
    EXPECT_EQ(e.argument(), "slo_tbt");
    return e.what();
  }
  return "accepted";
}

TEST(TbtSlo, ParsesNamesAndSeconds) {
  const auto s = fs::parse_tbt_slos("strict,relaxed,0.1,5e-1");
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].kind, fs::TbtSloSpec::Kind::kStrict);
  EXPECT_EQ(s[1].kind, fs::TbtSloSpec::Kind::kRelaxed);
  EXPECT_EQ(s[2].kind, fs::TbtSloSpec::Kind::kSeconds);
  EXPECT_EQ(s[2].seconds, 0.1);
  EXPECT_EQ(s[3].seconds, 0.5);
}

TEST(TbtSlo, RefusesWhatItDoesNotUnderstand) {
  EXPECT_NE(refusal("").find("empty entry"), std::string::npos);
  EXPECT_NE(refusal("0.1,,0.5").find("empty entry"), std::string::npos);
  EXPECT_NE(refusal("0.1,").find("empty entry"), std::string::npos);
  EXPECT_NE(refusal("fast").find("'fast' is neither strict, relaxed nor a number"),
            std::string::npos);
  EXPECT_NE(refusal("0.1s").find("'0.1s' is neither"), std::string::npos);
  EXPECT_NE(refusal("nan").find("'nan' is neither"), std::string::npos);
  EXPECT_NE(refusal("0").find("outside (0, 3600]"), std::string::npos);
  EXPECT_NE(refusal("-0.1").find("outside (0, 3600]"), std::string::npos);
  EXPECT_NE(refusal("4000").find("outside (0, 3600]"), std::string::npos);
  EXPECT_NE(refusal("strict,0.1,strict").find("'strict' is given twice"), std::string::npos);
}

// decode_base(32) = 2 ms + 32 x 10 us; decode_attn(32, 4096) = 32 x 4096 x 1 ns.
TEST(TbtSlo, StrictAndRelaxedScaleTheReferenceDecodeStep) {
  const fs::ProfileCostModel cost(flashserve::testing::linear_profile(2e-3, 1e-5, 1e-9), "lin");
  const double step = 2e-3 + 32 * 1e-5 + 32 * 4096 * 1e-9;
  int64_t ctx = 0;
  EXPECT_NEAR(fs::reference_decode_step_s(cost, 8192, 1 << 20, &ctx), step, 1e-12);
  EXPECT_EQ(ctx, 4096);
  const auto slos =
      fs::resolve_tbt_slos(fs::parse_tbt_slos("strict,relaxed,0.25"), cost, 8192, 1 << 20);
  ASSERT_EQ(slos.size(), 3u);
  EXPECT_NEAR(slos[0].seconds, 5 * step, 1e-12);
  EXPECT_NEAR(slos[1].seconds, 25 * step, 1e-12);
  EXPECT_EQ(slos[2].seconds, 0.25);
  EXPECT_EQ(slos[0].label.rfind("strict (5 x", 0), 0u) << slos[0].label;
  EXPECT_EQ(slos[1].label.rfind("relaxed (25 x", 0), 0u) << slos[1].label;
  EXPECT_EQ(slos[2].label, "0.25 s");
}

// A small model's context and pool: 32 decodes at max_model_len, or at what the pool holds.
TEST(TbtSlo, TheReferenceContextIsCutToTheModelAndThePool) {
  const fs::ProfileCostModel cost(flashserve::testing::linear_profile(2e-3, 1e-5, 1e-9), "lin");
  int64_t ctx = 0;
  EXPECT_NEAR(fs::reference_decode_step_s(cost, 1000, 1 << 20, &ctx),
              2e-3 + 32 * 1e-5 + 32 * 1000 * 1e-9, 1e-12);
  EXPECT_EQ(ctx, 1000);
  fs::reference_decode_step_s(cost, 8192, 32 * 100, &ctx);
  EXPECT_EQ(ctx, 100);
}

TEST(CapacityRequests, AProbeNeedsTheFloorOfRequests) {
  EXPECT_NO_THROW(fs::check_capacity_requests(fs::kMinCapacityRequests, fs::kMinCapacityRequests));
  try {
    fs::check_capacity_requests(999, 1000);
    ADD_FAILURE() << "999 requests accepted";
  } catch (const flashserve::Error& e) {
    EXPECT_EQ(e.argument(), "requests");
    EXPECT_NE(std::string(e.what()).find("999 requests are too few for a capacity probe: at least "
                                         "1000"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
