// Cost models: the presets' parameter counts against the published totals, the roofline's regimes
// (memory-bound decode, compute-bound prefill), chunked prefill attention summing to the whole
// prompt's, and the profile table's trilinear interpolation against a known multilinear function.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>

#include "flashserve/error.h"
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

// A multilinear function is reproduced exactly by trilinear interpolation, inside and outside
// the grid.
double f(double p, double d, double k) {
  return 2e-3 + 1e-5 * p + 3e-5 * d + 2e-9 * k + 1e-9 * p * d + 1e-13 * p * k + 3e-12 * d * k +
         1e-16 * p * d * k;
}

std::string grid_csv(bool shuffle_columns) {
  std::ostringstream o;
  o << (shuffle_columns ? "seconds,kv_tokens,prefill_tokens,decode_tokens\n"
                        : "prefill_tokens,decode_tokens,kv_tokens,seconds\n");
  o.precision(17);
  for (double p : {0, 128, 512, 2048})
    for (double d : {0, 1, 16, 64, 256})
      for (double k : {0.0, 1e4, 1e5, 1e6}) {
        if (shuffle_columns)
          o << f(p, d, k) << "," << k << "," << p << "," << d << "\n";
        else
          o << p << "," << d << "," << k << "," << f(p, d, k) << "\n";
      }
  return o.str();
}

TEST(ProfileCostModel, InterpolatesAMultilinearFunctionExactly) {
  for (bool shuffle : {false, true}) {
    std::istringstream in(grid_csv(shuffle));
    fs::ProfileCostModel pm(in, "grid.csv");
    std::mt19937_64 rng(5);
    for (int t = 0; t < 1000; ++t) {
      const double p = std::uniform_real_distribution<double>(0, 3000)(rng);  // beyond 2048 too
      const double d = std::uniform_real_distribution<double>(0, 300)(rng);
      const double k = std::uniform_real_distribution<double>(0, 1.5e6)(rng);
      EXPECT_NEAR(pm.at(p, d, k), f(p, d, k), 1e-9 * f(p, d, k));
    }
    // Through a Batch: the features are prefill tokens, decodes, and keys over the whole batch.
    const fs::Batch b = make_batch({{1000, 300, true}, {500, 1, false}, {20, 1, false}});
    EXPECT_NEAR(pm.step_seconds(b), f(300, 2, 1300 + 501 + 21), 1e-12);
  }
}

TEST(ProfileCostModel, RejectsMalformedTables) {
  auto err = [](const std::string& text) {
    std::istringstream in(text);
    try {
      fs::ProfileCostModel pm(in, "p.csv");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string h = "prefill_tokens,decode_tokens,kv_tokens,seconds\n";
  EXPECT_NE(err("prefill_tokens,decode_tokens,seconds\n1,2,3\n").find("kv_tokens"),
            std::string::npos);
  EXPECT_NE(err(h + "0,0,0,1\n0,1,0,2\n1,0,0,3\n").find("full 2 x 2 x 1 grid"), std::string::npos);
  EXPECT_NE(err(h + "0,0,0,x\n").find("p.csv:2"), std::string::npos);
  EXPECT_NE(err(h + "0,0,0,1\n0,0,0,2\n").find("duplicate"), std::string::npos);
  EXPECT_NE(err(h + "0,0,-1,1\n").find(">= 0"), std::string::npos);
  EXPECT_NE(err(h).find("no rows"), std::string::npos);
  EXPECT_EQ(err(h + "0,0,0,0.01\n"), "accepted");  // a single point: a constant model
  EXPECT_THROW(fs::ProfileCostModel::load("/nonexistent.csv"), Error);
}

}  // namespace
