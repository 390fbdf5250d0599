#include "model/step_attention.h"

#include <string>

#include "flashserve/error.h"

namespace flashserve::model {

AttentionParams step_attention_params(const ModelConfig& c, const ForwardBatch& b,
                                      const StepAttentionTensors& t) {
  if (t.table_width < b.pages_per_seq)
    throw Error(ErrorKind::kInvalidArgument, "table_width",
                std::to_string(t.table_width) + " is narrower than the batch's " +
                    std::to_string(b.pages_per_seq) + " pages per sequence");
  if (t.kv_bound > 0 && t.kv_bound < b.max_seqlen_k)
    throw Error(ErrorKind::kInvalidArgument, "kv_bound",
                std::to_string(t.kv_bound) + " is below the batch's longest " +
                    std::to_string(b.max_seqlen_k) + " keys");
  if (t.for_replay && (t.kv_bound <= 0 || t.q_bound < b.max_seqlen_q))
    throw Error(ErrorKind::kInvalidArgument, "q_bound",
                "a plan for replay needs kv_bound and a q_bound of at least the batch's longest " +
                    std::to_string(b.max_seqlen_q) + " queries");
  const Device dev = t.kv_pool.device;
  AttentionParams p;
  p.q = t.q;
  p.out = t.out;
  p.k = t.kv_pool;
  p.v = t.kv_pool;
  p.cu_seqlens_q =
      make_view(const_cast<int32_t*>(t.cu_seqlens_q), DType::kInt32, {b.batch + 1}, dev);
  p.seqused_k = make_view(const_cast<int32_t*>(t.seqused_k), DType::kInt32, {b.batch}, dev);
  p.block_table =
      make_view(const_cast<int32_t*>(t.block_table), DType::kInt32, {b.batch, t.table_width}, dev);
  p.max_seqlen_q = t.for_replay ? t.q_bound : b.max_seqlen_q;
  p.max_seqlen_k = t.kv_bound > 0 ? t.kv_bound : b.max_seqlen_k;
  p.causal = true;
  // Mistral's sliding window: a token sees itself and the sliding_window - 1 keys before it.
  if (c.sliding_window > 0) p.window_left = static_cast<int32_t>(c.sliding_window - 1);
  p.num_splits = t.num_splits;
  p.stream = t.stream;
  return p;
}

StepAttention::StepAttention(const ModelConfig& c, const ForwardBatch& b,
                             const StepAttentionTensors& t)
    : params_(step_attention_params(c, b, t)),
      empty_(b.total_q == 0),
      programmatic_launch_(t.programmatic_launch) {
  if (empty_) return;
  // The host lengths the scheduler laid out; under a bound without replay, the query offsets
  // only (every sequence then plans as if it had kv_bound keys); for replay (the runner's step
  // graphs), both, the launches widened to the bounds.
  AttentionLengths lens;
  lens.cu_seqlens_q = b.cu_seqlens_q.data();
  if (t.kv_bound == 0 || t.for_replay) lens.kv_lens = b.seqused_k.data();
  lens.for_replay = t.for_replay;
  plan_ = plan_attention(params_, lens);
}

void StepAttention::set_workspace(void* workspace, size_t bytes) {
  params_.workspace = workspace;
  params_.workspace_bytes = bytes;
}

void StepAttention::run(int64_t layer, void* k_pool, void* v_pool, const float* k_descale,
                        const float* v_descale) const {
  if (empty_) return;
  AttentionParams p = params_;
  p.k.data = k_pool;
  p.v.data = v_pool;
  // [batch, h_kv] with a zero batch stride: one scale per KV head for every sequence.
  auto per_head = [&](const float* scales) {
    TensorView t = make_view(const_cast<float*>(scales), DType::kFloat32,
                             {params_.seqused_k.shape[0], params_.k.shape[2]}, params_.k.device);
    t.stride[0] = 0;
    return t;
  };
  if (k_descale) p.k_descale = per_head(k_descale);
  if (v_descale) p.v_descale = per_head(v_descale);
  AttentionRunOptions options;
  options.reuse_step_state = layer > 0;
  options.programmatic_launch = programmatic_launch_;
  run_attention(plan_, p, options);
}

}  // namespace flashserve::model
