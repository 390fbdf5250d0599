// The tensors a checkpoint of a ModelConfig holds: Hugging Face's names and shapes. One list, used
// by every loader (CPU and GPU runners, to check a directory) and by make-checkpoint (to write
// one), so the two cannot disagree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"

namespace flashserve::model {

enum class WeightRole {
  kEmbedding,  // model.embed_tokens.weight [vocab, hidden]
  kNorm,       // RMSNorm scales [hidden] (Qwen3's q_norm/k_norm: [head_dim])
  kLinear,     // projections [out, in] (y = x W^T)
  kBias,       // Qwen2's q/k/v biases [out]
  kLmHead,     // lm_head.weight [vocab, hidden], absent when tied
};

// Which part of the tensor a rank holds under tensor parallelism (model/tensor_parallel.h's
// RankShape; model/weight_shard.h cuts it).
enum class TpSplit {
  kReplicated,  // all of it on every rank: the embedding, the RMSNorm scales
  kQHeads,      // the rank's query heads: q_proj rows and bias, o_proj columns
  kKvHeads,     // the rank's KV heads: k_proj, v_proj rows and biases
  kFfn,         // the rank's MLP columns: gate_proj, up_proj rows, down_proj columns
  kVocab,       // the rank's vocabulary: lm_head rows
};

struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
  WeightRole role = WeightRole::kLinear;
  int64_t fan_in = 0;            // kLinear / kLmHead: the input width
  bool residual_branch = false;  // o_proj and down_proj: their output is added to the residual
  TpSplit split = TpSplit::kReplicated;
  // The dimension `split` cuts: 0 (rows: column-parallel layers, whose outputs split) or 1
  // (columns: the row-parallel o_proj and down_proj, whose inputs split and outputs are summed).
  int split_dim = 0;
};

// Every tensor, in the order a checkpoint writes them (embedding, layers in order, norm, head).
std::vector<WeightSpec> weight_specs(const ModelConfig& config);

// Name of layer `layer`'s tensor, e.g. layer_weight(3, "self_attn.q_proj.weight").
std::string layer_weight(int64_t layer, const std::string& suffix);

// Checks that `ckpt` holds exactly the tensors of its config with their shapes and a float dtype:
// Error(kInvalidArgument) naming the file and tensor for a missing, unexpected or misshapen one.
// Tolerated extras: lm_head.weight of a tied model (transformers may save it) and RoPE's
// rotary_emb.inv_freq buffers (older checkpoints), which are recomputed.
void check_weights(const Checkpoint& ckpt);

// Converts a float tensor (F32, F16, BF16, any alignment in the mapping) to float32 at dst, on
// the global thread pool.
void copy_as_float(const TensorInfo& t, float* dst);

}  // namespace flashserve::model
