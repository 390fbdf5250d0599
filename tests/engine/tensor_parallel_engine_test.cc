// The engine on a tensor-parallel model (engine/model_engine.h's tensor_parallel_size, the CPU
// emulation): sarathi's mixed steps of chunked prefills and decodes over 2 and 4 ranks generate,
// greedily, the tokens of one request alone on the whole model (up to a near-tie, where rounding
// may choose the other token); the KV budget counts every rank's pool; and cuda refuses a split
// by name before loading.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/model_engine.h"
#include "engine/tiny_model.h"
#include "flashserve/error.h"
#include "model/nccl_communicator.h"
#include "model/presets.h"
#include "model/test_dirs.h"

namespace fe = flashserve::engine;
namespace fm = flashserve::model;
using fe::testing::generate_alone;
using fe::testing::tiny_dir;
using flashserve::Error;
using flashserve::ErrorKind;

namespace {

TEST(TensorParallelEngine, SarathiStepsOnTwoAndFourRanksGenerateTheWholeModelsGreedyTokens) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  const uint64_t seed = fm::testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto whole = fm::make_cpu_runner(tiny_dir());
  const int64_t vocab = whole->config().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t len : {5, 40, 97, 130}) {  // chunked by the 64-token budget below
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (int32_t& t : p) t = static_cast<int32_t>(3 + rng() % static_cast<uint64_t>(vocab - 3));
    prompts.push_back(p);
  }
  const int64_t max_tokens = 12;
  std::vector<fe::testing::Alone> alone;
  for (const auto& p : prompts) alone.push_back(generate_alone(*whole, p, max_tokens));
  for (int tp : {2, 4}) {
    SCOPED_TRACE("TP=" + std::to_string(tp));
    fe::ModelEngineOptions o;
    o.model_dir = tiny_dir();
    o.num_blocks = 64;
    o.tensor_parallel_size = tp;
    const fe::LoadedModel m = fe::load_model(o);
    EXPECT_EQ(m.tensor_parallel_size, tp);
    flashserve::serve::SchedulerConfig sc;
    sc.policy = flashserve::serve::Policy::kSarathi;
    sc.max_tokens_per_step = 64;
    sc.chunk_tile = 16;
    sc.max_running = 8;
    sc.max_model_len = 0;  // the model's positions, cut to the pool
    auto engine = fe::make_model_engine(m, sc);
    std::map<int64_t, size_t> which;
    for (size_t i = 0; i < prompts.size(); ++i) {
      fe::NewRequest r;
      r.prompt = prompts[i];
      r.max_tokens = max_tokens;
      r.ignore_eos = true;
      which[engine->add_request(std::move(r))] = i;
    }
    std::vector<std::vector<int32_t>> got(prompts.size());
    for (int64_t steps = 0; engine->has_work() && steps < 1000; ++steps)
      for (const auto& out : engine->step().outputs)
        for (int32_t t : out.new_tokens) got[which.at(out.id)].push_back(t);
    EXPECT_FALSE(engine->has_work());
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(got[i].size(), static_cast<size_t>(max_tokens)) << "request " << i;
      // Equal up to the first near-tie of the whole model (a gap below 1e-3: the split's rounding,
      // tensor_parallel_test.cc's bound of 6e-5 of logits of RMS ~3, may pick the other token).
      for (size_t k = 0; k < got[i].size(); ++k) {
        if (alone[i].top2_gap[k] < 1e-3f) break;
        ASSERT_EQ(got[i][k], alone[i].tokens[k]) << "request " << i << " token " << k;
      }
    }
  }
}

TEST(TensorParallelEngine, TheKvBudgetCountsEveryRanksPool) {
  const fm::ModelConfig c = fm::preset_config("tiny");  // 4 layers, 2 KV heads of 64
  const int64_t one = fe::kv_bytes_per_block(c, 16, 2);
  EXPECT_EQ(one, 2 * 4 * 2 * 64 * 16 * 2);
  EXPECT_EQ(fe::kv_bytes_per_block(c, 16, 2, 2), one);      // the two heads split over two ranks
  EXPECT_EQ(fe::kv_bytes_per_block(c, 16, 2, 4), 2 * one);  // each head on two of four ranks
}

// On a machine with fewer GPUs than ranks (CI's none, the one-GPU device), or without NCCL in the
// build: refused by name before the model is opened (without CUDA in the build: the device).
TEST(TensorParallelEngine, CudaRefusesASplitOverMissingGpusBeforeLoading) {
  if (fm::nccl_device_count() >= 2) GTEST_SKIP() << "skipped: this machine has the GPUs";
#if defined(FLASHSERVE_WITH_CUDA)
  const std::string refused = "tensor_parallel_size";
#else
  const std::string refused = "device";
#endif
  fe::ModelEngineOptions o;
  o.model_dir = "/nonexistent";  // never opened: the refusal comes first
  o.device = "cuda";
  o.tensor_parallel_size = 2;
  try {
    fe::load_model(o);
    ADD_FAILURE() << "tensor parallelism over missing GPUs accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), refused) << e.what();
    EXPECT_EQ(std::string(e.what()).find("nonexistent"), std::string::npos) << e.what();
  }
}

}  // namespace
