#include "cli/tensor_parallel_flag.h"

#include "cli/options.h"
#include "model/nccl_communicator.h"
#include "model/tensor_parallel.h"

namespace flashserve::cli {

void TensorParallelFlag::add(CLI::App& app, const std::string& help) {
  option = add_int(app, "--tensor-parallel-size", size, {1, 1 << 10},
                   !help.empty() ? help
                                 : "ranks the model is split over (Megatron-style): on cuda GPUs "
                                   "0..N-1 with NCCL; on cpu an in-process emulation");
}

void TensorParallelFlag::check_device(const std::string& device) const {
  if (size == 1 || device != "cuda") return;
  const std::string n = std::to_string(size);
  if (!model::nccl_available())
    throw UsageError("--tensor-parallel-size",
                     n + ": this flashserve is built without NCCL, which joins the ranks on "
                         "GPUs (--device cpu emulates them)");
  if (const int gpus = model::nccl_device_count(); gpus < size)
    throw UsageError("--tensor-parallel-size", n + ": a rank per GPU needs " + n +
                                                   " CUDA devices, and this machine has " +
                                                   std::to_string(gpus));
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
