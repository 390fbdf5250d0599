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
  return {"mistral-7b", "llama-3-8b", "llama-2-70b"};
}

ModelShape model_preset(const std::string& name) {
  for (const std::string& n : model_preset_names())
    if (n == name) return model::preset_config(name).shape(name);
  bad("model", "'" + name + "' is not one of mistral-7b, llama-3-8b, llama-2-70b");
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
  if (name != "h200") bad("gpu", "'" + name + "' is not one of h200");
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

ProfileCostModel::ProfileCostModel(std::istream& csv, const std::string& name) : name_(name) {
  std::string line;
  int64_t lineno = 0;
  auto fail = [&](const std::string& what) {
    bad("profile", name + ":" + std::to_string(lineno) + ": " + what);
  };
  auto split = [](const std::string& s) {
    std::vector<std::string> f;
    std::stringstream ss(s);
    for (std::string c; std::getline(ss, c, ',');) {
      c.erase(0, c.find_first_not_of(" \t"));
      c.erase(c.find_last_not_of(" \t\r") + 1);
      f.push_back(c);
    }
    return f;
  };
  const char* want[4] = {"prefill_tokens", "decode_tokens", "kv_tokens", "seconds"};
  int col[4] = {-1, -1, -1, -1};
  size_t ncols = 0;
  std::map<std::array<double, 3>, double> points;
  while (std::getline(csv, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[0] == '#') continue;
    const auto f = split(line);
    if (col[0] < 0) {
      ncols = f.size();
      for (int k = 0; k < 4; ++k)
        for (size_t j = 0; j < f.size(); ++j)
          if (f[j] == want[k]) col[k] = static_cast<int>(j);
      for (int k = 0; k < 4; ++k)
        if (col[k] < 0) fail(std::string("header lacks column '") + want[k] + "'");
      continue;
    }
    if (f.size() != ncols) fail("expected " + std::to_string(ncols) + " fields");
    double v[4];
    for (int k = 0; k < 4; ++k) {
      try {
        size_t pos = 0;
        v[k] = std::stod(f[col[k]], &pos);
        if (pos != f[col[k]].size()) throw std::invalid_argument("trailing");
      } catch (const std::exception&) {
        fail(std::string(want[k]) + " '" + f[col[k]] + "' is not a number");
      }
      if (!(v[k] >= 0) || !std::isfinite(v[k])) fail(std::string(want[k]) + " must be >= 0");
    }
    if (!points.emplace(std::array<double, 3>{v[0], v[1], v[2]}, v[3]).second)
      fail("duplicate point");
  }
  if (col[0] < 0) bad("profile", name + ": no header line");
  if (points.empty()) bad("profile", name + ": no rows");
  for (const auto& [p, s] : points)
    for (int k = 0; k < 3; ++k) axis_[k].push_back(p[k]);
  for (auto& a : axis_) {
    std::sort(a.begin(), a.end());
    a.erase(std::unique(a.begin(), a.end()), a.end());
  }
  const size_t n0 = axis_[0].size(), n1 = axis_[1].size(), n2 = axis_[2].size();
  if (points.size() != n0 * n1 * n2)
    bad("profile", name + ": " + std::to_string(points.size()) + " rows do not form the full " +
                       std::to_string(n0) + " x " + std::to_string(n1) + " x " +
                       std::to_string(n2) + " grid of its prefill, decode and kv values");
  seconds_.resize(n0 * n1 * n2);
  for (const auto& [p, s] : points) {
    size_t idx[3];
    for (int k = 0; k < 3; ++k)
      idx[k] = std::lower_bound(axis_[k].begin(), axis_[k].end(), p[k]) - axis_[k].begin();
    seconds_[(idx[0] * n1 + idx[1]) * n2 + idx[2]] = s;
  }
}

ProfileCostModel ProfileCostModel::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) bad("profile", "cannot open '" + path + "'");
  return ProfileCostModel(in, path);
}

double ProfileCostModel::at(double p, double d, double k) const {
  const double x[3] = {p, d, k};
  size_t lo[3];
  double w[3];  // weight of the upper grid point; outside [0, 1] when extrapolating
  for (int a = 0; a < 3; ++a) {
    const auto& ax = axis_[a];
    if (ax.size() == 1) {
      lo[a] = 0, w[a] = 0;
      continue;
    }
    size_t i = std::upper_bound(ax.begin(), ax.end(), x[a]) - ax.begin();
    i = std::clamp<size_t>(i, 1, ax.size() - 1) - 1;  // segment [i, i+1], the edge one outside
    lo[a] = i;
    w[a] = (x[a] - ax[i]) / (ax[i + 1] - ax[i]);
  }
  const size_t n1 = axis_[1].size(), n2 = axis_[2].size();
  double t = 0;
  for (int c = 0; c < 8; ++c) {
    double weight = 1;
    size_t idx[3];
    bool skip = false;
    for (int a = 0; a < 3; ++a) {
      const int up = (c >> a) & 1;
      if (up && axis_[a].size() == 1) skip = true;
      idx[a] = lo[a] + up;
      weight *= up ? w[a] : 1 - w[a];
    }
    if (skip) continue;
    t += weight * seconds_[(idx[0] * n1 + idx[1]) * n2 + idx[2]];
  }
  return std::max(t, 0.0);
}

std::string ProfileCostModel::describe() const {
  return "profile: " + name_ + " (" + std::to_string(axis_[0].size()) + " x " +
         std::to_string(axis_[1].size()) + " x " + std::to_string(axis_[2].size()) + " grid)";
}

}  // namespace flashserve::serve
