// A row's adjustments (model/logits_adjust.h) against a float64 reading of vLLM's documented
// semantics computed token by token (tests/support/vllm_penalties.h), on random logits, tokens,
// penalties, biases, bans and masks.
#include "model/logits_adjust.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "flashserve/error.h"
#include "support/vllm_penalties.h"
#include "test_dirs.h"

namespace flashserve::model {
namespace {

TEST(LogitsAdjust, IsVllmsPenaltiesBiasesAndMasks) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int penalised = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t V = std::uniform_int_distribution<int64_t>(1, 300)(rng);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> logits(static_cast<size_t>(V));
    for (float& x : logits) x = nd(rng);
    // Tokens from a small range, so that they repeat within and across prompt and output.
    std::uniform_int_distribution<int32_t> tok(0,
                                               static_cast<int32_t>(std::min<int64_t>(V, 20) - 1));
    std::vector<int32_t> prompt(std::uniform_int_distribution<size_t>(0, 30)(rng)),
        output(std::uniform_int_distribution<size_t>(0, 30)(rng));
    for (int32_t& t : prompt) t = tok(rng);
    for (int32_t& t : output) t = tok(rng);
    SamplingParams p;
    std::uniform_real_distribution<float> pen(-2.0f, 2.0f);
    if (trial % 2) p.repetition_penalty = std::uniform_real_distribution<float>(0.3f, 3.0f)(rng);
    if (trial % 3) p.presence_penalty = pen(rng);
    if (trial % 5) p.frequency_penalty = pen(rng);
    penalised += p.penalizes();
    std::vector<int32_t> ids(static_cast<size_t>(V));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    const size_t biased = std::uniform_int_distribution<size_t>(0, std::min<size_t>(V, 8))(rng);
    for (size_t i = 0; i < biased; ++i)
      p.logit_bias.emplace_back(ids[i], std::uniform_real_distribution<float>(-100, 100)(rng));
    std::vector<int32_t> banned;
    if (trial % 4 == 0) banned = {tok(rng), tok(rng)};
    std::vector<bool> allowed_set;
    std::vector<uint32_t> allowed;
    if (trial % 7 == 0) {
      allowed_set.resize(static_cast<size_t>(V));
      allowed.assign(static_cast<size_t>((V + 31) / 32), 0u);
      for (int64_t t = 0; t < V; ++t)
        if ((allowed_set[t] = rng() % 3 != 0)) allowed[t / 32] |= 1u << (t % 32);
    }
    const LogitsAdjust a = make_logits_adjust(p, prompt, output, banned, allowed);
    EXPECT_TRUE(std::is_sorted(a.tokens.begin(), a.tokens.end(),
                               [](auto& x, auto& y) { return x.token < y.token; }));
    std::vector<float> got = logits;
    got.push_back(12345.0f);  // past the vocabulary: untouched
    apply_logits_adjust(got.data(), V, a);
    ASSERT_EQ(got.back(), 12345.0f);
    const std::vector<double> want =
        flashserve::testing::vllm_processed_logits(logits, p, prompt, output, banned, allowed_set);
    for (int64_t t = 0; t < V; ++t) {
      if (std::isinf(want[t])) {
        EXPECT_EQ(got[t], -std::numeric_limits<float>::infinity()) << "token " << t;
        continue;
      }
      // Three float operations on values up to ~150: a few float ulps of it.
      EXPECT_NEAR(got[t], want[t], 1e-5 * (1 + std::abs(want[t]))) << "token " << t;
    }
    // Only the tokens it touches are listed (a request without any lists nothing).
    if (!p.penalizes() && p.logit_bias.empty() && banned.empty()) EXPECT_TRUE(a.tokens.empty());
  }
  EXPECT_GT(penalised, 100);
}

TEST(LogitsAdjust, ValidateRefusesWhatHasNoMeaning) {
  const auto refused = [](auto&& set) {
    SamplingParams p;
    set(p);
    try {
      p.validate();
    } catch (const Error& e) {
      return e.argument();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refused([](SamplingParams& p) { p.repetition_penalty = 0; }), "repetition_penalty");
  EXPECT_EQ(refused([](SamplingParams& p) { p.min_p = 1.5f; }), "min_p");
  EXPECT_EQ(refused([](SamplingParams& p) { p.min_tokens = -1; }), "min_tokens");
  EXPECT_EQ(refused([](SamplingParams& p) { p.presence_penalty = NAN; }), "presence_penalty");
  EXPECT_EQ(refused([](SamplingParams& p) {
              p.logit_bias = {{3, 1.0f}, {3, 2.0f}};
            }),
            "logit_bias");
  EXPECT_EQ(refused([](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; }), "logit_bias");
  EXPECT_EQ(refused([](SamplingParams& p) { p.logit_bias = {{1, INFINITY}}; }), "logit_bias");
  EXPECT_EQ(refused([](SamplingParams&) {}), "accepted");
}

}  // namespace
}  // namespace flashserve::model
