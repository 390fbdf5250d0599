#include "engine/step_profiler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>

#include "engine/model_executor.h"
#include "engine/simulator.h"
#include "flashserve/error.h"
#include "serve/batch.h"
#include "serve/cost_model.h"
#include "serve/sequence.h"
#include "serve/workload.h"

namespace flashserve::engine {

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, field, what);
}

std::vector<double> as_double(const std::vector<int64_t>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// One constructed step: its sequences (owning their tokens and block tables) and the batch over
// them. Blocks are handed out in order from 0 and never shared, so every K/V read is a real read
// (aliased blocks would sit in the GPU's L2 and flatter decode attention).
class StepBuilder {
 public:
  StepBuilder(int64_t vocab, int32_t block_size, int64_t num_blocks)
      : vocab_(vocab), block_size_(block_size), num_blocks_(num_blocks) {}

  // Whether `entries` sequences of `kv_len` tokens fit the pool.
  bool fits(int64_t entries, int64_t kv_len) const {
    return entries * ((kv_len + block_size_ - 1) / block_size_) <= num_blocks_;
  }
  // An entry of q_len new tokens after q_start cached ones.
  void add(int64_t q_start, int64_t q_len, bool prefill, bool samples) {
    auto seq = std::make_unique<serve::Sequence>();
    const int64_t kv = q_start + q_len;
    seq->id = static_cast<int64_t>(seqs_.size());
    seq->prompt.resize(static_cast<size_t>(kv));
    for (auto& t : seq->prompt) t = static_cast<int32_t>(rng_() % static_cast<uint64_t>(vocab_));
    const int64_t blocks = (kv + block_size_ - 1) / block_size_;
    if (next_block_ + blocks > num_blocks_)
      bad("profile",
          "a step of the grid needs more KV blocks than the pool's " + std::to_string(num_blocks_));
    for (int64_t b = 0; b < blocks; ++b)
      seq->block_table.push_back(static_cast<int32_t>(next_block_++));
    seq->num_computed = q_start;
    serve::BatchEntry e;
    e.seq = seq.get();
    e.q_start = q_start;
    e.q_len = q_len;
    e.kv_len = kv;
    e.is_prefill = prefill;
    e.samples = samples;
    batch_.entries.push_back(e);
    seqs_.push_back(std::move(seq));
  }
  const serve::Batch& batch() const { return batch_; }

 private:
  int64_t vocab_;
  int32_t block_size_;
  int64_t num_blocks_, next_block_ = 0;
  std::mt19937_64 rng_{12345};
  std::vector<std::unique_ptr<serve::Sequence>> seqs_;
  serve::Batch batch_;
};

class Profiler {
 public:
  Profiler(const LoadedModel& m, const ProfileGrid& g, const ProfileProgress& progress)
      : model_(m),
        grid_(g),
        progress_(progress),
        exec_(m.runner, m.block_size, m.device),
        vocab_(m.runner->config().vocab_size) {}

  // Median seconds of the step `fill` builds.
  template <typename Fill>
  double time(Fill fill) {
    StepBuilder b(vocab_, model_.block_size, model_.num_blocks);
    fill(b);
    std::vector<double> t;
    for (int r = 0; r < grid_.warmup + grid_.reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      exec_.execute(b.batch());  // returns the sampled tokens: the device has finished
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r >= grid_.warmup) t.push_back(s);
    }
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    return t[t.size() / 2];
  }

  void point(const std::string& what) {
    if (progress_.on_point) progress_.on_point(what, ++done_, total_);
  }
  void set_total(int64_t n) { total_ = n; }

 private:
  const LoadedModel& model_;
  const ProfileGrid& grid_;
  const ProfileProgress& progress_;
  ModelExecutor exec_;
  int64_t vocab_;
  int64_t done_ = 0, total_ = 0;
};

}  // namespace

ProfileGrid ProfileGrid::quick() {
  ProfileGrid g;
  g.tokens = {1, 16, 64, 192};
  g.decode_batch = {1, 4, 16};
  g.decode_kv = {1, 128, 384};
  g.chunk = {16, 64, 128};
  g.cached = {0, 128, 384};
  g.reps = 3;
  g.warmup = 1;
  return g;
}

ProfileGrid ProfileGrid::smoke() {
  ProfileGrid g;
  g.tokens = {1, 16};
  g.decode_batch = {1, 2};
  g.decode_kv = {1, 32};
  g.chunk = {8, 16};
  g.cached = {0, 16};
  g.reps = 1;
  g.warmup = 0;
  return g;
}

ProfileGrid ProfileGrid::full(int64_t max_len) {
  ProfileGrid g;
  auto upto = [&](std::vector<int64_t> v, bool keep_edge) {
    std::vector<int64_t> out;
    for (int64_t x : v)
      if (x < max_len) out.push_back(x);
    if (keep_edge) out.push_back(max_len);
    return out;
  };
  g.tokens = upto(
      {1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144}, true);
  g.decode_batch = {1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256};
  g.decode_kv = upto({1, 256, 512, 1024, 2048, 4096}, true);
  g.chunk = upto({16, 32, 64, 128, 256, 512, 1024, 2048, 4096}, true);
  g.cached = upto({0, 512, 1024, 2048, 4096}, true);
  g.reps = 3;
  g.warmup = 1;
  return g;
}

void ProfileGrid::validate() const {
  auto axis = [](const std::vector<int64_t>& v, const char* name, int64_t first) {
    if (v.empty()) bad(name, "has no points");
    if (first >= 0 && v[0] != first) bad(name, "must start at " + std::to_string(first));
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] < 0 || (first != 0 && v[i] < 1)) bad(name, "has a point below its range");
      if (i > 0 && v[i] <= v[i - 1]) bad(name, "is not strictly increasing");
    }
  };
  axis(tokens, "grid.tokens", -1);
  axis(decode_batch, "grid.decode_batch", -1);
  axis(decode_kv, "grid.decode_kv", 1);
  axis(chunk, "grid.chunk", -1);
  axis(cached, "grid.cached", 0);
  if (reps < 1 || warmup < 0) bad("grid.reps", "reps must be >= 1 and warmup >= 0");
}

serve::StepProfile profile_model(const LoadedModel& model, const ProfileGrid& g,
                                 const ProfileProgress& progress) {
  g.validate();
  const model::ModelConfig& c = model.runner->config();
  for (int64_t ch : g.chunk)
    for (int64_t k : g.cached)
      if (ch + k > c.max_position_embeddings)
        bad("grid", "chunk " + std::to_string(ch) + " after " + std::to_string(k) +
                        " cached tokens exceeds the model's " +
                        std::to_string(c.max_position_embeddings) + " positions");
  Profiler pr(model, g, progress);
  const size_t nb = g.decode_batch.size(), nl = g.decode_kv.size();
  pr.set_total(
      static_cast<int64_t>(g.tokens.size() + 1 + nb * nl + g.chunk.size() * g.cached.size()));
  serve::StepProfile p;
  p.meta["model"] = c.architecture + " " + std::to_string(c.num_hidden_layers) +
                    " layers, hidden " + std::to_string(c.hidden_size) + ", heads " +
                    std::to_string(c.num_attention_heads) + "/" +
                    std::to_string(c.num_key_value_heads) + ", ffn " +
                    std::to_string(c.intermediate_size) + ", vocab " + std::to_string(c.vocab_size);
  p.meta["device"] = model.device;
  p.meta["method"] =
      "whole steps through the engine's executor (layout, forward, sample), median of " +
      std::to_string(g.reps) + " after " + std::to_string(g.warmup) +
      " warm-up; parts by differences (serve/step_profile.h); running maximum along each axis";

  // linear(T): T one-token entries at KV 1, one sampled.
  auto ones = [](StepBuilder& b, int64_t n, int64_t sampled, int64_t kv) {
    for (int64_t i = 0; i < n; ++i) b.add(kv - 1, 1, false, i < sampled);
  };
  p.linear.x = as_double(g.tokens);
  for (int64_t t : g.tokens) {
    p.linear.seconds.push_back(pr.time([&](StepBuilder& b) { ones(b, t, 1, 1); }));
    pr.point("linear " + std::to_string(t));
  }
  // sample_row: the same step with all but one entry sampled (all would be a decode-only step,
  // which on the GPU replays a graph), at the largest token count <= 512.
  {
    int64_t t = 0;
    size_t at = 0;
    for (size_t i = 0; i < g.tokens.size(); ++i)
      if (g.tokens[i] <= 512 && g.tokens[i] >= 3) t = g.tokens[i], at = i;
    if (t > 0) {
      const double s = pr.time([&](StepBuilder& b) { ones(b, t, t - 1, 1); });
      p.sample_row_s = std::max(0.0, (s - p.linear.seconds[at]) / static_cast<double>(t - 2));
    }
    pr.point("sample rows");
  }
  // decode_base(B) and decode_attn(B, L): decode-only steps, every entry sampled.
  p.decode_base.x = as_double(g.decode_batch);
  p.decode_attn.x = as_double(g.decode_batch);
  p.decode_attn.y = as_double(g.decode_kv);
  p.decode_attn.seconds.assign(nb * nl, -1);
  std::string extrapolated;
  for (size_t i = 0; i < nb; ++i) {
    const int64_t bsz = g.decode_batch[i];
    StepBuilder probe(c.vocab_size, model.block_size, model.num_blocks);
    if (!probe.fits(bsz, 1))
      bad("grid.decode_batch", std::to_string(bsz) + " decodes do not fit the pool");
    std::vector<double> measured(nl, -1);
    for (size_t j = 0; j < nl; ++j) {
      const int64_t l = g.decode_kv[j];
      if (probe.fits(bsz, l)) measured[j] = pr.time([&](StepBuilder& b) { ones(b, bsz, bsz, l); });
      pr.point("decode " + std::to_string(bsz) + " x " + std::to_string(l));
    }
    p.decode_base.seconds.push_back(measured[0]);
    size_t last = 0;  // the largest measured L
    for (size_t j = 0; j < nl; ++j) {
      if (measured[j] >= 0) {
        p.decode_attn.cell(i, j) = std::max(0.0, measured[j] - measured[0]);
        last = j;
        continue;
      }
      // Not measured (the pool is too small): linear in L through the row's last two measured
      // points, or through (1, 0) and the last one.
      size_t prev = 0;
      for (size_t k = 0; k < last; ++k)
        if (measured[k] >= 0) prev = k;
      const double x0 = p.decode_attn.y[prev], x1 = p.decode_attn.y[last];
      const double y0 = p.decode_attn.cell(i, prev), y1 = p.decode_attn.cell(i, last);
      const double slope = last > 0 ? std::max(0.0, (y1 - y0) / (x1 - x0)) : 0.0;
      p.decode_attn.cell(i, j) = y1 + slope * (p.decode_attn.y[j] - x1);
      extrapolated += (extrapolated.empty() ? "" : " ") + std::to_string(bsz) + "x" +
                      std::to_string(g.decode_kv[j]);
    }
  }
  if (!extrapolated.empty())
    p.meta["extrapolated"] = "decode_attn points beyond the KV pool: " + extrapolated;
  // prefill_attn(C, K): one chunk after K cached tokens (sampled, as a last chunk is), minus
  // linear(C) (also one sampled row).
  p.prefill_attn.x = as_double(g.chunk);
  p.prefill_attn.y = as_double(g.cached);
  for (int64_t ch : g.chunk) {
    const double base = pr.time([&](StepBuilder& b) { ones(b, ch, 1, 1); });
    for (int64_t k : g.cached) {
      const double s = pr.time([&](StepBuilder& b) { b.add(k, ch, true, true); });
      p.prefill_attn.seconds.push_back(std::max(0.0, s - base));
      pr.point("prefill " + std::to_string(ch) + " after " + std::to_string(k));
    }
  }
  serve::make_monotone(p.linear);
  serve::make_monotone(p.decode_base);
  serve::make_monotone(p.decode_attn);
  serve::make_monotone(p.prefill_attn);
  p.overhead_s = measure_engine_overhead();
  p.validate("profile");
  return p;
}

double measure_engine_overhead() {
  // Any step cost: the clock is simulated, so the wall time is the engine's own.
  struct Fixed final : serve::CostModel {
    double step_seconds(const serve::Batch&) const override { return 0.01; }
    std::string describe() const override { return "fixed"; }
  } fixed;
  serve::WorkloadSpec spec;
  spec.num_requests = 64;
  spec.rate = 1e6;  // all at once: the engine is never idle
  spec.lengths = serve::LengthKind::kFixed;
  spec.fixed_prompt = 200;
  spec.fixed_output = 32;
  spec.max_model_len = 4096;
  const auto reqs = serve::generate_workload(spec);
  SimConfig sc;
  sc.scheduler.max_tokens_per_step = 512;
  sc.scheduler.max_model_len = 4096;
  sc.num_blocks = 4096;
  double best = 1e9;
  for (int r = 0; r < 3; ++r) {  // the fastest of three: the least disturbed by other processes
    const auto t0 = std::chrono::steady_clock::now();
    const SimResult res = simulate(reqs, sc, fixed);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s / static_cast<double>(std::max<int64_t>(res.steps, 1)));
  }
  return best;
}

}  // namespace flashserve::engine
