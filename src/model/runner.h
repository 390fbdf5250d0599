// The model runner: owns the weights and the paged KV pool of one model on one device, and runs one
// step's ForwardBatch through the decoder. Two implementations: the CPU runner (float32, a BLAS,
// the CPU attention path: CI and machines without a GPU) and the CUDA runner (bf16, cuBLASLt, our
// kernels). The engine sees only this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "flashserve/error.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/kv_cache_dtype.h"
#include "model/logits_adjust.h"
#include "model/sampling.h"

namespace flashserve::model {

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual const ModelConfig& config() const = 0;
  // What the next allocate_kv's pool stores (model/kv_cache_dtype.h); before it (the runners
  // drop their pool here: allocate_kv again before the next forward). A runner without
  // an fp8 cache refuses one by name (Error(kUnsupported, "kv_cache_dtype")), never storing bf16
  // in its place; the CUDA runner takes one while FLASHSERVE_CUDA_FP8_KV=1 (off by default:
  // correct, but slower than bf16 for now; model/kv_cache_dtype.h refuse_cuda_fp8_kv_cache_if_off).
  virtual void set_kv_cache(const KvCacheConfig& kv) {
    if (kv.dtype == KvCacheDtype::kFp8E4M3)
      throw Error(ErrorKind::kUnsupported, "kv_cache_dtype",
                  "fp8: this runner has no fp8 KV cache; use auto or bf16");
  }
  // (Re)allocates the KV pool: per layer, K and V of [num_blocks, block_size, kv_heads, head_dim]
  // (set_kv_cache's dtype; auto: bf16 on the GPU, float32 on the CPU); token slot
  // s = block * block_size + offset. Its previous contents are dropped.
  virtual void allocate_kv(int64_t num_blocks, int32_t block_size) = 0;
  // Runs the decoder over the batch's new tokens, writing their K and V into the pool at
  // slot_mapping, and keeps the logits of batch.sample_rows. Throws Error(kInvalidArgument) for a
  // batch that does not fit the pool (slots or block ids out of range) or the model (token ids).
  virtual void forward(const ForwardBatch& batch) = 0;
  // The kept logits: [sample_rows, vocab] float32, row-major, on the host.
  virtual std::vector<float> logits() const = 0;
  // Some of them: rows[i] indexes the sample rows of the last forward; [rows.size(), vocab] on the
  // host. For the logprobs of the requests that ask for them (logprobs.h): only their rows leave
  // the device. Throws Error(kInvalidArgument) for a row outside the last forward's sample rows.
  virtual std::vector<float> logits_rows(const std::vector<int32_t>& rows) const = 0;
  // One token per sample row of the last forward (which must be `batch`), drawn by the rule of
  // sampling.h with params[i] for row i after adjust[i] (logits_adjust.h; `adjust` empty: none
  // for any row); the token's position is batch.positions[row] + 1. The kept logits are not
  // changed (logits() and logits_rows() stay the model's).
  virtual std::vector<int32_t> sample(const ForwardBatch& batch,
                                      const std::vector<SamplingParams>& params,
                                      const std::vector<LogitsAdjust>& adjust) = 0;
  std::vector<int32_t> sample(const ForwardBatch& batch,
                              const std::vector<SamplingParams>& params) {
    return sample(batch, params, {});
  }
  // Readies the runner for steps of up to max_tokens new tokens and max_rows sampled rows before
  // the first one (the CUDA runner grows its step buffers and chooses its GEMM algorithms for
  // every row count now, so that no served step pays for it). Optional: steps work without it.
  virtual void prepare(int64_t max_tokens, int64_t max_rows) { (void)max_tokens, (void)max_rows; }
  // The CUDA graphs captured and replayed so far, every kind: (captures, replays); (0, 0) for a
  // runner without graphs. A capture costs its step host time (bench-serve --step-log marks them).
  virtual std::pair<int64_t, int64_t> graph_counts() const { return {0, 0}; }
};

// A runner on the CPU for the checkpoint directory `dir` (weights converted to float32 on load).
// tensor_parallel_size > 1: the model split over that many ranks, threads of this process
// exchanging partial sums through host memory (model/tensor_parallel_runner.h): the emulation of
// tensor parallelism on which CI checks the split against the whole model, not a way to speed up
// the CPU. Error(kInvalidArgument, "tensor_parallel_size") for a size that does not split it.
std::unique_ptr<ModelRunner> make_cpu_runner(const std::string& dir, int tensor_parallel_size = 1);

// A runner on CUDA device `device`. Without CUDA in the build: Error(kUnsupported).
// tensor_parallel_size > 1: the model split over devices device .. device + N - 1, a rank per GPU
// on threads of this process, NCCL between them (model/tensor_parallel_runner.h,
// docs/tensor-parallel.md). Error(kInvalidArgument, "tensor_parallel_size") for a size that does
// not split the model or more GPUs than there are; Error(kUnsupported, "tensor_parallel_size")
// in a build without NCCL.
std::unique_ptr<ModelRunner> make_cuda_runner(const std::string& dir, int device = 0,
                                              int tensor_parallel_size = 1);
// A runner on CUDA device `device` with random weights generated on the device (a 14.5 GB
// checkpoint written and read back would cost more than a whole benchmark). Without CUDA in the
// build: Error(kUnsupported). tensor_parallel_size as make_cuda_runner's (each rank draws its own
// slices: a model of the split's cost, not the split of the one-GPU model of the same seed).
std::unique_ptr<ModelRunner> make_random_cuda_runner(const ModelConfig& config, uint64_t seed,
                                                     int device = 0, int tensor_parallel_size = 1);

}  // namespace flashserve::model
