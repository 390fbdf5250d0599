// The largest step an engine runs (engine/model_engine.h largest_step_tokens), which sizes the
// runner's buffers before the GPU's KV budget is read: the policy's token budget, or for the
// policies that never chunk a prompt (vllm-v0, static) at least max_model_len, bounded by the
// model's positions; and the same cap as the engine make_model_engine builds.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/model_engine.h"
#include "engine/tiny_model.h"
#include "model/test_dirs.h"

namespace fe = flashserve::engine;
namespace fs = flashserve::serve;

namespace {

fs::SchedulerConfig config(fs::Policy p, int64_t budget, int64_t max_model_len) {
  fs::SchedulerConfig c;
  c.policy = p;
  c.max_tokens_per_step = budget;
  c.max_model_len = max_model_len;
  return c;
}

TEST(LargestStep, ChunkingPoliciesRunTheirBudget) {
  for (fs::Policy p : {fs::Policy::kSarathi, fs::Policy::kVllmV1}) {
    EXPECT_EQ(fe::largest_step_tokens(config(p, 512, 0), 4096), 512);
    EXPECT_EQ(fe::largest_step_tokens(config(p, 8192, 2048), 4096), 8192);
  }
}

TEST(LargestStep, WholePromptPoliciesRunMaxModelLenBoundedByThePositions) {
  for (fs::Policy p : {fs::Policy::kVllmV0, fs::Policy::kStatic}) {
    EXPECT_EQ(fe::largest_step_tokens(config(p, 512, 0), 4096), 4096);      // unset: positions
    EXPECT_EQ(fe::largest_step_tokens(config(p, 512, 2048), 4096), 2048);   // set
    EXPECT_EQ(fe::largest_step_tokens(config(p, 512, 9000), 4096), 4096);   // refused later
    EXPECT_EQ(fe::largest_step_tokens(config(p, 6000, 2048), 4096), 6000);  // budget above it
  }
}

// What make_model_engine gives a policy is what largest_step_tokens said for it.
TEST(LargestStep, IsTheEnginesTokenCap) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  fe::ModelEngineOptions o;
  o.model_dir = fe::testing::tiny_dir();
  o.largest_step_tokens = 300;  // the CPU's budget is cpu_kv_bytes: prepared or not, the same pool
  o.largest_step_rows = 16;
  const fe::LoadedModel m = fe::load_model(o);
  fe::ModelEngineOptions plain = o;
  plain.largest_step_tokens = plain.largest_step_rows = 0;
  EXPECT_EQ(fe::load_model(plain).num_blocks, m.num_blocks);
  const int64_t positions = m.runner->config().max_position_embeddings;
  for (fs::Policy p : {fs::Policy::kSarathi, fs::Policy::kVllmV0}) {
    for (int64_t len : {int64_t{0}, int64_t{300}}) {
      fs::SchedulerConfig sc = config(p, 64, len);
      sc.max_running = 16;
      const auto engine = fe::make_model_engine(m, sc);
      EXPECT_EQ(engine->config().scheduler.max_tokens_per_step,
                fe::largest_step_tokens(sc, positions))
          << fs::to_string(p) << ", max_model_len " << len;
    }
  }
}

}  // namespace
