// An engine on a real model: loads a checkpoint into a runner on the CPU or a CUDA device, sizes
// the paged KV pool from a memory budget, and makes engines (one per policy, say) that share the
// runner and its pool.
//   KV budget on the GPU: (total memory x gpu_memory_utilization) - what is in use once the weights
//   are loaded and the runner is prepared for the largest step (largest_step_tokens): vLLM's rule
//   (its pool is what is left after a profiled forward), 0.9 by default, as vLLM users expect.
//   KV budget on the CPU: cpu_kv_bytes (a flag; float32 K and V, or bf16 / e4m3 by kv_cache_dtype).
// The blocks are as many as the budget holds at kv_cache_dtype's element size: an fp8 cache holds
// twice bf16's tokens in the same memory.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "model/runner.h"

namespace flashserve::engine {

struct ModelEngineOptions {
  std::string model_dir;
  // Instead of model_dir, on --device cuda: this preset's shape with random weights generated on
  // the device (model/presets.h; no checkpoint written or read).
  std::string random_shape;
  // Instead of model_dir, on --device cuda: random weights of this config generated on the device
  // (a tensor-parallel profile's stand-in for one rank: model/tensor_parallel.h's rank_config).
  std::optional<model::ModelConfig> random_config;
  std::string device = "cpu";  // "cpu" or "cuda"
  int cuda_device = 0;
  int32_t block_size = 16;
  double gpu_memory_utilization = 0.9;
  double cpu_kv_bytes = 256.0 * (1 << 20);
  int64_t num_blocks = 0;  // > 0: exactly this many blocks, whatever the budget
  // The largest step the engines made on this model will run: new tokens (largest_step_tokens
  // below) and sampled rows. On CUDA the runner is prepared for it (activation buffers, GEMM
  // workspaces) before the budget is read, so that they count against gpu_memory_utilization
  // (8192 tokens of a 7B model: ~1.1 GB). 0: not known; make_model_engine prepares the runner after
  // the pool is made, and the activations come on top of the budget.
  int64_t largest_step_tokens = 0;
  int64_t largest_step_rows = 0;
  model::KvCacheDtype kv_cache_dtype = model::KvCacheDtype::kAuto;
  // Ranks the model is split over (docs/tensor-parallel.md). On the CPU: the in-process emulation
  // (every rank's pool in the cpu_kv_bytes budget); on CUDA a rank per GPU, devices cuda_device
  // .. cuda_device + N - 1, NCCL between them, each GPU's pool in its own budget (the blocks: as
  // many as the fullest GPU holds).
  int tensor_parallel_size = 1;
};

struct LoadedModel {
  std::shared_ptr<model::ModelRunner> runner;
  std::string device;
  int32_t block_size = 16;
  int64_t num_blocks = 0;
  double kv_bytes = 0;  // of the pool
  model::KvCacheDtype kv_cache_dtype = model::KvCacheDtype::kAuto;
  int tensor_parallel_size = 1;
};

// Bytes of K and V one block holds for every layer (`dtype_bytes` per element), summed over the
// `tensor_parallel_size` ranks' pools (a KV head replicated over ranks counts on each).
int64_t kv_bytes_per_block(const model::ModelConfig& config, int32_t block_size,
                           int64_t dtype_bytes, int tensor_parallel_size = 1);

// The most new tokens one step of `scheduler` holds: its token budget, or for the policies that
// never chunk a prompt (vllm-v0, static) at least max_model_len (unset: `max_positions`, the
// model's positions, which bound what make_model_engine resolves it to).
int64_t largest_step_tokens(const serve::SchedulerConfig& scheduler, int64_t max_positions);

// Loads the model and allocates its KV pool. Throws Error(kUnsupported) for --device cuda in a
// build without the CUDA runner, and for an fp8 cache on cuda while FLASHSERVE_CUDA_FP8_KV is off
// ("kv_cache_dtype", before the weights load: model/kv_cache_dtype.h); Error(kInvalidArgument)
// when the budget holds no block.
LoadedModel load_model(const ModelEngineOptions& options);

// An engine on the loaded model. `scheduler.max_model_len` 0 means the model's positions, cut to
// what the pool can hold with the watermark; vllm and static get a token cap of at least
// max_model_len (they never chunk). `prefix_caching`: EngineConfig's. `executor` runs the steps;
// null: a ModelExecutor on the model's runner (a test passes one that wraps it, to inject a fault
// on the device between steps: tests/server_gpu/).
std::unique_ptr<Engine> make_model_engine(const LoadedModel& model,
                                          serve::SchedulerConfig scheduler, double watermark = 0.01,
                                          bool prefix_caching = false,
                                          std::unique_ptr<Executor> executor = nullptr);

}  // namespace flashserve::engine
