#include "engine/model_engine.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "engine/model_executor.h"
#include "flashserve/error.h"
#include "model/presets.h"
#include "model/tensor_parallel.h"

#if defined(FLASHSERVE_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace flashserve::engine {

namespace {

// What the KV pool may take on the GPU once the weights (and the largest step's buffers) are in:
// total x utilization - used.
double gpu_kv_budget(int device, double utilization) {
#if defined(FLASHSERVE_WITH_CUDA)
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaSetDevice(device) != cudaSuccess ||
      cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess)
    throw Error(ErrorKind::kUnsupported, "device",
                "cannot read the memory of CUDA device " + std::to_string(device));
  const double used = static_cast<double>(total_bytes - free_bytes);
  return static_cast<double>(total_bytes) * utilization - used;
#else
  (void)device;
  (void)utilization;
  throw Error(ErrorKind::kUnsupported, "device", "cuda: this flashserve is built without CUDA");
#endif
}

// vllm-v0 and static never chunk: one step must take a whole prompt (as vLLM v0's default
// max_num_batched_tokens does).
int64_t step_token_cap(const serve::SchedulerConfig& s, int64_t max_model_len) {
  const bool whole_prompts =
      s.policy == serve::Policy::kVllmV0 || s.policy == serve::Policy::kStatic;
  return whole_prompts ? std::max(s.max_tokens_per_step, max_model_len) : s.max_tokens_per_step;
}

}  // namespace

int64_t kv_bytes_per_block(const model::ModelConfig& c, int32_t block_size, int64_t dtype_bytes,
                           int tensor_parallel_size) {
  const int64_t heads =
      tensor_parallel_size == 1
          ? c.num_key_value_heads
          : model::rank_shape(c, tensor_parallel_size, 0).kv_heads * tensor_parallel_size;
  return 2 * c.num_hidden_layers * heads * c.head_dim * block_size * dtype_bytes;
}

int64_t largest_step_tokens(const serve::SchedulerConfig& scheduler, int64_t max_positions) {
  // A max_model_len past the positions is refused (make_model_engine): the positions bound it.
  const int64_t len = scheduler.max_model_len > 0 ? std::min(scheduler.max_model_len, max_positions)
                                                  : max_positions;
  return step_token_cap(scheduler, len);
}

LoadedModel load_model(const ModelEngineOptions& o) {
  if (o.device != "cpu" && o.device != "cuda")
    throw Error(ErrorKind::kInvalidArgument, "device",
                "'" + o.device + "' is not one of cpu, cuda");
  if (!(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1))
    throw Error(ErrorKind::kInvalidArgument, "gpu_memory_utilization",
                std::to_string(o.gpu_memory_utilization) + " is not in (0, 1]");
  LoadedModel m;
  m.device = o.device;
  m.block_size = o.block_size;
  m.kv_cache_dtype = o.kv_cache_dtype;
  const bool gpu = o.device == "cuda";
  // fp8 on cuda while FLASHSERVE_CUDA_FP8_KV is off: refused before minutes of loading, by
  // name; the runner's set_kv_cache refuses it too.
  if (gpu)
    model::refuse_cuda_fp8_kv_cache_if_off(o.kv_cache_dtype, std::getenv("FLASHSERVE_CUDA_FP8_KV"));
  if ((!o.random_shape.empty() || o.random_config) && !gpu)
    throw Error(ErrorKind::kInvalidArgument, "random_shape",
                "weights generated on the device need --device cuda");
  const int tp = o.tensor_parallel_size;
  if (tp < 1)
    throw Error(ErrorKind::kInvalidArgument, "tensor_parallel_size",
                std::to_string(tp) + ": at least 1");
  if (!o.random_shape.empty())
    m.runner =
        model::make_random_cuda_runner(model::preset_config(o.random_shape), 1, o.cuda_device, tp);
  else if (o.random_config && gpu)
    m.runner = model::make_random_cuda_runner(*o.random_config, 1, o.cuda_device, tp);
  else if (gpu)
    m.runner = model::make_cuda_runner(o.model_dir, o.cuda_device, tp);
  else
    m.runner = model::make_cpu_runner(o.model_dir, tp);
  m.tensor_parallel_size = tp;
  // auto: bf16 K/V on the GPU, float32 on the CPU (model/runner.h); bf16 or e4m3 when asked.
  m.runner->set_kv_cache(model::KvCacheConfig{o.kv_cache_dtype, {}, {}});
  // The largest step's buffers first, so that the budget below is what they leave.
  if (gpu && o.largest_step_tokens > 0)
    m.runner->prepare(o.largest_step_tokens,
                      std::max<int64_t>(1, std::min(o.largest_step_rows, o.largest_step_tokens)));
  const int64_t block_bytes =
      kv_bytes_per_block(m.runner->config(), o.block_size,
                         model::kv_cache_element_bytes(o.kv_cache_dtype, gpu ? 2 : 4), tp);
  if (o.num_blocks > 0) {
    m.num_blocks = o.num_blocks;
  } else {
    // On the GPUs each rank's pool (its KV heads: rank 0's are as many as any rank's) in what its
    // own GPU has left; on the CPU every rank's pool in the one budget.
    double budget = gpu ? gpu_kv_budget(o.cuda_device, o.gpu_memory_utilization) : o.cpu_kv_bytes;
    for (int r = 1; gpu && r < tp; ++r)
      budget = std::min(budget, gpu_kv_budget(o.cuda_device + r, o.gpu_memory_utilization));
    const double per_budget = static_cast<double>(gpu ? block_bytes / tp : block_bytes);
    m.num_blocks = budget > 0 ? static_cast<int64_t>(budget / per_budget) : 0;
    if (m.num_blocks < 1)
      throw Error(ErrorKind::kInvalidArgument, gpu ? "gpu_memory_utilization" : "kv_memory",
                  "the KV budget of " + std::to_string(budget / (1 << 20)) +
                      " MiB holds no block of " + std::to_string(per_budget) + " bytes");
  }
  m.kv_bytes = static_cast<double>(m.num_blocks) * static_cast<double>(block_bytes);
  m.runner->allocate_kv(m.num_blocks, o.block_size);
  return m;
}

std::unique_ptr<Engine> make_model_engine(const LoadedModel& m, serve::SchedulerConfig scheduler,
                                          double watermark, bool prefix_caching,
                                          std::unique_ptr<Executor> executor) {
  const model::ModelConfig& c = m.runner->config();
  EngineConfig ec;
  ec.num_blocks = m.num_blocks;
  ec.block_size = m.block_size;
  ec.watermark = watermark;
  ec.vocab_size = c.vocab_size;
  ec.eos_tokens = c.eos_token_ids;
  ec.prefix_caching = prefix_caching;
  if (scheduler.max_model_len > c.max_position_embeddings)
    throw Error(ErrorKind::kInvalidArgument, "max_model_len",
                std::to_string(scheduler.max_model_len) + " exceeds the model's " +
                    std::to_string(c.max_position_embeddings) +
                    " positions (config.json max_position_embeddings)");
  if (scheduler.max_model_len <= 0) {
    // The positions the model has, but no more than one sequence alone can hold in the pool.
    const serve::BlockManager probe(m.num_blocks, m.block_size, watermark);
    const int64_t fits = (probe.num_blocks() - probe.watermark_blocks()) * m.block_size;
    scheduler.max_model_len = std::min<int64_t>(c.max_position_embeddings, fits);
  }
  scheduler.max_tokens_per_step = step_token_cap(scheduler, scheduler.max_model_len);
  ec.scheduler = scheduler;
  // Buffers and GEMM algorithms for the largest step the scheduler can make, before the first.
  m.runner->prepare(scheduler.max_tokens_per_step,
                    std::min(scheduler.max_tokens_per_step, scheduler.max_running));
  if (!executor) executor = std::make_unique<ModelExecutor>(m.runner, m.block_size, m.device);
  return std::make_unique<Engine>(ec, std::move(executor));
}

}  // namespace flashserve::engine
