// How long one step (one forward pass over a Batch) takes, for the simulator. Two models:
//   RooflineCostModel  from the model's shape and the GPU's rates (formulas in docs/serving.md);
//   ProfileCostModel   interpolated from a table of step times measured on the GPU (a CSV).
#pragma once

#include <cstdint>
#include <istream>
#include <memory>
#include <string>
#include <vector>

#include "model/shape.h"
#include "serve/batch.h"

namespace flashserve::serve {

// The model sizes the cost model uses live with the model (model/shape.h).
using model::ModelShape;

// "mistral-7b", "llama-3-8b", "llama-2-70b" (shapes from their Hugging Face config.json).
ModelShape model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

// A GPU by its measured peaks and the fractions of them that a serving step achieves.
struct GpuSpec {
  std::string name;
  double memory_bytes = 0;
  double matmul_flops = 0;       // measured dense bf16 GEMM rate (large square GEMM)
  double matmul_efficiency = 0;  // fraction of it the step's GEMMs reach
  double mem_bw = 0;             // measured device-to-device copy rate, bytes read + written per s
  double weight_bw_efficiency = 0;  // fraction of mem_bw that streaming the weights reaches
  double attn_prefill_flops = 0;    // achieved causal attention forward rate
  double attn_decode_bw = 0;        // achieved KV read rate of decode attention
  double step_overhead_s = 0;       // per step: launches, sampling, scheduling, host work
  void validate() const;
};

// "h200": the figures measured on our device machine (shared/anchors/h200-sdpa.md).
GpuSpec gpu_preset(const std::string& name);

// Breakdown of one step's time.
struct StepTime {
  double linear_s = 0, attn_prefill_s = 0, attn_decode_s = 0, overhead_s = 0;
  double total() const { return linear_s + attn_prefill_s + attn_decode_s + overhead_s; }
};

class CostModel {
 public:
  virtual ~CostModel() = default;
  virtual double step_seconds(const Batch& batch) const = 0;
  virtual std::string describe() const = 0;
};

class RooflineCostModel final : public CostModel {
 public:
  RooflineCostModel(ModelShape model, GpuSpec gpu);
  StepTime breakdown(const Batch& batch) const;
  double step_seconds(const Batch& batch) const override { return breakdown(batch).total(); }
  std::string describe() const override;
  const ModelShape& model() const { return model_; }
  const GpuSpec& gpu() const { return gpu_; }

 private:
  ModelShape model_;
  GpuSpec gpu_;
};

// A table of measured step times with columns prefill_tokens,decode_tokens,kv_tokens,seconds
// (header required, any column order), where kv_tokens is Batch::kv_tokens() (keys attended over
// the whole batch). The rows must form a full grid over the distinct values of the three inputs;
// a step's time is interpolated trilinearly, and extrapolated linearly beyond the grid's edges.
class ProfileCostModel final : public CostModel {
 public:
  ProfileCostModel(std::istream& csv, const std::string& name);
  static ProfileCostModel load(const std::string& path);
  double step_seconds(const Batch& batch) const override {
    return at(static_cast<double>(batch.num_prefill_tokens()),
              static_cast<double>(batch.num_decode_tokens()),
              static_cast<double>(batch.kv_tokens()));
  }
  double at(double prefill_tokens, double decode_tokens, double kv_tokens) const;
  std::string describe() const override;

 private:
  std::string name_;
  std::vector<double> axis_[3];
  std::vector<double> seconds_;  // [i0][i1][i2], row-major
};

}  // namespace flashserve::serve
