// `flashserve profile` on the CPU runner (the tiny model): the table is well formed and describes
// the runner (each part grows with its axes), and the simulator calibrated by it predicts the
// runner's own serving of a small workload.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "engine/model_engine.h"
#include "engine/replay.h"
#include "engine/simulator.h"
#include "engine/step_profiler.h"
#include "serve/cost_model.h"
#include "serve/workload.h"
#include "tiny_model.h"

namespace fe = flashserve::engine;
namespace fs = flashserve::serve;

namespace {

// Under ASan (a Debug build: steps ~100x slower) the profile takes the smallest grid and the
// timing comparison is skipped: it would measure the instrumentation.
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
constexpr bool kInstrumented = true;
#else
constexpr bool kInstrumented = false;
#endif

fe::ProfileGrid test_grid() {
  if (kInstrumented) return fe::ProfileGrid::smoke();
  fe::ProfileGrid g = fe::ProfileGrid::quick();
  g.reps = 3;
  return g;
}

const fe::LoadedModel& tiny() {
  static const fe::LoadedModel m = [] {
    fe::ModelEngineOptions o;
    o.model_dir = fe::testing::tiny_dir();
    o.cpu_kv_bytes = 64.0 * (1 << 20);
    return fe::load_model(o);
  }();
  return m;
}

// Profiled once per test binary (a few seconds).
const fs::StepProfile& tiny_profile() {
  static const fs::StepProfile p = fe::profile_model(tiny(), test_grid());
  return p;
}

TEST(Profile, WritesAWellFormedTableOfTheGrid) {
  const fs::StepProfile& p = tiny_profile();
  std::stringstream csv;
  p.write_csv(csv);
  const fs::StepProfile q = fs::StepProfile::read_csv(csv, "tiny.csv");  // validates it
  const fe::ProfileGrid g = test_grid();
  EXPECT_EQ(q.linear.x, std::vector<double>(g.tokens.begin(), g.tokens.end()));
  EXPECT_EQ(q.prefill_attn.x, std::vector<double>(g.chunk.begin(), g.chunk.end()));
  EXPECT_EQ(q.prefill_attn.y, std::vector<double>(g.cached.begin(), g.cached.end()));
  EXPECT_EQ(q.decode_attn.x, std::vector<double>(g.decode_batch.begin(), g.decode_batch.end()));
  EXPECT_EQ(q.decode_attn.y, std::vector<double>(g.decode_kv.begin(), g.decode_kv.end()));
  EXPECT_EQ(q.meta.at("device"), "cpu");
  // Decodes at KV 1 pay no attention (the profile's own rule, not a measurement).
  for (size_t i = 0; i < q.decode_attn.x.size(); ++i) EXPECT_EQ(q.decode_attn.cell(i, 0), 0);
  EXPECT_GE(q.overhead_s, 0);
  // What the runner does, not noise: 192 tokens of linear layers cost more than 1, and a
  // 128-token chunk after 384 cached tokens (about 57k query-key pairs per head) more attention
  // than a 16-token one at the start (136), decodes at the largest KV some. Timed by differences
  // of whole steps, so only outside ASan / Debug: there the smoke grid's cells are close, the
  // instrumentation's noise is larger than them, and a difference came out 0 (CI, session 9).
  if (kInstrumented) return;
  EXPECT_GT(q.linear.seconds.back(), 2 * q.linear.seconds.front());
  EXPECT_GT(q.prefill_attn.seconds.back(), q.prefill_attn.seconds.front());
  EXPECT_GT(q.prefill_attn.seconds.back(), 0);
  EXPECT_GT(q.decode_attn.seconds.back(), 0);
  EXPECT_LT(q.overhead_s, 1e-3);  // the scheduler's bookkeeping, not a step
}

TEST(Profile, CalibratedSimulatorPredictsTheCpuRunner) {
  if (kInstrumented) GTEST_SKIP() << "timing under ASan / Debug measures the instrumentation";
  fs::WorkloadSpec spec;
  spec.lengths = fs::LengthKind::kFixed;
  spec.fixed_prompt = 300;
  spec.fixed_output = 24;
  spec.num_requests = 12;
  spec.rate = 6;
  spec.seed = 3;
  spec.max_model_len = 1024;
  const auto reqs = fs::generate_workload(spec);
  fs::SchedulerConfig sc;
  sc.policy = fs::Policy::kSarathi;
  sc.max_tokens_per_step = 128;
  sc.max_running = 16;
  sc.chunk_tile = 16;
  sc.max_model_len = 1024;
  // The runner's serving of the workload, measured, and the simulator's prediction of it from a
  // profile of the runner.
  struct Outcome {
    fs::ServingMetrics meas, pred;
    bool within(double factor) const {
      return pred.tbt.p99 > meas.tbt.p99 / factor && pred.tbt.p99 < meas.tbt.p99 * factor &&
             pred.ttft.p50 > meas.ttft.p50 / factor && pred.ttft.p50 < meas.ttft.p50 * factor;
    }
  };
  auto serve = [&](const fs::StepProfile& profile) {
    const fs::ProfileCostModel cost(profile, "tiny");
    auto engine = fe::make_model_engine(tiny(), sc);
    fe::ReplayOptions ro;
    ro.vocab_size = tiny().runner->config().vocab_size;
    Outcome o;
    o.meas = fe::replay(*engine, reqs, ro).metrics;
    fe::SimConfig sim;
    sim.scheduler = engine->config().scheduler;
    sim.num_blocks = tiny().num_blocks;
    sim.block_size = tiny().block_size;
    o.pred = fe::simulate(reqs, sim, cost).metrics;
    const fs::ServingMetrics &meas = o.meas, &pred = o.pred;
    std::printf(
        "tiny on the CPU: TBT p99 measured %.2f ms, predicted %.2f ms (%+.1f%%); TBT p50 "
        "%.2f / %.2f ms (%+.1f%%); TTFT p50 %.2f / %.2f ms (%+.1f%%)\n",
        meas.tbt.p99 * 1e3, pred.tbt.p99 * 1e3, 100 * (pred.tbt.p99 / meas.tbt.p99 - 1),
        meas.tbt.p50 * 1e3, pred.tbt.p50 * 1e3, 100 * (pred.tbt.p50 / meas.tbt.p50 - 1),
        meas.ttft.p50 * 1e3, pred.ttft.p50 * 1e3, 100 * (pred.ttft.p50 / meas.ttft.p50 - 1));
    return o;
  };
  // Two CPU cores shared with other jobs (load average 7 when this was written): the same test
  // run three times in a row saw errors of +5% .. +91% on P99 TBT and +12% .. +117% on median
  // TTFT, the profile and the replay each timing a few hundred milliseconds of a machine whose
  // other tenants come and go; with another test running beside it (ctest -j2), -60% and -65%;
  // with a compression job started between the profile and the replay (session 30), +1500%.
  // It runs alone (tests/CMakeLists.txt), and the bound is a factor of 3 either way: it catches
  // a profile in the wrong unit, the linear layers or attention dropped or counted twice, a clock
  // that does not advance — errors every attempt shows; not a 15% error (which the GPU run,
  // scripts/engine-profile-gpu-check.sh, measures). A load that changes between a profile and
  // its replay is the machine's, not the simulator's: up to three attempts, each with a fresh
  // profile taken just before its replay, and the bound holds for one of them.
  Outcome o = serve(tiny_profile());
  for (int attempt = 1; attempt < 3 && !o.within(3); ++attempt)
    o = serve(fe::profile_model(tiny(), test_grid()));
  EXPECT_GT(o.pred.tbt.p99, o.meas.tbt.p99 / 3);
  EXPECT_LT(o.pred.tbt.p99, o.meas.tbt.p99 * 3);
  EXPECT_GT(o.pred.ttft.p50, o.meas.ttft.p50 / 3);
  EXPECT_LT(o.pred.ttft.p50, o.meas.ttft.p50 * 3);
}

}  // namespace
