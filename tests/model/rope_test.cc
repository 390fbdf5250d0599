// Each rope type's inverse frequencies and cos/sin factor (src/model/rope.cc) against the float64
// reference of rope_reference.h, on the rope blocks of published configs and on variants that
// move every optional key; plus the bands each rule must produce, computed by hand for
// Qwen2.5's YaRN block, so that a reference sharing a mistake with the code would still fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/rope.h"
#include "rope_reference.h"

namespace flashserve::model {
namespace {

// A Llama config of head_dim 128 with `rope` as its transformers-5 rope_parameters.
ModelConfig with_rope(const std::string& rope, int64_t max_positions = 131072) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                      {"hidden_size", 4096},
                      {"intermediate_size", 14336},
                      {"num_hidden_layers", 32},
                      {"num_attention_heads", 32},
                      {"num_key_value_heads", 8},
                      {"vocab_size", 128256},
                      {"max_position_embeddings", max_positions},
                      {"rope_parameters", nlohmann::json::parse(rope)}};
  return ModelConfig::from_json(j.dump());
}

double plain(double theta, int64_t i, int64_t d) {
  return std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(d));
}

TEST(Rope, EveryTypeMatchesTheFloat64Reference) {
  const char* ropes[] = {
      R"({"rope_type": "default", "rope_theta": 500000.0})",
      R"({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})",
      R"({"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0})",
      R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192, "rope_theta": 500000.0})",
      R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
          "rope_theta": 1000000.0})",
      R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
          "rope_theta": 1000000.0, "truncate": false})",
      R"({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
          "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
          "rope_theta": 10000.0})",
      R"({"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 8192,
          "beta_fast": 16, "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5,
          "rope_theta": 50000.0})",
      R"({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
          "attention_factor": 0.9, "rope_theta": 10000.0})",
      R"({"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 100000,
          "rope_theta": 10000.0})",  // the band clamped at the last dimension
  };
  for (const char* rope : ropes) {
    SCOPED_TRACE(rope);
    const ModelConfig c = with_rope(rope);
    const std::vector<double> ours = rope_inv_freq(c), ref = testing::ref_inv_freq(c);
    ASSERT_EQ(ours.size(), 64u);
    ASSERT_EQ(ref.size(), 64u);
    for (size_t i = 0; i < ours.size(); ++i) EXPECT_NEAR(ours[i], ref[i], 1e-14 * ref[i]) << i;
    EXPECT_NEAR(rope_attention_scaling(c), testing::ref_attention_scaling(c), 1e-15);
  }
}

// Qwen2.5's YaRN block: theta 1e6, d 128, original context 32768, factor 4, beta 32/1. The
// dimension turning 32 times over 32768 positions is 128 ln(32768 / 64 pi) / (2 ln 1e6) = 23.6,
// floored to 23; the one turning once is 39.6, ceiled to 40. Below 23 the frequencies are kept,
// from 40 on divided by 4, and between they blend linearly over 17 steps. cos and sin scale by
// 0.1 ln 4 + 1.
TEST(Rope, YarnBandsOfQwen25AreWhereTheFormulaPutsThem) {
  const ModelConfig c = with_rope(R"({"rope_type": "yarn", "factor": 4.0,
      "original_max_position_embeddings": 32768, "rope_theta": 1000000.0})",
                                  32768);
  const std::vector<double> f = rope_inv_freq(c);
  for (int64_t i = 0; i < 64; ++i) {
    const double p = plain(1e6, i, 128);
    const double ramp = std::clamp((static_cast<double>(i) - 23) / 17, 0.0, 1.0);
    EXPECT_NEAR(f[i], p * (1 - ramp) + p / 4 * ramp, 1e-14 * p) << i;
  }
  EXPECT_DOUBLE_EQ(f[22], plain(1e6, 22, 128));
  EXPECT_DOUBLE_EQ(f[40], plain(1e6, 40, 128) / 4);
  EXPECT_NEAR(rope_attention_scaling(c), 1.1386294361119891, 1e-15);
}

TEST(Rope, LinearLlama3AndDynamicAgainstTheUnscaledFrequencies) {
  const ModelConfig linear =
      with_rope(R"({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})");
  const ModelConfig dynamic =
      with_rope(R"({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})");
  const std::vector<double> l = rope_inv_freq(linear), dy = rope_inv_freq(dynamic);
  for (int64_t i = 0; i < 64; ++i) {
    EXPECT_DOUBLE_EQ(l[i], plain(1e4, i, 128) / 2) << i;
    EXPECT_DOUBLE_EQ(dy[i], plain(1e4, i, 128)) << i;  // below max_position_embeddings
  }
  EXPECT_EQ(rope_attention_scaling(linear), 1.0);
  EXPECT_EQ(rope_attention_scaling(dynamic), 1.0);
  // Llama 3.1: wavelengths above 8192 are divided by 8, those below 2048 kept (both occur).
  const ModelConfig l3 = with_rope(R"({"rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
      "rope_theta": 500000.0})");
  const std::vector<double> f = rope_inv_freq(l3);
  int slowed = 0, kept = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const double p = plain(5e5, i, 128), wavelength = 2 * std::numbers::pi / p;
    if (wavelength > 8192) {
      EXPECT_DOUBLE_EQ(f[i], p / 8) << i;
      ++slowed;
    }
    if (wavelength < 2048) {
      EXPECT_DOUBLE_EQ(f[i], p) << i;
      ++kept;
    }
  }
  EXPECT_GT(slowed, 0);
  EXPECT_GT(kept, 0);
}

// yarn's factor left null is the context's growth (transformers 5): 131072 / 32768 = 4.
TEST(Rope, YarnWithoutFactorTakesTheContextsGrowth) {
  const ModelConfig c = with_rope(R"({"rope_type": "yarn", "factor": null,
      "original_max_position_embeddings": 32768, "rope_theta": 1000000.0})");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);
}

TEST(Rope, ApplyRopeRotatesPairsAndScales) {
  const ModelConfig c = with_rope(R"({"rope_type": "default", "rope_theta": 10000.0})");
  const std::vector<double> f = rope_inv_freq(c);
  std::vector<float> x(128);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(1.7 * i + 0.3));
  std::vector<float> y = x;
  apply_rope(y.data(), 1, 128, 128, 37, f, 1.25);
  for (int64_t i = 0; i < 64; ++i) {
    const double a = 37 * f[i], co = std::cos(a) * 1.25, s = std::sin(a) * 1.25;
    EXPECT_NEAR(y[i], x[i] * co - x[i + 64] * s, 1e-5) << i;
    EXPECT_NEAR(y[i + 64], x[i + 64] * co + x[i] * s, 1e-5) << i;
  }
}

}  // namespace
}  // namespace flashserve::model
