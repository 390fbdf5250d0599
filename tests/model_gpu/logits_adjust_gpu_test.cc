// The GPU's half of the logits adjustments and min-p (lead: run on the device): the adjust
// kernel gives bit for bit the CPU's apply_logits_adjust (the same float arithmetic, shared
// adjusted_logit), and the sampler with min_p draws the CPU sampler's token.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "model/cuda/logits_adjust.h"
#include "model/cuda/sample.h"
#include "model/logits_adjust.h"
#include "model/sampling.h"
#include "model_gpu/device_buffer.h"

namespace flashserve::testing {
namespace {

using model::LogitsAdjust;
using model::SamplingParams;
using model::TokenAdjust;
using model::cuda::RowSampling;

TEST(GpuLogitsAdjust, KernelIsTheCpusAdjustBitForBit) {
  SKIP_WITHOUT_CUDA();
  for (int64_t vocab : {1000, 32000, 151936}) {
    std::mt19937 rng(static_cast<unsigned>(vocab));
    std::normal_distribution<float> dist(0.0f, 3.0f);
    const int64_t rows = 9, words = (vocab + 31) / 32;
    std::vector<float> logits(rows * vocab);
    for (auto& x : logits) x = dist(rng);
    std::vector<LogitsAdjust> adjust;
    for (int64_t r = 0; r < rows; ++r) {
      SamplingParams p;
      if (r % 2) p.repetition_penalty = 1.3f;
      if (r % 3) p.presence_penalty = 0.7f, p.frequency_penalty = -0.4f;
      std::vector<int32_t> prompt(50), output(70), banned;
      for (auto& t : prompt) t = static_cast<int32_t>(rng() % 200);
      for (auto& t : output) t = static_cast<int32_t>(rng() % 200);
      if (r % 4 == 0) p.logit_bias = {{static_cast<int32_t>(vocab - 1), 5.0f}, {3, -100.0f}};
      if (r == 5) banned = {1, 2, static_cast<int32_t>(vocab - 2)};
      std::vector<uint32_t> allowed;
      if (r % 3 == 2) {  // a grammar's mask on some rows
        allowed.resize(words);
        for (auto& w : allowed) w = static_cast<uint32_t>(rng());
      }
      adjust.push_back(r == 7 ? LogitsAdjust{}  // a row without adjustments among the others
                              : model::make_logits_adjust(p, prompt, output, banned, allowed));
    }
    std::vector<int64_t> offsets = {0};
    std::vector<TokenAdjust> tokens;
    std::vector<uint32_t> masks;
    for (const LogitsAdjust& a : adjust) {
      tokens.insert(tokens.end(), a.tokens.begin(), a.tokens.end());
      offsets.push_back(static_cast<int64_t>(tokens.size()));
      if (a.allowed.empty())
        masks.insert(masks.end(), words, ~0u);
      else
        masks.insert(masks.end(), a.allowed.begin(), a.allowed.end());
    }
    DeviceBuffer<float> d_logits(logits), d_out(logits.size(), NAN);
    DeviceBuffer<int64_t> d_offsets(offsets);
    DeviceBuffer<TokenAdjust> d_tokens(tokens);
    DeviceBuffer<uint32_t> d_masks(masks);
    model::cuda::DeviceAdjust da{d_offsets.get(), d_tokens.get(), d_masks.get()};
    model::cuda::adjust_logits(d_logits.get(), d_out.get(), da, rows, vocab, nullptr);
    const std::vector<float> got = d_out.download();
    EXPECT_EQ(d_logits.download(), logits);  // the kept logits are not touched
    int64_t mismatches = 0;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> want(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
      model::apply_logits_adjust(want.data(), vocab, adjust[r]);
      for (int64_t t = 0; t < vocab; ++t)
        if (std::memcmp(&got[r * vocab + t], &want[t], 4) != 0 && ++mismatches < 10)
          ADD_FAILURE() << "vocab " << vocab << " row " << r << " token " << t << ": gpu "
                        << got[r * vocab + t] << " cpu " << want[t];
    }
    EXPECT_EQ(mismatches, 0);
  }
}

TEST(GpuLogitsAdjust, MinPMatchesTheCpuSampler) {
  SKIP_WITHOUT_CUDA();
  for (int64_t vocab : {32000, 151936}) {
    std::mt19937 rng(static_cast<unsigned>(vocab) + 1);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    std::vector<RowSampling> rows;
    std::vector<SamplingParams> params;
    for (float t : {0.5f, 1.0f, 1.7f})
      for (float min_p : {0.01f, 0.1f, 0.5f, 0.95f})
        for (int32_t k : {0, 20}) {
          SamplingParams sp;
          sp.temperature = t;
          sp.top_k = k;
          sp.min_p = min_p;
          sp.top_p = k ? 0.9f : 1.0f;
          sp.seed = rng();
          params.push_back(sp);
          rows.push_back(
              RowSampling{t, k, sp.top_p, min_p, sp.seed, static_cast<int64_t>(rng() % 5000)});
        }
    std::vector<float> logits(rows.size() * vocab);
    for (auto& x : logits) x = dist(rng);
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<RowSampling> d_params(rows);
    DeviceBuffer<int32_t> d_tokens(rows.size(), -1);
    model::cuda::sample_tokens(d_logits.get(), d_params.get(), d_tokens.get(),
                               static_cast<int64_t>(rows.size()), vocab, nullptr);
    const auto got = d_tokens.download();
    for (size_t r = 0; r < rows.size(); ++r) {
      const float u = model::sample_uniform(rows[r].seed, rows[r].position);
      EXPECT_EQ(got[r], model::sample_token(&logits[r * vocab], vocab, params[r], u))
          << "vocab " << vocab << " row " << r << " T " << params[r].temperature << " min_p "
          << params[r].min_p << " k " << params[r].top_k;
    }
  }
}

}  // namespace
}  // namespace flashserve::testing
