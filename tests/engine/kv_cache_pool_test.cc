// The KV pool under --kv-cache-dtype (engine/model_engine.h): at the same memory budget an fp8
// (e4m3) pool holds exactly twice the blocks of a bf16 one (four times the CPU's float32 one), an
// engine on the fp8 pool serves requests to completion, and fp8 is refused by name where there is
// no fp8 cache: on --device cuda (before any weight loads) and by a runner without one.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/model_engine.h"
#include "engine/tiny_model.h"
#include "flashserve/error.h"
#include "model/test_dirs.h"
#include "support/scoped_env.h"

namespace fe = flashserve::engine;
namespace fm = flashserve::model;
using fe::testing::tiny_dir;
using flashserve::Error;
using flashserve::ErrorKind;
using flashserve::testing::ScopedEnv;

namespace {

fe::LoadedModel load(fm::KvCacheDtype dtype, double budget_bytes) {
  fe::ModelEngineOptions o;
  o.model_dir = tiny_dir();
  o.cpu_kv_bytes = budget_bytes;
  o.kv_cache_dtype = dtype;
  return fe::load_model(o);
}

TEST(KvCachePool, Fp8HoldsTwiceTheBlocksOfBf16AtTheSameMemory) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  const fm::ModelConfig c = fm::make_cpu_runner(tiny_dir())->config();
  const int64_t bf16_block = fe::kv_bytes_per_block(c, 16, 2);
  const double budget = 48.0 * static_cast<double>(bf16_block);
  const fe::LoadedModel f32 = load(fm::KvCacheDtype::kAuto, budget);
  const fe::LoadedModel bf16 = load(fm::KvCacheDtype::kBf16, budget);
  const fe::LoadedModel fp8 = load(fm::KvCacheDtype::kFp8E4M3, budget);
  EXPECT_EQ(bf16.num_blocks, 48);
  EXPECT_EQ(fp8.num_blocks, 2 * bf16.num_blocks);
  EXPECT_EQ(f32.num_blocks * 2, bf16.num_blocks);
  for (const fe::LoadedModel* m : {&f32, &bf16, &fp8}) EXPECT_EQ(m->kv_bytes, budget);
  EXPECT_EQ(fp8.kv_cache_dtype, fm::KvCacheDtype::kFp8E4M3);
}

TEST(KvCachePool, AnEngineOnTheFp8PoolCompletesItsRequests) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  const fe::LoadedModel m = load(fm::KvCacheDtype::kFp8E4M3, 4.0 * (1 << 20));
  flashserve::serve::SchedulerConfig sc;
  sc.max_model_len = 0;  // the model's positions, cut to the pool
  auto engine = fe::make_model_engine(m, sc);
  for (int i = 0; i < 3; ++i) {
    fe::NewRequest r;
    r.prompt.resize(static_cast<size_t>(20 + 7 * i));
    for (size_t j = 0; j < r.prompt.size(); ++j)
      r.prompt[j] = static_cast<int32_t>(5 + (i * 31 + j) % 400);
    r.max_tokens = 8;
    r.ignore_eos = true;
    engine->add_request(std::move(r));
  }
  size_t finished = 0, tokens = 0;
  for (int64_t steps = 0; engine->has_work() && steps < 1000; ++steps) {
    fe::StepResult st = engine->step();
    finished += st.finished.size();
    for (const auto& o : st.outputs) tokens += o.new_tokens.size();
  }
  EXPECT_FALSE(engine->has_work());
  EXPECT_EQ(finished, 3u);
  EXPECT_EQ(tokens, 24u);
}

// While FLASHSERVE_CUDA_FP8_KV is off (the default until the CUDA fp8 KV kernels' first device
// run): refused naming kv_cache_dtype, saying how to turn it on. On, the refusal is gone: the
// load goes on to the checkpoint (here a missing one, or no CUDA runner in the build).
TEST(KvCachePool, Fp8OnCudaIsRefusedByNameBeforeLoading) {
  ScopedEnv off("FLASHSERVE_CUDA_FP8_KV", "0");
  fe::ModelEngineOptions o;
  o.model_dir = "/nonexistent";  // never opened: the refusal comes first
  o.device = "cuda";
  o.kv_cache_dtype = fm::KvCacheDtype::kFp8E4M3;
  try {
    fe::load_model(o);
    ADD_FAILURE() << "fp8 on cuda accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
    EXPECT_EQ(e.argument(), "kv_cache_dtype");
    EXPECT_NE(std::string(e.what()).find("FLASHSERVE_CUDA_FP8_KV=1"), std::string::npos)
        << e.what();
  }
  ScopedEnv on("FLASHSERVE_CUDA_FP8_KV", "1");
  try {
    fe::load_model(o);
    ADD_FAILURE() << "a missing checkpoint loaded";
  } catch (const Error& e) {
    EXPECT_NE(e.argument(), "kv_cache_dtype") << e.what();
  }
}

// A runner that does not override set_kv_cache refuses fp8 by name and takes the others.
class NoFp8Runner final : public fm::ModelRunner {
 public:
  const fm::ModelConfig& config() const override { return c_; }
  void allocate_kv(int64_t, int32_t) override {}
  void forward(const fm::ForwardBatch&) override {}
  std::vector<float> logits() const override { return {}; }
  std::vector<float> logits_rows(const std::vector<int32_t>&) const override { return {}; }
  using fm::ModelRunner::sample;
  std::vector<int32_t> sample(const fm::ForwardBatch&, const std::vector<fm::SamplingParams>&,
                              const std::vector<fm::LogitsAdjust>&) override {
    return {};
  }

 private:
  fm::ModelConfig c_;
};

TEST(KvCachePool, ARunnerWithoutAnFp8CacheRefusesIt) {
  NoFp8Runner r;
  EXPECT_NO_THROW(r.set_kv_cache({fm::KvCacheDtype::kAuto, {}, {}}));
  EXPECT_NO_THROW(r.set_kv_cache({fm::KvCacheDtype::kBf16, {}, {}}));
  try {
    r.set_kv_cache({fm::KvCacheDtype::kFp8E4M3, {}, {}});
    ADD_FAILURE() << "fp8 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_EQ(e.argument(), "kv_cache_dtype");
  }
}

}  // namespace
