// Logprobs on the CUDA runner (model/logprobs.h): logits_rows hands over exactly the asked rows of
// the last forward's logits (eager and in a decode CUDA graph, after sample()), their logprobs are
// log_softmax in float64 of those logits, and they agree with the CPU runner's within bf16's error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "flashserve/error.h"
#include "model/cuda/cuda_runner.h"
#include "model/forward_batch.h"
#include "model/logprobs.h"
#include "model/runner.h"
#include "model_gpu/device_buffer.h"
#include "model_gpu/tiny_model.h"

namespace flashserve::testing {
namespace {

constexpr int32_t kBlock = 16;

std::vector<double> log_softmax64(const float* row, int64_t vocab) {
  double max = row[0];
  for (int64_t i = 1; i < vocab; ++i) max = std::max(max, double(row[i]));
  long double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<long double>(row[i]) - max);
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) out[i] = row[i] - max - static_cast<double>(std::log(sum));
  return out;
}

// Three sequences: prefill, then decode steps (the CUDA runner captures graphs for decodes).
// Per step: all logits, the asked rows, and the logprobs computed from them.
struct Step {
  std::vector<float> logits, rows;
  std::vector<int32_t> tokens;
};

std::vector<Step> run(model::ModelRunner& r, const std::vector<int32_t>& ask, int steps) {
  const int64_t n = 3, per_seq = 8;
  r.allocate_kv(n * per_seq, kBlock);
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> seqs(n);
  std::vector<int64_t> len(n);
  for (int64_t i = 0; i < n; ++i) {
    len[i] = 20 + 9 * i;
    for (int64_t t = 0; t < len[i]; ++t) seqs[i].push_back(static_cast<int32_t>(3 + rng() % 1000));
  }
  auto blocks = [&](int64_t i, int64_t kv) {
    std::vector<int32_t> b;
    for (int64_t k = 0; k < (kv + kBlock - 1) / kBlock; ++k)
      b.push_back(static_cast<int32_t>(i * per_seq + k));
    return b;
  };
  std::vector<Step> out;
  for (int s = 0; s <= steps; ++s) {
    model::ForwardBatchBuilder bb(kBlock);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t start = s == 0 ? 0 : len[i] - 1;
      bb.add(seqs[i].data() + start, start, len[i] - start, blocks(i, len[i]), true);
    }
    const model::ForwardBatch b = std::move(bb).build();
    r.forward(b);
    Step st;
    st.logits = r.logits();
    st.tokens = r.sample(b, std::vector<model::SamplingParams>(n));  // greedy
    st.rows = r.logits_rows(ask);
    EXPECT_THROW(r.logits_rows({static_cast<int32_t>(n)}), Error);
    for (int64_t i = 0; i < n; ++i) seqs[i].push_back(st.tokens[i]), ++len[i];
    out.push_back(std::move(st));
  }
  return out;
}

TEST(GpuLogprobs, RowsAreTheLogitsAndLogprobsTheirFloat64LogSoftmax) {
  SKIP_WITHOUT_CUDA();
  auto gpu = model::make_cuda_runner(tiny_checkpoint_dir(), 0);
  const int64_t V = gpu->config().vocab_size;
  const std::vector<int32_t> ask = {2, 0};
  const std::vector<Step> g = run(*gpu, ask, 12);
  for (size_t s = 0; s < g.size(); ++s) {
    ASSERT_EQ(g[s].rows.size(), ask.size() * V);
    for (size_t j = 0; j < ask.size(); ++j) {
      // Bit for bit the row of logits() (a copy, not a recomputation).
      EXPECT_TRUE(std::equal(g[s].rows.begin() + j * V, g[s].rows.begin() + (j + 1) * V,
                             g[s].logits.begin() + ask[j] * V))
          << "step " << s << " row " << ask[j];
      const float* row = g[s].rows.data() + j * V;
      const int32_t token = g[s].tokens[ask[j]];
      const model::SampledLogprobs lp = model::token_logprobs(row, V, token, 5);
      const std::vector<double> ref = log_softmax64(row, V);
      EXPECT_NEAR(lp.sampled.logprob, ref[token], 1e-5 + 1e-6 * std::abs(ref[token]));
      // Greedy on the GPU: its token is the most likely in its own logits.
      EXPECT_EQ(lp.top[0].token, token) << "step " << s;
      EXPECT_EQ(lp.top[0].logprob, lp.sampled.logprob);
    }
  }
  // Against the CPU runner (float32), where it is built: within bf16's error of the logits.
  std::unique_ptr<model::ModelRunner> cpu;
  try {
    cpu = model::make_cpu_runner(tiny_checkpoint_dir());
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kUnsupported) GTEST_SKIP() << e.what();
    throw;
  }
  const std::vector<Step> c = run(*cpu, ask, 0);  // the prefill step: same inputs on both
  for (size_t j = 0; j < ask.size(); ++j) {
    const int32_t token = g[0].tokens[ask[j]];
    const float lg = model::token_logprobs(g[0].rows.data() + j * V, V, token, 0).sampled.logprob;
    const float lc = model::token_logprobs(c[0].rows.data() + j * V, V, token, 0).sampled.logprob;
    EXPECT_NEAR(lg, lc, 0.3) << "row " << ask[j];
  }
}

}  // namespace
}  // namespace flashserve::testing
