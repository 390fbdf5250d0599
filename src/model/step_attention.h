// The attention of one decoder step, as both runners launch it: the AttentionParams of the
// step's batch built in one place from its ForwardBatch (the paged pool, varlen q, bottom-right
// causal, the model's sliding window), planned once per step from the batch's host lengths
// (plan_attention), and run per layer with that layer's K and V pools (run_attention).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "flashserve/attention.h"
#include "model/config.h"
#include "model/forward_batch.h"

namespace flashserve::model {

// Where a step's attention tensors live: host memory for the CPU runner, the device for the CUDA
// runner (which copies the batch's index arrays there first).
struct StepAttentionTensors {
  TensorView q, out;   // [total_q, h_q, head_dim]; q may be strided (the CPU runner's fused rows)
  TensorView kv_pool;  // layer 0's K pool [num_blocks, block_size, h_kv, head_dim]; V is alike
  const int32_t* cu_seqlens_q = nullptr;  // [batch + 1], where the tensors are
  const int32_t* seqused_k = nullptr;     // [batch]
  const int32_t* block_table = nullptr;   // [batch, table_width]
  int64_t table_width = 0;                // entries per row, >= the batch's pages_per_seq
  // > 0: a plan for any KV lengths up to this bound rather than the batch's own, and the
  // max_seqlen_k the kernels get (a CUDA graph replays the plan it captured with later steps'
  // lengths). 0: the batch's lengths.
  int64_t kv_bound = 0;
  // A plan a CUDA graph replays for later steps of other lengths, bit for bit as their own plans
  // (AttentionLengths::for_replay; the CUDA runner's step graphs): chosen from the batch's own
  // lengths (decodes alone split for kv_bound), its launches widened to q_bound queries per
  // sequence (the max_seqlen_q the kernels get; > 0 and at least the batch's longest), kv_bound
  // keys (> 0) and every row of q.
  bool for_replay = false;
  int64_t q_bound = 0;
  // Split-KV: 0 the attention layer's split policy (the CUDA runner); 1 none (the CPU runner, whose
  // rows must not depend on the batch beside them: greedy in a batch equals greedy alone).
  int32_t num_splits = 0;
  // AttentionRunOptions::programmatic_launch for every layer's run (the CUDA runner's kernels
  // around attention are launched so).
  bool programmatic_launch = false;
  void* stream = nullptr;
};

// The params of the step (k and v point at `kv_pool`; run() repoints them per layer). Throws
// Error(kInvalidArgument) for tensors that do not fit the batch.
AttentionParams step_attention_params(const ModelConfig& config, const ForwardBatch& batch,
                                      const StepAttentionTensors& tensors);

class StepAttention {
 public:
  // Builds the params and plans the step from the batch's host lengths (`batch` is only read here).
  StepAttention(const ModelConfig& config, const ForwardBatch& batch,
                const StepAttentionTensors& tensors);
  StepAttention() = default;

  // Device workspace the plan needs; give it with set_workspace before the first run().
  size_t workspace_bytes() const { return plan_.workspace_bytes(); }
  void set_workspace(void* workspace, size_t bytes);
  const AttentionParams& params() const { return params_; }
  const AttentionPlan& plan() const { return plan_; }
  // The plan's AttentionPlan::replay_key() ("" for a step without queries).
  std::string replay_key() const { return empty_ ? std::string() : plan_.replay_key(); }
  // Layer `layer` of the step: run_attention with its K and V pools (each shaped as kv_pool).
  // Launches nothing when the step has no query. Layer 0 writes the plan's step state into the
  // workspace and the layers after it reuse it (AttentionRunOptions::reuse_step_state: the
  // step's lengths are the same in every layer), so the layers run in order, 0 first, on the
  // workspace set before layer 0. An e4m3 pool's per-KV-head scales ([h_kv], where the pool is)
  // are the attention's k_descale / v_descale, the same for every sequence.
  void run(int64_t layer, void* k_pool, void* v_pool, const float* k_descale = nullptr,
           const float* v_descale = nullptr) const;

 private:
  AttentionParams params_;
  AttentionPlan plan_;
  bool empty_ = true;
  bool programmatic_launch_ = false;
};

}  // namespace flashserve::model
