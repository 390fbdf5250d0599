// Simulator and capacity search: an exact timeline under a constant step cost, determinism, the
// decode stall of prefill-first scheduling against stall-free chunking, the profile model plugged
// in, KV cache sizing, and the bisection.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include <limits>

#include <cmath>
#include <sstream>

#include "engine/simulator.h"
#include "flashserve/error.h"
#include "serve/capacity.h"

namespace fs = flashserve::serve;
namespace fe = flashserve::engine;
using flashserve::Error;

namespace {

class ConstantCost final : public fs::CostModel {
 public:
  explicit ConstantCost(double s) : s_(s) {}
  double step_seconds(const fs::Batch&) const override { return s_; }
  std::string describe() const override { return "constant"; }

 private:
  double s_;
};

fe::SimConfig small_config(fs::Policy p, int64_t budget = 512) {
  fe::SimConfig c;
  c.scheduler.policy = p;
  c.scheduler.max_model_len = 4096;
  c.scheduler.max_tokens_per_step = p == fs::Policy::kSarathi ? budget : 4096;
  c.scheduler.chunk_tile = 1;
  c.num_blocks = 4096;
  c.block_size = 16;
  return c;
}

TEST(Simulator, ExactTimelineOfOneRequest) {
  const std::vector<fs::Request> reqs = {{0, 3.0, 1000, 5}};
  const fe::SimResult r =
      fe::simulate(reqs, small_config(fs::Policy::kSarathi), ConstantCost(0.01));
  ASSERT_EQ(r.finished.size(), 1u);
  // Chunks of 512 and 488 (the second samples the first token), then 4 decodes.
  EXPECT_EQ(r.steps, 6);
  const auto& m = r.metrics;
  EXPECT_NEAR(m.ttft.mean, 0.02, 1e-12);
  EXPECT_NEAR(m.tbt.max, 0.01, 1e-12);
  EXPECT_NEAR(m.tbt.p50, 0.01, 1e-12);
  EXPECT_NEAR(m.e2e.mean, 0.06, 1e-12);
  EXPECT_NEAR(m.sched_delay.mean, 0, 1e-12);
  EXPECT_NEAR(r.end_time, 3.06, 1e-12);
  EXPECT_EQ(r.max_step_tokens, 512);
}

TEST(Simulator, QueueingShowsAsSchedulingDelay) {
  // Static batching of 1 at a time: the second request waits for the whole first one.
  fe::SimConfig c = small_config(fs::Policy::kStatic);
  c.scheduler.max_running = 1;
  const std::vector<fs::Request> reqs = {{0, 0.0, 10, 4}, {1, 0.0, 10, 4}};
  const fe::SimResult r = fe::simulate(reqs, c, ConstantCost(0.5));
  ASSERT_EQ(r.finished.size(), 2u);
  EXPECT_NEAR(r.finished[1]->first_scheduled_time, 2.0, 1e-12);
  EXPECT_NEAR(r.metrics.sched_delay.max, 2.0, 1e-12);
}

TEST(Simulator, DeterministicAndEveryRequestCompletes) {
  fs::WorkloadSpec spec;
  spec.num_requests = 150;
  spec.rate = 3;
  spec.max_model_len = 4096;
  spec.seed = 4;
  const auto reqs = fs::generate_workload(spec);
  fs::RooflineCostModel cm(fs::model_preset("mistral-7b"), fs::gpu_preset("h200"));
  for (fs::Policy p : fs::all_policies()) {
    int64_t steps = 0;
    const fe::SimConfig c = small_config(p, 256);
    const auto a = fe::simulate(reqs, c, cm, [&](const fs::Scheduler& s, const fs::Batch& b) {
      ++steps;
      if (p != fs::Policy::kOrca && p != fs::Policy::kStatic)  // they have no token cap
        EXPECT_LE(b.num_tokens(), c.scheduler.max_tokens_per_step);
      EXPECT_NO_THROW(s.blocks().check_invariants(s.live()));
    });
    const auto b = fe::simulate(reqs, c, cm);
    EXPECT_EQ(steps, a.steps);
    EXPECT_EQ(a.metrics.tbt.p99, b.metrics.tbt.p99) << fs::to_string(p);
    EXPECT_EQ(a.metrics.ttft.mean, b.metrics.ttft.mean);
    ASSERT_EQ(a.finished.size(), reqs.size());
    for (const auto& s : a.finished) EXPECT_EQ(s->num_generated(), reqs[s->id].output_tokens);
  }
}

TEST(Simulator, PrefillFirstStallsDecodesChunkingDoesNot) {
  // Long prompts arriving while others decode: under vllm every running decode waits a whole
  // 6000-token prefill; under sarathi no gap exceeds one budget-sized step.
  fs::WorkloadSpec spec;
  spec.lengths = fs::LengthKind::kFixed;
  spec.fixed_prompt = 6000;
  spec.fixed_output = 200;
  spec.num_requests = 40;
  spec.rate = 1.0;
  spec.max_model_len = 8192;
  const auto reqs = fs::generate_workload(spec);
  fs::RooflineCostModel cm(fs::model_preset("mistral-7b"), fs::gpu_preset("h200"));
  fe::SimConfig sar = small_config(fs::Policy::kSarathi, 512),
                vl = small_config(fs::Policy::kVllmV0);
  sar.scheduler.max_model_len = vl.scheduler.max_model_len = vl.scheduler.max_tokens_per_step =
      8192;
  const auto s = fe::simulate(reqs, sar, cm).metrics;
  const auto v = fe::simulate(reqs, vl, cm).metrics;
  fs::Batch whole;
  whole.entries.push_back({nullptr, 0, 6000, 6000, true, true});
  const double prefill_step = cm.step_seconds(whole);
  auto stalls = [&](const fs::ServingMetrics& m) {
    int64_t n = 0;
    for (double g : m.tbt_samples) n += g >= prefill_step;
    return n;
  };
  EXPECT_GE(v.tbt.max, prefill_step);  // decodes waited for whole prompts...
  EXPECT_GE(stalls(v), 20);            // ...many times
  EXPECT_EQ(stalls(s), 0);
  EXPECT_LT(s.tbt.max, prefill_step / 3);
}

TEST(Simulator, ProfileTableDrivesTheClock) {
  // A profile whose parts are linear functions; the simulation must match one driven by the same
  // formula written out (cost_model.h: linear + sampled rows + chunks' attention + decodes').
  auto lin = [](double t) { return 1e-3 + 2e-5 * t; };
  auto dbase = [](double b) { return 1e-3 + 3e-5 * b; };
  auto pa = [](double c, double k) { return 1e-7 * c + 1e-9 * c * k; };
  auto da = [](double b, double l) { return 2e-8 * b * l; };
  struct Formula final : fs::CostModel {
    std::function<double(const fs::Batch&)> f;
    double step_seconds(const fs::Batch& b) const override { return f(b); }
    std::string describe() const override { return "formula"; }
  } formula;
  formula.f = [&](const fs::Batch& b) {
    double t = 5e-4, dec = 0, kv = 0;
    bool prefill = false;
    for (const auto& e : b.entries) {
      if (e.is_prefill) {
        prefill = true;
        t += pa(static_cast<double>(e.q_len), static_cast<double>(e.q_start));
      } else {
        dec += 1, kv += static_cast<double>(e.kv_len);
      }
    }
    t += prefill ? lin(static_cast<double>(b.num_tokens())) +
                       1e-6 * std::max<double>(static_cast<double>(b.num_sampled()) - 1, 0)
                 : dbase(dec);
    if (dec > 0) t += da(dec, kv / dec);
    return t;
  };
  fs::StepProfile p;
  for (double x : {1, 8192}) p.linear.x.push_back(x), p.linear.seconds.push_back(lin(x));
  for (double x : {1, 512}) p.decode_base.x.push_back(x), p.decode_base.seconds.push_back(dbase(x));
  p.prefill_attn.x = {1, 4096};
  p.prefill_attn.y = {0, 4096};
  for (double c : p.prefill_attn.x)
    for (double k : p.prefill_attn.y) p.prefill_attn.seconds.push_back(pa(c, k));
  p.decode_attn.x = {1, 512};
  p.decode_attn.y = {1, 4096};
  for (double b : p.decode_attn.x)
    for (double l : p.decode_attn.y) p.decode_attn.seconds.push_back(da(b, l));
  p.sample_row_s = 1e-6;
  p.overhead_s = 5e-4;
  const fs::ProfileCostModel pm(p, "linear");
  fs::WorkloadSpec spec;
  spec.num_requests = 60;
  spec.rate = 4;
  spec.max_model_len = 4096;
  const auto reqs = fs::generate_workload(spec);
  const auto a = fe::simulate(reqs, small_config(fs::Policy::kSarathi), pm).metrics;
  const auto b = fe::simulate(reqs, small_config(fs::Policy::kSarathi), formula).metrics;
  EXPECT_NEAR(a.tbt.p99, b.tbt.p99, 1e-9);
  EXPECT_NEAR(a.e2e.mean, b.e2e.mean, 1e-9);
}

TEST(Simulator, KvCacheSizing) {
  const fs::ModelShape m = fs::model_preset("mistral-7b");
  const double mem = 139.0 * (1ull << 30);
  const int64_t blocks = fs::kv_blocks_for(m, mem, 0.9, 16);
  EXPECT_EQ(blocks, static_cast<int64_t>((mem * 0.9 - m.weight_bytes()) / (131072.0 * 16)));
  // 70B in bf16 does not fit one H200 with room for a cache.
  EXPECT_THROW(fs::kv_blocks_for(fs::model_preset("llama-2-70b"), mem, 0.9, 16), Error);
  EXPECT_THROW(fs::kv_blocks_for(m, mem, 0, 16), Error);
  for (int32_t bad_block_size : {0, -16}) {
    try {
      fs::kv_blocks_for(m, mem, 0.9, bad_block_size);
      ADD_FAILURE() << "accepted block size " << bad_block_size;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "block_size");
    }
  }
}

TEST(Simulator, RejectsRequestsThatCanNeverRun) {
  const std::vector<fs::Request> reqs = {{0, 0, 4000, 200}};
  try {
    fe::simulate(reqs, small_config(fs::Policy::kSarathi), ConstantCost(0.01));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "request 0");
  }
  const std::vector<fs::Request> unsorted = {{0, 1, 10, 1}, {1, 0, 10, 1}};
  EXPECT_THROW(fe::simulate(unsorted, small_config(fs::Policy::kSarathi), ConstantCost(0.01)),
               Error);
}

// Sizes from a trace that no int64 sum or allocation can hold (issue 9): refused naming the
// request, before the prompt's token vector is allocated and without signed overflow (UBSan).
TEST(Simulator, RefusesRequestsThatCanNeverRunBeforeAllocating) {
  const int64_t huge = std::numeric_limits<int64_t>::max();
  for (const fs::Request r : {fs::Request{0, 0.0, 10, huge}, fs::Request{0, 0.0, huge, 10},
                              fs::Request{0, 0.0, int64_t{1} << 40, 1}}) {
    try {
      fe::simulate({r}, small_config(fs::Policy::kSarathi), ConstantCost(0.01));
      ADD_FAILURE() << "accepted prompt " << r.prompt_tokens << " output " << r.output_tokens;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "request 0");
      EXPECT_NE(std::string(e.what()).find("exceeds max_model_len"), std::string::npos);
    }
  }
}

fs::ServingMetrics synthetic(double tbt_p99, double delay_p50) {
  fs::ServingMetrics m;
  m.tbt.p99 = tbt_p99;
  m.sched_delay.p50 = delay_p50;
  return m;
}

TEST(Capacity, BisectionFindsTheBoundary) {
  const fs::CapacityCriteria crit{0.1, 2.0};
  // P99 TBT = rate / 37: the SLO breaks at 3.7 req/s.
  auto r = fs::find_capacity([](double rate) { return synthetic(rate / 37, 0); }, crit, 1.0, 0.01);
  EXPECT_LE(r.capacity, 3.7);
  EXPECT_GE(r.capacity, 3.7 * 0.99);
  for (const auto& p : r.probes) EXPECT_EQ(p.ok, p.rate <= 3.7);
  // The scheduling-delay criterion alone, starting above the boundary.
  r = fs::find_capacity([](double rate) { return synthetic(0, rate > 0.3 ? 5 : 0.1); }, crit, 8.0);
  EXPECT_GE(r.capacity, 0.3 * 0.98);
  EXPECT_LE(r.capacity, 0.3);
  EXPECT_FALSE(r.at_limit);
  // Never meets the SLO: capacity 0.
  r = fs::find_capacity([](double) { return synthetic(1, 0); }, crit, 1.0);
  EXPECT_EQ(r.capacity, 0);
  EXPECT_FALSE(r.at_limit);
  // Never misses it: the search stops at max_rate and says the capacity is only a lower bound.
  r = fs::find_capacity([](double) { return synthetic(0, 0); }, crit, 1.0, 0.02, 1e-3, 100.0);
  EXPECT_TRUE(r.at_limit);
  EXPECT_EQ(r.capacity, 64.0);
  EXPECT_LE(r.probes.back().rate, 100.0);
  EXPECT_THROW(fs::find_capacity([](double) { return synthetic(0, 0); }, crit, -1), Error);
  // A bound that nothing can meet is a mistake, not a capacity of 0.
  for (const fs::CapacityCriteria bad :
       {fs::CapacityCriteria{0, 2.0}, fs::CapacityCriteria{-0.1, 2.0}, fs::CapacityCriteria{0.1, 0},
        fs::CapacityCriteria{0.1, NAN}}) {
    int probes = 0;
    EXPECT_THROW(fs::find_capacity(
                     [&](double) {
                       ++probes;
                       return synthetic(0, 0);
                     },
                     bad, 1.0),
                 Error);
    EXPECT_EQ(probes, 0);
  }
}

TEST(Capacity, SarathiServesMoreThanPrefillFirstUnderATightSlo) {
  fs::WorkloadSpec spec;
  spec.num_requests = 200;
  spec.max_model_len = 8192;
  fs::RooflineCostModel cm(fs::model_preset("mistral-7b"), fs::gpu_preset("h200"));
  auto capacity = [&](fs::Policy p) {
    fe::SimConfig c = small_config(p, 512);
    c.scheduler.max_model_len = 8192;
    if (p != fs::Policy::kSarathi) c.scheduler.max_tokens_per_step = 8192;
    c.num_blocks = 20000;
    return fs::find_capacity(
               [&](double rate) {
                 fs::WorkloadSpec s = spec;
                 s.rate = rate;
                 return fe::simulate(fs::generate_workload(s), c, cm).metrics;
               },
               fs::CapacityCriteria{0.05, 2.0}, 1.0, 0.05)
        .capacity;
  };
  const double sarathi = capacity(fs::Policy::kSarathi), vllm = capacity(fs::Policy::kVllmV0);
  EXPECT_GT(vllm, 0);
  EXPECT_GT(sarathi, 1.2 * vllm);
}

}  // namespace
