// --tensor-parallel-size N, as serve, bench-serve and profile take it (vLLM's name; serve also
// reads vLLM's -tp): the ranks a model is split over (docs/tensor-parallel.md).
//   --device cpu   N > 1 runs the in-process emulation (ranks as threads over host memory): the
//                  sharded path end to end, for tests and for checking a split, not for speed
//   --device cuda  N > 1: serve and bench-serve put a rank on each of GPUs 0 .. N-1 (NCCL between
//                  them); profile times one rank's compute on GPU 0 and the all-reduce over N
//                  GPUs, so the simulator can predict a TP run
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "model/config.h"
#include "serve/step_profile.h"

namespace flashserve::cli {

struct TensorParallelFlag {
  int64_t size = 1;
  CLI::Option* option = nullptr;

  // `help`: what the size means to this command (default: serve's and bench-serve's meaning).
  void add(CLI::App& app, const std::string& help = "");
  // UsageError naming --tensor-parallel-size for N > 1 on cuda in a build without NCCL or on a
  // machine with fewer than N GPUs. Before the model is read: it needs none.
  void check_device(const std::string& device) const;
  // UsageError naming --tensor-parallel-size for a size that does not split `config` (its heads,
  // KV heads, MLP; model/tensor_parallel.h), naming the field.
  void check_model(const model::ModelConfig& config) const;
};

// A step profile measured for another tensor-parallel size would predict another engine's steps:
// UsageError naming --tensor-parallel-size (a profile without the key is of one device).
void check_profile_tensor_parallel(const serve::StepProfile& profile, int64_t size);

}  // namespace flashserve::cli
