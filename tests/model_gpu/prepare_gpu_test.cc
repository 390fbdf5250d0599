// ModelRunner::prepare on the CUDA runner: growing the step buffers and choosing every GEMM
// algorithm up front changes no result. A prepared and an unprepared runner with the same weights
// (`tiny`, written by our writer) give the same logits on mixed batches of several token counts,
// within bf16 rounding (their GEMM algorithms may differ), and the prepared one still captures and
// replays decode graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include <unistd.h>

#include "model/cuda/cuda_runner.h"
#include "model/forward_batch.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model_gpu/device_buffer.h"
#include "model_gpu/tiny_model.h"

namespace flashserve::testing {
namespace {

namespace fs = std::filesystem;
using model::ForwardBatchBuilder;
using model::cuda::CudaRunner;

constexpr int32_t kBlock = 16;
constexpr int64_t kPerSeq = 64;  // blocks per sequence

// Prefills two prompts (the token counts of a step: a + b), then decodes both for a few steps;
// returns every step's logits.
std::vector<std::vector<float>> steps(CudaRunner& r, int64_t a, int64_t b, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tok(a + b + 16);
  for (auto& t : tok) t = static_cast<int32_t>(rng() % r.config().vocab_size);
  r.allocate_kv(2 * kPerSeq, kBlock);
  std::vector<std::vector<float>> out;
  ForwardBatchBuilder bb(kBlock);
  bb.add(tok.data(), 0, a, sequence_blocks(0, a, kPerSeq, kBlock), true);
  bb.add(tok.data() + a, 0, b, sequence_blocks(1, b, kPerSeq, kBlock), true);
  r.forward(std::move(bb).build());
  out.push_back(r.logits());
  for (int64_t s = 0; s < 6; ++s) {
    ForwardBatchBuilder d(kBlock);
    d.add(tok.data() + a + b + s, a + s, 1, sequence_blocks(0, a + s + 1, kPerSeq, kBlock), true);
    d.add(tok.data() + a + b + 8 + s, b + s, 1, sequence_blocks(1, b + s + 1, kPerSeq, kBlock),
          true);
    r.forward(std::move(d).build());
    out.push_back(r.logits());
  }
  return out;
}

TEST(GpuModelRunnerPrepare, PreparedRunnerGivesTheSameLogits) {
  SKIP_WITHOUT_CUDA();
  const fs::path dir =
      fs::temp_directory_path() / ("flashserve-gpu-prepare-" + std::to_string(::getpid()));
  model::write_random_checkpoint(model::preset_config("tiny"), dir.string());
  auto plain = CudaRunner::load(dir.string(), 0);
  auto prepared = CudaRunner::load(dir.string(), 0);
  prepared->prepare(1024, 64);
  // Token counts in different buckets (model/step_graphs.h's token_bucket): 2, 33, 300, 1000.
  for (const auto& [a, b] :
       {std::pair{1, 1}, std::pair{20, 13}, std::pair{250, 50}, std::pair{700, 300}}) {
    const auto x = steps(*plain, a, b, 7), y = steps(*prepared, a, b, 7);
    ASSERT_EQ(x.size(), y.size());
    for (size_t s = 0; s < x.size(); ++s) {
      ASSERT_EQ(x[s].size(), y[s].size());
      double diff = 0;
      for (size_t i = 0; i < x[s].size(); ++i) {
        ASSERT_TRUE(std::isfinite(y[s][i])) << "step " << s << " logit " << i;
        diff = std::max(diff, std::abs(double(x[s][i]) - y[s][i]));
      }
      EXPECT_LT(diff, 0.05) << "prompts " << a << " + " << b << ", step " << s;
    }
  }
  const auto [captures, replays] = prepared->graph_counts();
  EXPECT_GE(captures, 1);
  EXPECT_GE(replays, 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashserve::testing
