// Writes a checkpoint directory with random weights in exactly Hugging Face's format (config.json,
// model.safetensors or 5 GB shards with model.safetensors.index.json), so that everything can be
// tested and benchmarked without downloads and the loader reads it like any real checkpoint.
//
// Scaling (uniform draws with these standard deviations), chosen so that every activation stays
// near unit scale through any number of layers:
//   linear weights [out, in]       1 / sqrt(in): a projection of a unit-RMS input has unit RMS.
//   o_proj, down_proj              additionally / sqrt(2 * layers): each of the 2L residual
//                                  branches adds about 1 / (2L) of variance, so the residual
//                                  stream's RMS ends below sqrt(2) times where it started.
//   embedding (untied)             1: the residual stream starts at unit RMS.
//   lm_head, tied embedding        3 / sqrt(hidden): logits of RMS about 3 after the final norm
//                                  (peaked enough that greedy picks are not near-ties).
//   RMSNorm scales                 uniform in [0.9, 1.1]; q/k/v biases standard deviation 0.1.
// Values come from a counter-based generator over (seed, tensor, element), so a checkpoint does not
// depend on the number of threads that wrote it.
#pragma once

#include <cstdint>
#include <string>

#include "flashserve/tensor.h"
#include "model/config.h"

namespace flashserve::model {

struct RandomCheckpointOptions {
  uint64_t seed = 0;
  DType dtype = DType::kBFloat16;            // kBFloat16 | kFloat16 | kFloat32
  uint64_t max_shard_bytes = 5000000000ull;  // transformers' default max_shard_size, "5GB"
};

// Creates `dir` if needed and writes config.json and the weights; returns the bytes of weights.
uint64_t write_random_checkpoint(const ModelConfig& config, const std::string& dir,
                                 const RandomCheckpointOptions& options = {});

}  // namespace flashserve::model
