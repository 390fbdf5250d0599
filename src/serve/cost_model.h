// How long one step (one forward pass over a Batch) takes, for the simulator. Two models:
//   RooflineCostModel  from the model's shape and the GPU's rates (formulas in docs/serving.md);
//   ProfileCostModel   interpolated from a model's measured step parts (step_profile.h).
#pragma once

#include <cstdint>
#include <istream>
#include <memory>
#include <string>
#include <vector>

#include "model/shape.h"
#include "model/step_graphs.h"
#include "serve/batch.h"
#include "serve/step_profile.h"

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

// "h200": the figures measured on our device machine (shared/anchors/h200-sdpa.md); "a100":
// datasheet peaks scaled by the H200's measured fractions (cost_model.cc says which).
GpuSpec gpu_preset(const std::string& name);

// KV blocks that fit in `gpu_memory_utilization` of the GPU's memory once the weights are loaded
// (activations are small next to the KV cache and share the leftover margin). Throws if none fit.
int64_t kv_blocks_for(const ModelShape& model, double gpu_memory_bytes,
                      double gpu_memory_utilization, int32_t block_size);

// Breakdown of one step's time.
struct StepTime {
  double linear_s = 0, attn_prefill_s = 0, attn_decode_s = 0, overhead_s = 0;
  double all_reduce_s = 0;  // tensor parallelism's all-reduces (a profile's all_reduce table)
  double all_gather_s = 0;  // and its logits' all-gather (the all_gather table)
  double total() const {
    return linear_s + attn_prefill_s + attn_decode_s + overhead_s + all_reduce_s + all_gather_s;
  }
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

// A step's time from a model's measured parts (step_profile.h, written by `flashserve profile`):
//   decode-only:  decode_base(B) + decode_attn(B, mean KV of the decodes)
//   otherwise:    linear(T) + sample_row x (S - 1) + sum over chunks prefill_attn(q, cached)
//                 + decode_attn(B, mean KV of the decodes) (when B > 0)
// plus the engine's per-step overhead, with T the step's tokens, S its sampled rows and B its
// decodes; under tensor parallelism (the profile's all_reduce table) plus the step's all-reduces,
// all_reduces x all_reduce(T x bytes a token), two a layer, whatever the mix of the step, and the
// gather of its S sampled rows' logits, all_gather(S x bytes a row from each rank). Decode
// attention is costed at the decodes' mean KV length: it is linear in the KV length, so B decodes
// of mean L read what B decodes of L each read. Under the CUDA runner's graphs (set_step_graphs)
// T is the rows the step runs at, its token bucket (model::mixed_step_rows): the H200's mixed steps
// padded 10-15% took 1.06-1.14x the unpadded cost (session 26's step logs).
class ProfileCostModel final : public CostModel {
 public:
  ProfileCostModel(StepProfile profile, std::string name);
  static ProfileCostModel load(const std::string& path);
  StepTime breakdown(const Batch& batch) const;
  double step_seconds(const Batch& batch) const override { return breakdown(batch).total(); }
  std::string describe() const override;
  const StepProfile& profile() const { return profile_; }
  // The graphs of the deployment costed (the CUDA runner's, model/step_graphs.h); none by
  // default (the CPU runner's steps run at their own rows).
  void set_step_graphs(const model::StepGraphOptions& graphs) { graphs_ = graphs; }

 private:
  StepProfile profile_;
  std::string name_;
  model::StepGraphOptions graphs_{.graphs = false};
};

}  // namespace flashserve::serve
