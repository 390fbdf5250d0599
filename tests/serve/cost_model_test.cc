// Cost models: the presets' parameter counts against the published totals, the roofline's regimes
// (memory-bound decode, compute-bound prefill), chunked prefill attention summing to the whole
// prompt's, and the profile cost model's tables against known piecewise-linear and bilinear
// functions (exact at and between grid points, monotone, round-tripped through CSV).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "flashserve/error.h"
#include "model/step_graphs.h"
#include "serve/cost_model.h"

namespace fs = flashserve::serve;
using flashserve::Error;

namespace {

// A batch built by hand: (q_start, q_len, is_prefill) per entry; seq pointers are not needed here.
fs::Batch make_batch(std::vector<std::tuple<int64_t, int64_t, bool>> entries) {
  fs::Batch b;
  for (auto [start, len, prefill] : entries) {
    fs::BatchEntry e;
    e.q_start = start;
    e.q_len = len;
    e.kv_len = start + len;
    e.is_prefill = prefill;
    e.samples = true;
    b.entries.push_back(e);
  }
  return b;
}

TEST(CostModel, PresetsMatchPublishedParameterCounts) {
  // Published totals (Hugging Face safetensors metadata) minus the RMSNorm weights, which we do not
  // count: 2 per layer + 1 final, each `hidden` long.
  struct P {
    const char* name;
    int64_t total;
  };
  for (P p :
       {P{"mistral-7b", 7241732096}, P{"llama-3-8b", 8030261248}, P{"llama-2-70b", 68976648192}}) {
    const fs::ModelShape m = fs::model_preset(p.name);
    const int64_t norms = (2 * m.layers + 1) * m.hidden;
    EXPECT_EQ(m.weight_bytes() / m.bytes_per_param + norms, p.total) << p.name;
  }
  EXPECT_EQ(fs::model_preset("mistral-7b").kv_bytes_per_token(), 128 * 1024);
  EXPECT_THROW(fs::model_preset("gpt-5"), Error);
}

TEST(CostModel, SmallDecodeIsBoundByReadingTheWeights) {
  const fs::ModelShape m = fs::model_preset("mistral-7b");
  const fs::GpuSpec g = fs::gpu_preset("h200");
  fs::RooflineCostModel cm(m, g);
  const fs::StepTime t = cm.breakdown(make_batch({{100, 1, false}}));
  // Everything but the embedding table is read: 7241732096 - norms - 32000 * 4096 parameters.
  const double bytes = (7241732096.0 - 65 * 4096 - 32000.0 * 4096) * 2;
  EXPECT_NEAR(t.linear_s, bytes / (g.mem_bw * g.weight_bw_efficiency), 1e-3 * t.linear_s);
  EXPECT_NEAR(t.attn_decode_s, 101.0 * 131072 / g.attn_decode_bw, 1e-12);
  EXPECT_EQ(t.attn_prefill_s, 0);
  EXPECT_EQ(t.overhead_s, g.step_overhead_s);
  EXPECT_NEAR(cm.step_seconds(make_batch({{100, 1, false}})), t.total(), 1e-15);
  // A few more decodes cost almost nothing in the linear layers (that is what batching buys).
  const fs::StepTime t8 =
      cm.breakdown(make_batch(std::vector<std::tuple<int64_t, int64_t, bool>>(8, {100, 1, false})));
  EXPECT_EQ(t8.linear_s, t.linear_s);
}

TEST(CostModel, LongPrefillIsComputeBound) {
  const fs::ModelShape m = fs::model_preset("mistral-7b");
  const fs::GpuSpec g = fs::gpu_preset("h200");
  fs::RooflineCostModel cm(m, g);
  const fs::StepTime t = cm.breakdown(make_batch({{0, 4096, true}}));
  const double layer_params = 7241732096.0 - 65 * 4096 - 2 * 32000.0 * 4096;
  const double flops = 2 * 4096 * layer_params + 2 * 1 * 32000.0 * 4096;  // one sampled row
  EXPECT_NEAR(t.linear_s, flops / (g.matmul_flops * g.matmul_efficiency), 1e-6 * t.linear_s);
  // Causal attention: 4 * layers * heads * head_dim FLOPs per (query, key) pair, n(n+1)/2 pairs.
  const double attn = 4.0 * 32 * 32 * 128 * (4096.0 * 4097 / 2);
  EXPECT_NEAR(t.attn_prefill_s, attn / g.attn_prefill_flops, 1e-9 * t.attn_prefill_s);
}

TEST(CostModel, ChunkedPrefillAttentionSumsToTheWholePrompt) {
  fs::RooflineCostModel cm(fs::model_preset("llama-3-8b"), fs::gpu_preset("h200"));
  const double whole = cm.breakdown(make_batch({{0, 6000, true}})).attn_prefill_s;
  double chunked = 0;
  for (int64_t s = 0; s < 6000; s += 512)
    chunked +=
        cm.breakdown(make_batch({{s, std::min<int64_t>(512, 6000 - s), true}})).attn_prefill_s;
  EXPECT_NEAR(chunked, whole, 1e-9 * whole);
  // Longer context, same chunk: more work.
  EXPECT_GT(cm.step_seconds(make_batch({{4000, 512, true}})),
            cm.step_seconds(make_batch({{0, 512, true}})));
}

TEST(CostModel, MoreWorkNeverCostsLess) {
  fs::RooflineCostModel cm(fs::model_preset("mistral-7b"), fs::gpu_preset("h200"));
  std::mt19937_64 rng(2);
  for (int t = 0; t < 500; ++t) {
    std::vector<std::tuple<int64_t, int64_t, bool>> e;
    const int n = 1 + static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) {
      const bool prefill = rng() % 3 == 0;
      e.emplace_back(rng() % 8000, prefill ? 1 + rng() % 1024 : 1, prefill);
    }
    const double base = cm.step_seconds(make_batch(e));
    e.emplace_back(rng() % 8000, 1, false);
    EXPECT_GE(cm.step_seconds(make_batch(e)), base);
  }
}

TEST(CostModel, GpuAndModelValidation) {
  fs::GpuSpec g = fs::gpu_preset("h200");
  g.matmul_efficiency = 1.5;
  EXPECT_THROW(fs::RooflineCostModel(fs::model_preset("mistral-7b"), g), Error);
  fs::ModelShape m = fs::model_preset("mistral-7b");
  m.kv_heads = 5;
  EXPECT_THROW(fs::RooflineCostModel(m, fs::gpu_preset("h200")), Error);
  EXPECT_THROW(fs::gpu_preset("b200"), Error);
  // The A100 preset is a valid GPU, slower than the H200 in every figure.
  const fs::GpuSpec a = fs::gpu_preset("a100"), h = fs::gpu_preset("h200");
  EXPECT_NO_THROW(a.validate());
  EXPECT_LT(a.memory_bytes, h.memory_bytes);
  EXPECT_LT(a.matmul_flops, h.matmul_flops);
  EXPECT_LT(a.mem_bw, h.mem_bw);
  EXPECT_LT(a.attn_prefill_flops, h.attn_prefill_flops);
  EXPECT_LT(a.attn_decode_bw, h.attn_decode_bw);
}

// A profile whose tables sample known functions: f1 piecewise linear in one axis, f2 bilinear
// (a + b u + c v + d u v, non-decreasing for non-negative coefficients), so interpolation must
// reproduce them exactly inside the grid and on the edge segments' extensions outside it.
double lin_f(double t) {
  return 3e-3 + 2e-5 * t;
}
double dbase_f(double b) {
  return 2.5e-3 + 1e-5 * b;
}
double pa_f(double c, double k) {
  return 1e-6 * c + 2e-9 * c * k + 1e-5;
}
double da_f(double b, double l) {
  return 1e-8 * b * (l - 1) + 1e-7 * (l - 1);
}

fs::StepProfile known_profile() {
  fs::StepProfile p;
  p.meta["model"] = "synthetic";
  p.linear.x = {1, 16, 128, 512, 2048};
  for (double x : p.linear.x) p.linear.seconds.push_back(lin_f(x));
  p.decode_base.x = {1, 8, 64, 256};
  for (double x : p.decode_base.x) p.decode_base.seconds.push_back(dbase_f(x));
  p.prefill_attn.x = {16, 64, 256, 1024};
  p.prefill_attn.y = {0, 512, 2048, 8192};
  for (double c : p.prefill_attn.x)
    for (double k : p.prefill_attn.y) p.prefill_attn.seconds.push_back(pa_f(c, k));
  p.decode_attn.x = {1, 4, 32, 128};
  p.decode_attn.y = {1, 256, 1024, 4096};
  for (double b : p.decode_attn.x)
    for (double l : p.decode_attn.y) p.decode_attn.seconds.push_back(da_f(b, l));
  p.sample_row_s = 7e-6;
  p.overhead_s = 4e-4;
  return p;
}

TEST(ProfileCostModel, InterpolatesExactlyAtGridPointsAndBilinearFunctionsBetween) {
  const fs::StepProfile p = known_profile();
  for (size_t i = 0; i < p.prefill_attn.x.size(); ++i)
    for (size_t j = 0; j < p.prefill_attn.y.size(); ++j)
      EXPECT_EQ(p.prefill_attn.at(p.prefill_attn.x[i], p.prefill_attn.y[j]),
                p.prefill_attn.cell(i, j));
  for (size_t i = 0; i < p.linear.x.size(); ++i)
    EXPECT_EQ(p.linear.at(p.linear.x[i]), p.linear.seconds[i]);
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(0, 1);
  for (int t = 0; t < 2000; ++t) {
    const double c = 1 + 1500 * u(rng), k = 10000 * u(rng);  // beyond the grid's edges too
    const double b = 1 + 200 * u(rng), l = 1 + 6000 * u(rng), tok = 1 + 3000 * u(rng);
    EXPECT_NEAR(p.prefill_attn.at(c, k), pa_f(c, k), 1e-12 + 1e-9 * pa_f(c, k));
    EXPECT_NEAR(p.decode_attn.at(b, l), da_f(b, l), 1e-12 + 1e-9 * da_f(b, l));
    EXPECT_NEAR(p.linear.at(tok), lin_f(tok), 1e-9 * lin_f(tok));
  }
}

TEST(ProfileCostModel, IsMonotoneBetweenGridPointsOfAMeasuredLookingTable) {
  // Random non-decreasing tables (a running maximum of noise), probed along each axis inside the
  // grid (beyond it the edge segments' extension is monotone along the extended axis only).
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(0, 1);
  fs::ProfileTable2 t;
  t.x = {1, 3, 10, 40, 200};
  t.y = {0, 7, 64, 1000};
  for (size_t n = 0; n < t.x.size() * t.y.size(); ++n) t.seconds.push_back(u(rng));
  fs::make_monotone(t);
  for (int trial = 0; trial < 200; ++trial) {
    const double fixed_x = 1 + 199 * u(rng), fixed_y = 1000 * u(rng);
    double prev_x = -1, prev_y = -1;
    for (double v = 0; v <= 1000; v += 0.25) {
      const double along_x = t.at(std::min(1 + v, 200.0), fixed_y), along_y = t.at(fixed_x, v);
      EXPECT_GE(along_x, prev_x - 1e-15);
      EXPECT_GE(along_y, prev_y - 1e-15);
      prev_x = along_x, prev_y = along_y;
    }
  }
}

TEST(ProfileCostModel, StepTimeAddsTheParts) {
  const fs::ProfileCostModel pm(known_profile(), "known");
  // Decode-only: the decode base and decode attention at the mean KV length.
  const fs::Batch dec = make_batch({{99, 1, false}, {299, 1, false}});
  EXPECT_NEAR(pm.step_seconds(dec), dbase_f(2) + da_f(2, 200) + 4e-4, 1e-12);
  // Mixed: linear over every token, one sample row per sampling entry beyond the first, each
  // chunk's attention at its cached length, the decodes' attention.
  fs::Batch mix = make_batch({{99, 1, false}, {299, 1, false}, {1000, 300, true}, {0, 60, true}});
  mix.entries[3].samples = false;  // a non-final chunk
  const double want = lin_f(362) + 7e-6 * 2 + pa_f(300, 1000) + pa_f(60, 0) + da_f(2, 200) + 4e-4;
  EXPECT_NEAR(pm.step_seconds(mix), want, 1e-12);
  EXPECT_EQ(pm.step_seconds(fs::Batch{}), 0);
}

// Under the CUDA runner's graphs a mixed step runs (and is costed) at its token bucket's rows, up
// to the largest step that takes a graph; decode-only steps and larger steps at their own.
TEST(ProfileCostModel, MixedStepsUnderGraphsCostTheirPaddedRows) {
  fs::ProfileCostModel pm(known_profile(), "known");
  fs::Batch mix = make_batch({{99, 1, false}, {299, 1, false}, {1000, 575, true}});
  const double parts = 7e-6 * 2 + pa_f(575, 1000) + da_f(2, 200) + 4e-4;
  EXPECT_NEAR(pm.step_seconds(mix), lin_f(577) + parts, 1e-12);  // no graphs: its own rows
  flashserve::model::StepGraphOptions graphs;
  graphs.graphs = true;
  graphs.mixed_max_tokens = 2048;
  pm.set_step_graphs(graphs);
  ASSERT_EQ(flashserve::model::token_bucket(577), 640);
  EXPECT_NEAR(pm.step_seconds(mix), lin_f(640) + parts, 1e-12);
  EXPECT_NE(pm.describe().find("padded rows"), std::string::npos) << pm.describe();
  // A budget's full step (a multiple of 64) pads nothing.
  const fs::Batch full = make_batch({{99, 1, false}, {1000, 1023, true}});
  EXPECT_NEAR(pm.step_seconds(full), lin_f(1024) + 7e-6 + pa_f(1023, 1000) + da_f(1, 100) + 4e-4,
              1e-12);
  // Past mixed_max_tokens the step runs eager, at its own rows.
  graphs.mixed_max_tokens = 512;
  pm.set_step_graphs(graphs);
  EXPECT_NEAR(pm.step_seconds(mix), lin_f(577) + parts, 1e-12);
  // Decode-only steps are the decode tables' whatever the graphs.
  const fs::Batch dec = make_batch({{99, 1, false}, {299, 1, false}});
  EXPECT_NEAR(pm.step_seconds(dec), dbase_f(2) + da_f(2, 200) + 4e-4, 1e-12);
  // Graphs off: no padding.
  graphs.graphs = false;
  graphs.mixed_max_tokens = 2048;
  pm.set_step_graphs(graphs);
  EXPECT_NEAR(pm.step_seconds(mix), lin_f(577) + parts, 1e-12);
}

TEST(ProfileCostModel, CsvRoundTripsAndRejectsMalformedTables) {
  const fs::StepProfile p = known_profile();
  std::stringstream io;
  p.write_csv(io);
  const fs::StepProfile q = fs::StepProfile::read_csv(io, "rt.csv");
  EXPECT_EQ(q.prefill_attn.seconds, p.prefill_attn.seconds);
  EXPECT_EQ(q.decode_attn.y, p.decode_attn.y);
  EXPECT_EQ(q.linear.seconds, p.linear.seconds);
  EXPECT_EQ(q.overhead_s, p.overhead_s);
  EXPECT_EQ(q.meta.at("model"), "synthetic");

  auto err = [](const std::string& text) {
    std::istringstream in(text);
    try {
      fs::StepProfile::read_csv(in, "p.csv");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string h = "table,x,y,seconds\n";
  const std::string ok = h +
                         "linear,1,0,1\nlinear,8,0,2\ndecode_base,1,0,1\n"
                         "prefill_attn,16,0,1\nprefill_attn,16,64,2\n"
                         "decode_attn,1,1,0\nsample_row,0,0,0\noverhead,0,0,0\n";
  EXPECT_EQ(err(ok), "accepted");
  EXPECT_NE(err("prefill_tokens,seconds\n").find("header"), std::string::npos);
  EXPECT_NE(err(ok + "prefill_attn,32,0,3\n").find("full 2 x 2 grid"), std::string::npos);
  EXPECT_NE(err(ok + "linear,8,0,3\n").find("duplicate"), std::string::npos);
  EXPECT_NE(err(ok + "linear,9,0,x\n").find("p.csv:10"), std::string::npos);
  EXPECT_NE(err(ok + "linear,9,0,1.5\n").find("linear decreases"), std::string::npos);
  EXPECT_NE(err(ok + "bogus,1,0,1\n").find("unknown table"), std::string::npos);
  EXPECT_NE(err(ok + "linear,9,0,-1\n").find(">= 0"), std::string::npos);
  EXPECT_NE(err(h + "linear,1,0,1\n").find("sample_row"), std::string::npos);
  EXPECT_THROW(fs::ProfileCostModel::load("/nonexistent.csv"), Error);
}

// Tensor parallelism: the profile's tables are one rank's compute, and a step adds
// all_reduces_per_step all-reduces of (its tokens x bytes a token), each read off the all_reduce
// table by message size, and one all-gather of (its sampled rows x bytes a row) off the
// all_gather table; nothing else changes.
TEST(ProfileCostModel, TensorParallelStepAddsItsCollectivesBySize) {
  const fs::StepProfile one = known_profile();
  fs::StepProfile tp = one;
  tp.all_reduce.x = {1024, 1 << 20, 1 << 24};
  tp.all_reduce.seconds = {10e-6, 40e-6, 400e-6};
  tp.all_reduces_per_step = 2 * 32;          // two a layer, 32 layers
  tp.all_reduce_bytes_per_token = 4096 * 2;  // hidden 4096, bf16 activations
  tp.all_gather.x = {1 << 16, 1 << 22};
  tp.all_gather.seconds = {20e-6, 300e-6};
  tp.logits_gather_bytes_per_row = 64128 * 4;  // Llama-3's vocabulary over 2 ranks, float32
  const fs::ProfileCostModel pm1(one, "tp1"), pm(tp, "tp2");
  // By hand: piecewise linear between the table's points.
  auto ar = [](double bytes) {
    if (bytes <= (1 << 20)) return 10e-6 + (bytes - 1024) / ((1 << 20) - 1024) * 30e-6;
    return 40e-6 + (bytes - (1 << 20)) / ((1 << 24) - (1 << 20)) * 360e-6;
  };
  auto ag = [](double bytes) {
    return 20e-6 + (bytes - (1 << 16)) / ((1 << 22) - (1 << 16)) * 280e-6;
  };
  const fs::Batch dec = make_batch({{99, 1, false}, {299, 1, false}});
  // Two decodes, a chunk that ends its prompt (sampled) and one that does not.
  fs::Batch mix = make_batch({{99, 1, false}, {299, 1, false}, {1000, 300, true}, {0, 60, true}});
  for (const fs::Batch* b : std::vector<const fs::Batch*>{&dec, &mix}) {
    const double tokens = static_cast<double>(b->num_tokens());
    const double sampled = static_cast<double>(b->num_sampled());
    ASSERT_GE(sampled, 2);
    const double want_ar = 64 * ar(tokens * 8192), want_ag = ag(sampled * 64128 * 4);
    EXPECT_NEAR(pm.breakdown(*b).all_reduce_s, want_ar, 1e-15);
    EXPECT_NEAR(pm.breakdown(*b).all_gather_s, want_ag, 1e-15);
    EXPECT_NEAR(pm.step_seconds(*b), pm1.step_seconds(*b) + want_ar + want_ag, 1e-12);
    EXPECT_EQ(pm1.breakdown(*b).all_reduce_s, 0);
    EXPECT_EQ(pm1.breakdown(*b).all_gather_s, 0);
  }
  EXPECT_NE(pm.describe().find("64 all-reduces a step"), std::string::npos) << pm.describe();
  EXPECT_NE(pm.describe().find("all-gather of 256512 bytes a sampled row"), std::string::npos)
      << pm.describe();

  std::stringstream io;
  tp.write_csv(io);
  const fs::StepProfile q = fs::StepProfile::read_csv(io, "tp.csv");
  EXPECT_EQ(q.all_reduce.x, tp.all_reduce.x);
  EXPECT_EQ(q.all_reduce.seconds, tp.all_reduce.seconds);
  EXPECT_EQ(q.all_reduces_per_step, 64);
  EXPECT_EQ(q.all_reduce_bytes_per_token, 8192);
  EXPECT_EQ(q.all_gather.x, tp.all_gather.x);
  EXPECT_EQ(q.all_gather.seconds, tp.all_gather.seconds);
  EXPECT_EQ(q.logits_gather_bytes_per_row, 64128 * 4);

  // The table without the step's count of all-reduces (or the reverse) is refused by name.
  fs::StepProfile half = tp;
  half.all_reduces_per_step = 0;
  EXPECT_THROW(half.validate("half"), Error);
  half = one;
  half.all_reduces_per_step = 64;
  half.all_reduce_bytes_per_token = 8192;
  EXPECT_THROW(half.validate("half"), Error);
  half = tp;
  half.all_reduce.seconds = {10e-6, 5e-6, 400e-6};
  EXPECT_THROW(half.validate("half"), Error);  // decreasing
  // Likewise the gather's table and its bytes a row; and a profile with one collective's table
  // but not the other's (one measured before the gather was) is refused, not costed without it.
  const auto refused = [](const fs::StepProfile& p, const std::string& what) {
    try {
      p.validate("half");
    } catch (const Error& e) {
      return std::string(e.what()).find(what) != std::string::npos;
    }
    return false;
  };
  half = tp;
  half.logits_gather_bytes_per_row = 0;
  EXPECT_TRUE(refused(half, "logits_gather row"));
  half = tp;
  half.all_gather = {};
  half.logits_gather_bytes_per_row = 0;
  EXPECT_TRUE(refused(half, "measure it again"));
  half = tp;
  half.all_gather.seconds = {20e-6, 10e-6};
  EXPECT_TRUE(refused(half, "all_gather decreases"));
  std::stringstream before_the_gather;
  half = tp;
  half.all_gather = {};
  half.logits_gather_bytes_per_row = 0;
  half.write_csv(before_the_gather);
  try {
    fs::StepProfile::read_csv(before_the_gather, "old-tp.csv");
    ADD_FAILURE() << "a profile without the all_gather table was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("old-tp.csv"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("measure it again"), std::string::npos) << e.what();
  }
}

}  // namespace

// An fp8 (e4m3) KV cache: one byte per element, so a token's K and V take half of bf16's bytes,
// the same GPU memory holds at least twice the blocks, and a decode reads half the KV bytes.
namespace {
TEST(CostModel, Fp8KvCacheHalvesTheKvBytes) {
  fs::ModelShape bf16 = fs::model_preset("mistral-7b"), fp8 = bf16;
  fp8.kv_bytes_per_elem = 1;
  EXPECT_EQ(fp8.kv_bytes_per_token() * 2, bf16.kv_bytes_per_token());
  EXPECT_EQ(fp8.weight_bytes(), bf16.weight_bytes());  // the weights stay bf16
  const fs::GpuSpec g = fs::gpu_preset("h200");
  const int64_t n16 = fs::kv_blocks_for(bf16, g.memory_bytes, 0.9, 16);
  const int64_t n8 = fs::kv_blocks_for(fp8, g.memory_bytes, 0.9, 16);
  EXPECT_GE(n8, 2 * n16);
  EXPECT_LE(n8, 2 * n16 + 1);  // floor(2x) of the same budget
  const fs::Batch decode = make_batch({{4000, 1, false}, {2000, 1, false}});
  const fs::StepTime t16 = fs::RooflineCostModel(bf16, g).breakdown(decode);
  const fs::StepTime t8 = fs::RooflineCostModel(fp8, g).breakdown(decode);
  EXPECT_NEAR(t8.attn_decode_s * 2, t16.attn_decode_s, 1e-12);  // bandwidth-bound decode
  EXPECT_EQ(t8.linear_s, t16.linear_s);
  fp8.kv_bytes_per_elem = 0;
  EXPECT_THROW(fp8.validate(), Error);
}
}  // namespace
