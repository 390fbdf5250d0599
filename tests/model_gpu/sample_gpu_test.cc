// The GPU sampler against the CPU sampler (model/sampling.h's rule with the same uniform), on
// vocabularies of 32k and 152k, and its properties: greedy is the first maximum, top-k 1 is greedy,
// the same seed and position draw the same token.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "model/cuda/sample.h"
#include "model/sampling.h"
#include "model_gpu/device_buffer.h"

namespace flashserve::testing {
namespace {

using model::SamplingParams;
using model::cuda::RowSampling;

std::vector<int32_t> gpu_sample(const std::vector<float>& logits, int64_t vocab,
                                const std::vector<RowSampling>& rows) {
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<RowSampling> d_params(rows);
  DeviceBuffer<int32_t> d_tokens(rows.size(), -1);
  model::cuda::sample_tokens(d_logits.get(), d_params.get(), d_tokens.get(),
                             static_cast<int64_t>(rows.size()), vocab, nullptr);
  return d_tokens.download();
}

TEST(GpuModelSample, MatchesCpuSampler) {
  SKIP_WITHOUT_CUDA();
  for (int64_t vocab : {32000, 151936}) {
    std::mt19937 rng(static_cast<unsigned>(vocab));
    std::normal_distribution<float> dist(0.0f, 3.0f);
    const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f};
    const int32_t top_ks[] = {0, 1, 5, 50, 1000};
    const float top_ps[] = {1.0f, 0.9f, 0.5f, 0.05f};
    std::vector<RowSampling> rows;
    std::vector<SamplingParams> params;
    for (float t : temps)
      for (int32_t k : top_ks)
        for (float p : top_ps) {
          SamplingParams sp;
          sp.temperature = t;
          sp.top_k = k;
          sp.top_p = p;
          sp.seed = rng();
          params.push_back(sp);
          rows.push_back(RowSampling{t, k, p, 0, sp.seed, static_cast<int64_t>(rng() % 5000)});
        }
    std::vector<float> logits(rows.size() * vocab);
    for (auto& x : logits) x = dist(rng);
    logits[3 * vocab + 17] = logits[3 * vocab + 18] = 40.0f;  // a tie for the maximum: index 17
    const auto got = gpu_sample(logits, vocab, rows);
    int mismatches = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      const float u = model::sample_uniform(rows[r].seed, rows[r].position);
      const int32_t want = model::sample_token(&logits[r * vocab], vocab, params[r], u);
      if (got[r] != want) {
        ++mismatches;
        ADD_FAILURE() << "vocab " << vocab << " row " << r << " T " << params[r].temperature
                      << " k " << params[r].top_k << " p " << params[r].top_p << ": gpu " << got[r]
                      << " cpu " << want;
      }
    }
    EXPECT_EQ(mismatches, 0);
    if (rows[3].temperature == 0.0f) EXPECT_EQ(got[3], 17);
  }
}

TEST(GpuModelSample, SameSeedSameTokenAndTopKOneIsGreedy) {
  SKIP_WITHOUT_CUDA();
  const int64_t vocab = 32000;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> row(vocab);
  for (auto& x : row) x = dist(rng);
  std::vector<float> logits;
  std::vector<RowSampling> rows;
  for (int i = 0; i < 8; ++i) {
    logits.insert(logits.end(), row.begin(), row.end());
    rows.push_back(RowSampling{1.0f, i < 4 ? 0 : 1, 1.0f, 0, 42, i < 4 ? 7 : 7 + i});
  }
  const auto got = gpu_sample(logits, vocab, rows);
  const int32_t argmax =
      static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  for (int i = 1; i < 4; ++i) EXPECT_EQ(got[i], got[0]);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(got[i], argmax);
}

}  // namespace
}  // namespace flashserve::testing
