#include "cli/tensor_parallel_flag.h"

#include "cli/options.h"
#include "model/tensor_parallel.h"

namespace flashserve::cli {

void TensorParallelFlag::add(CLI::App& app, const std::string& help) {
  option = add_int(app, "--tensor-parallel-size", size, {1, 1 << 10},
                   !help.empty() ? help
                                 : "ranks the model is split over (Megatron-style): on cpu an "
                                   "in-process emulation; on cuda 1 (profile: N GPUs)");
}

void TensorParallelFlag::check_device(const std::string& device, bool cuda_ranks) const {
  if (size > 1 && device == "cuda" && !cuda_ranks)
    throw UsageError("--tensor-parallel-size",
                     std::to_string(size) +
                         ": the CUDA runner serves a model on one GPU; its tensor-parallel "
                         "ranks (sharded weights, NCCL all-reduces in the forward) are not built "
                         "yet (--device cpu emulates them)");
}

void TensorParallelFlag::check_model(const model::ModelConfig& config) const {
  check_option("--tensor-parallel-size", [&] {
    model::check_tensor_parallel(config, size);
    return 0;
  });
}

void check_profile_tensor_parallel(const serve::StepProfile& profile, int64_t size) {
  const auto it = profile.meta.find("tensor_parallel_size");
  const std::string measured = it == profile.meta.end() ? "1" : it->second;
  if (measured != std::to_string(size))
    throw UsageError("--tensor-parallel-size",
                     std::to_string(size) + ": the profile was measured at tensor parallel size " +
                         measured + " (profile it again with --tensor-parallel-size " +
                         std::to_string(size) + ")");
}

}  // namespace flashserve::cli
