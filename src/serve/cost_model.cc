#include "serve/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "flashserve/error.h"
#include "model/presets.h"

namespace flashserve::serve {

namespace {
[[noreturn]] void bad(const std::string& field, const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, field, what);
}
}  // namespace

std::vector<std::string> model_preset_names() {
  return {"mistral-7b", "llama-3-8b", "yi-34b", "llama-2-70b"};
}

ModelShape model_preset(const std::string& name) {
  for (const std::string& n : model_preset_names())
    if (n == name) return model::preset_config(name).shape(name);
  std::string list;
  for (const std::string& n : model_preset_names()) list += (list.empty() ? "" : ", ") + n;
  bad("model", "'" + name + "' is not one of " + list);
}

void GpuSpec::validate() const {
  auto pos = [&](double v, const char* f) {
    if (!(v > 0) || !std::isfinite(v)) bad(f, std::to_string(v) + " must be positive");
  };
  pos(memory_bytes, "gpu.memory_bytes");
  pos(matmul_flops, "gpu.matmul_flops");
  pos(mem_bw, "gpu.mem_bw");
  pos(attn_prefill_flops, "gpu.attn_prefill_flops");
  pos(attn_decode_bw, "gpu.attn_decode_bw");
  if (!(matmul_efficiency > 0 && matmul_efficiency <= 1))
    bad("gpu.matmul_efficiency", "must be in (0, 1]");
  if (!(weight_bw_efficiency > 0 && weight_bw_efficiency <= 1))
    bad("gpu.weight_bw_efficiency", "must be in (0, 1]");
  if (!(step_overhead_s >= 0)) bad("gpu.step_overhead_s", "must be >= 0");
}

GpuSpec gpu_preset(const std::string& name) {
  if (name == "a100") {
    // A100-SXM4-80GB, for holding the simulator against the Sarathi-Serve paper's A100 figures.
    // Nothing here is measured by us: the peaks are NVIDIA's datasheet (312 TFLOP/s dense bf16,
    // 2.039 TB/s HBM2e) scaled by the fractions of peak we measured on the H200 (GEMM 791 of 989
    // TFLOP/s, copy 4.21 of 4.8 TB/s, decode attention 2.5 of 4.21 TB/s of copy); prefill
    // attention from the FlashAttention-2 paper's A100 forward curves (causal, head dim 128,
    // 1k-8k tokens: about 160-200 TFLOP/s).
    GpuSpec g;
    g.name = "a100";
    g.memory_bytes = 80.0 * (1ull << 30);
    g.matmul_flops = 312e12 * (791.0 / 989.0);
    g.matmul_efficiency = 0.7;
    g.mem_bw = 2.039e12 * (4.21 / 4.8);
    g.weight_bw_efficiency = 0.85;
    g.attn_prefill_flops = 180e12;
    g.attn_decode_bw = g.mem_bw * (2.5 / 4.21);
    g.step_overhead_s = 1.5e-3;
    return g;
  }
  if (name != "h200") bad("gpu", "'" + name + "' is not one of h200, a100");
  GpuSpec g;
  g.name = "h200";
  g.memory_bytes = 139.0 * (1ull << 30);  // what the device machine reports as usable
  g.matmul_flops = 791e12;                // cuBLAS bf16 8192^3, measured
  // Serving GEMMs are a few hundred to a few thousand rows tall: they reach less than the square
  // 8192^3 GEMM. 0.7 is our assumption until the engine's profile table replaces it.
  g.matmul_efficiency = 0.7;
  g.mem_bw = 4.21e12;  // device-to-device copy, read + write, measured
  // A pure read stream of the weights (a GEMV-like step) reaches ~85% of the copy rate on Hopper.
  g.weight_bw_efficiency = 0.85;
  // PyTorch flash (FA2) causal bf16 hdim 128 forward measured 231-300 TFLOP/s for 1k-8k tokens; a
  // chunk is short, so we take the low end. Our own kernels must at least match it.
  g.attn_prefill_flops = 250e12;
  // PyTorch flash decode measured 2.46-2.58 TB/s of K/V read (GQA 32/8, hdim 128).
  g.attn_decode_bw = 2.5e12;
  g.step_overhead_s = 1.5e-3;  // assumption: kernel launches (no CUDA graphs yet) + host work
  return g;
}

int64_t kv_blocks_for(const ModelShape& model, double gpu_memory_bytes,
                      double gpu_memory_utilization, int32_t block_size) {
  if (block_size < 1)
    throw Error(ErrorKind::kInvalidArgument, "block_size",
                std::to_string(block_size) + " must be positive");
  if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1))
    throw Error(ErrorKind::kInvalidArgument, "gpu_memory_utilization",
                std::to_string(gpu_memory_utilization) + " is not in (0, 1]");
  const double left =
      gpu_memory_bytes * gpu_memory_utilization - static_cast<double>(model.weight_bytes());
  const double block_bytes = static_cast<double>(model.kv_bytes_per_token()) * block_size;
  const int64_t n = left > 0 ? static_cast<int64_t>(left / block_bytes) : 0;
  if (n < 1)
    throw Error(ErrorKind::kInvalidArgument, "model",
                model.name + "'s weights (" +
                    std::to_string(static_cast<double>(model.weight_bytes()) / 1e9) +
                    " GB) leave no room for a KV cache in " +
                    std::to_string(gpu_memory_bytes * gpu_memory_utilization / 1e9) + " GB");
  return n;
}

RooflineCostModel::RooflineCostModel(ModelShape model, GpuSpec gpu)
    : model_(std::move(model)), gpu_(std::move(gpu)) {
  model_.validate();
  gpu_.validate();
}

StepTime RooflineCostModel::breakdown(const Batch& batch) const {
  StepTime t;
  if (batch.empty()) return t;
  const ModelShape& m = model_;
  const double tokens = static_cast<double>(batch.num_tokens());
  const double sampled = static_cast<double>(batch.num_sampled());
  // Linear layers: every token goes through every layer's matmuls; only sampling rows need the LM
  // head. The weights are read once per step whatever the batch size.
  const double layer_params = static_cast<double>(m.layers * m.layer_linear_params());
  const double head_params = static_cast<double>(m.hidden * m.vocab);
  const double linear_flops = 2.0 * tokens * layer_params + 2.0 * sampled * head_params;
  const double weight_bytes = (layer_params + head_params) * static_cast<double>(m.bytes_per_param);
  t.linear_s = std::max(linear_flops / (gpu_.matmul_flops * gpu_.matmul_efficiency),
                        weight_bytes / (gpu_.mem_bw * gpu_.weight_bw_efficiency));
  // Attention. Per layer and query head: QK^T and PV are 4 * head_dim FLOPs per (query, key) pair.
  // A chunk of q tokens after c cached ones sees c + (t+1) keys for its t-th token: q*c + q(q+1)/2.
  const double pair_flops = 4.0 * static_cast<double>(m.layers * m.heads * m.head_dim);
  const double kv_bytes = static_cast<double>(m.kv_bytes_per_token());
  double pf_flops = 0, pf_bytes = 0, dec_flops = 0, dec_bytes = 0;
  for (const BatchEntry& e : batch.entries) {
    const double q = static_cast<double>(e.q_len), c = static_cast<double>(e.q_start);
    const double pairs = q * c + q * (q + 1) / 2;
    if (e.is_prefill) {
      pf_flops += pair_flops * pairs;
      pf_bytes += kv_bytes * static_cast<double>(e.kv_len);
    } else {
      dec_flops += pair_flops * pairs;
      dec_bytes += kv_bytes * static_cast<double>(e.kv_len);
    }
  }
  t.attn_prefill_s = std::max(pf_flops / gpu_.attn_prefill_flops, pf_bytes / gpu_.attn_decode_bw);
  t.attn_decode_s = std::max(dec_flops / gpu_.attn_prefill_flops, dec_bytes / gpu_.attn_decode_bw);
  t.overhead_s = gpu_.step_overhead_s;
  return t;
}

std::string RooflineCostModel::describe() const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "roofline: %s (%.2fB linear params, %.0f KiB KV/token) on %s: GEMM %.0f TFLOP/s x "
                "%.2f, weights %.2f TB/s x %.2f, attention %.0f TFLOP/s / KV %.2f TB/s, "
                "overhead %.2f ms/step",
                model_.name.c_str(), static_cast<double>(model_.linear_params()) / 1e9,
                static_cast<double>(model_.kv_bytes_per_token()) / 1024.0, gpu_.name.c_str(),
                gpu_.matmul_flops / 1e12, gpu_.matmul_efficiency, gpu_.mem_bw / 1e12,
                gpu_.weight_bw_efficiency, gpu_.attn_prefill_flops / 1e12,
                gpu_.attn_decode_bw / 1e12, gpu_.step_overhead_s * 1e3);
  return buf;
}

ProfileCostModel::ProfileCostModel(StepProfile profile, std::string name)
    : profile_(std::move(profile)), name_(std::move(name)) {
  profile_.validate(name_);
}

ProfileCostModel ProfileCostModel::load(const std::string& path) {
  return ProfileCostModel(StepProfile::load(path), path);
}

StepTime ProfileCostModel::breakdown(const Batch& batch) const {
  StepTime t;
  if (batch.empty()) return t;
  const StepProfile& p = profile_;
  double decodes = 0, decode_kv = 0;
  bool any_prefill = false;
  for (const BatchEntry& e : batch.entries) {
    if (e.is_prefill) {
      any_prefill = true;
      t.attn_prefill_s +=
          p.prefill_attn.at(static_cast<double>(e.q_len), static_cast<double>(e.q_start));
    } else {
      decodes += 1;
      decode_kv += static_cast<double>(e.kv_len);
    }
  }
  if (any_prefill) {
    const double sampled = static_cast<double>(batch.num_sampled());
    t.linear_s =
        p.linear.at(static_cast<double>(model::mixed_step_rows(batch.num_tokens(), graphs_))) +
        p.sample_row_s * std::max(sampled - 1, 0.0);
  } else {
    t.linear_s = p.decode_base.at(decodes);
  }
  if (decodes > 0) t.attn_decode_s = p.decode_attn.at(decodes, decode_kv / decodes);
  t.overhead_s = p.overhead_s;
  t.all_reduce_s = p.all_reduce_seconds(static_cast<double>(batch.num_tokens()));
  t.all_gather_s = p.logits_gather_seconds(static_cast<double>(batch.num_sampled()));
  return t;
}

std::string ProfileCostModel::describe() const {
  const StepProfile& p = profile_;
  auto get = [&](const char* k) {
    const auto it = p.meta.find(k);
    return it == p.meta.end() ? std::string("?") : it->second;
  };
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "profile: %s (%s on %s; linear %zu points, decode base %zu, prefill attention %zu "
                "x %zu, decode attention %zu x %zu, %.1f us/sampled row, overhead %.3f ms/step)",
                name_.c_str(), get("model").c_str(), get("device").c_str(), p.linear.x.size(),
                p.decode_base.x.size(), p.prefill_attn.x.size(), p.prefill_attn.y.size(),
                p.decode_attn.x.size(), p.decode_attn.y.size(), p.sample_row_s * 1e6,
                p.overhead_s * 1e3);
  std::string out = buf;
  if (!p.all_reduce.x.empty())
    out += "; tensor parallel: " + std::to_string(p.all_reduces_per_step) +
           " all-reduces a step of " +
           std::to_string(static_cast<int64_t>(p.all_reduce_bytes_per_token)) +
           " bytes a token, the logits' all-gather of " +
           std::to_string(static_cast<int64_t>(p.logits_gather_bytes_per_row)) +
           " bytes a sampled row from each rank";
  if (graphs_.graphs && graphs_.mixed_max_tokens > 0)
    out += "; mixed steps of up to " + std::to_string(graphs_.mixed_max_tokens) +
           " tokens costed at their CUDA graph's padded rows";
  return out;
}

}  // namespace flashserve::serve
