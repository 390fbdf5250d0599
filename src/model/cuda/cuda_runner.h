// The CUDA model runner: bf16 weights on one device (QKV and gate/up fused into one matrix each at
// upload), a bf16 (or e4m3, --kv-cache-dtype fp8) paged KV pool, and the forward of one step's
// mixed batch on one stream; or one tensor-parallel rank of such a model (load's comm).
//
// A step: the index arrays are packed into one pinned host buffer and copied once; then per layer
// add+RMSNorm, the QKV GEMM, RoPE fused with the K/V page write, one attention launch for the whole
// batch (varlen queries, paged K/V, causal, automatic split-KV), the O GEMM, add+RMSNorm, the
// gate/up GEMM, SiLU*up, the down GEMM; finally the last norm on the sample rows only and the LM
// head for them (float32 logits). No host synchronization and no allocation inside a step once the
// buffers have grown to the step's size (they grow, rarely, between steps). Steps replay CUDA
// graphs of the whole forward (model/step_graphs.h decides which, and the buckets): decode-only
// steps (one new token per sequence, every sequence sampled) per (batch size, block-table width
// rounded up to a power of two); mixed steps (prefill chunks, with or without decodes) of up to
// 2048 tokens padded to their token bucket, per (bucket, sequences, sample rows, width bucket,
// the attention plan's launches), with the eager step's logits bit for bit.
// FLASHSERVE_CUDA_GRAPHS=0 or set_cuda_graphs(false) runs every step eagerly;
// FLASHSERVE_MIXED_GRAPH_TOKENS=<n> or set_mixed_graph_tokens(n) sets the largest mixed step that
// takes a graph (0: none).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/communicator.h"
#include "model/runner.h"

namespace flashserve::model::cuda {

class CudaRunner : public ModelRunner {
 public:
  // Loads the checkpoint directory onto `device` (bf16, fp16 or fp32 on disk). With `comm`, as
  // rank comm->rank() of a tensor-parallel model (model/tensor_parallel_runner.h joins the
  // ranks): its slice of every weight, its heads' KV pool, the o and down products' partial sums
  // all-reduced and the logits all-gathered through comm on this runner's stream (steps in CUDA
  // graphs only when comm->capturable()). Error(kInvalidArgument, "tensor_parallel_size") for a
  // size that does not split the model.
  static std::unique_ptr<CudaRunner> load(const std::string& dir, int device,
                                          Communicator* comm = nullptr);
  // Random weights generated on the device (for benchmarks of shapes too big to write to disk):
  // uniform, scaled 1/sqrt(fan_in) so activations stay in range; norms 1. A rank (comm) draws
  // its own slices and the replicated tensors every rank draws.
  static std::unique_ptr<CudaRunner> random(const ModelConfig& config, uint64_t seed, int device,
                                            Communicator* comm = nullptr);
  ~CudaRunner() override;

  const ModelConfig& config() const override;
  // bf16 (auto, bf16) or, while FLASHSERVE_CUDA_FP8_KV=1, e4m3 with per-(layer, KV head)
  // scales (1 byte per element: twice bf16's blocks in the same memory); drops the pool.
  void set_kv_cache(const KvCacheConfig& kv) override;
  void allocate_kv(int64_t num_blocks, int32_t block_size) override;
  void forward(const ForwardBatch& batch) override;
  void prepare(int64_t max_tokens, int64_t max_rows) override;
  std::vector<float> logits() const override;
  std::vector<float> logits_rows(const std::vector<int32_t>& rows) const override;
  using ModelRunner::sample;
  std::vector<int32_t> sample(const ForwardBatch& batch, const std::vector<SamplingParams>& params,
                              const std::vector<LogitsAdjust>& adjust) override;

  // The runner's stream (a cudaStream_t); forward() only enqueues work on it.
  void* stream() const;
  void synchronize() const;
  int64_t weight_bytes() const;  // bf16 bytes of every weight a step reads (embedding excluded)

  void set_cuda_graphs(bool on);
  // Products of at most `rows` rows (0 to 4) through the small-batch GEMM kernel (gemv.h)
  // instead of cuBLASLt (FLASHSERVE_GEMV gives the start value; model/decode_kernels.h).
  void set_gemv_rows(int64_t rows);
  // The fused decode kernels (model/decode_kernels.h DecodeFusion; FLASHSERVE_FUSE_NORM and
  // FLASHSERVE_FUSE_SILU give the runner's start values).
  void set_decode_fusion(bool norm, bool silu);
  // The attention kernels launched programmatically where the runner's are
  // (DecodeKernelOptions::pdl_attention; FLASHSERVE_PDL_ATTENTION gives the start value).
  void set_attention_pdl(bool on);
  // The GEMV's first weights loaded before its wait, and silu launched programmatically, where the
  // runner's kernels are (DecodeKernelOptions::early_weights; FLASHSERVE_EARLY_WEIGHTS gives the
  // start value).
  void set_early_weights(bool on);
  std::pair<int64_t, int64_t> graph_counts() const override;  // (captures, replays), every kind
  void set_mixed_graph_tokens(int64_t max_tokens);  // the largest mixed step with a graph; 0: none
  std::pair<int64_t, int64_t> mixed_graph_counts() const;  // (captures, replays) of mixed steps
  // The KV pool's device memory (per layer K then V), for tests that check which slots a step
  // wrote.
  std::pair<const void*, size_t> kv_pool() const;

  // Per-stage timing (CUDA events around each stage of every layer; adds a little host cost, so
  // off by default). profile() sums milliseconds per stage over the forwards since the last reset.
  void set_profiling(bool on);
  std::map<std::string, double> profile();

 private:
  struct Impl;
  explicit CudaRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashserve::model::cuda
