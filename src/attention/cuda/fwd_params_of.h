// The sm80 kernels' parameters that every launch of a call shares (pointers, strides, the
// lengths' sources, the clamped window, the scale), from validated params: the forward's launches
// (cuda_dispatch.cu, whose sm90 arguments read them too) and the backward's recomputation of the
// forward (backward_cuda.cu). For CUDA translation units (sm80/fwd_params.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "attention/cuda/plan.h"
#include "attention/problem.h"
#include "attention/sm80/fwd_params.h"
#include "attention/sm80/score_mod.h"
#include "flashserve/attention.h"

namespace flashserve::attention {

// Element strides of a dense [batch, seqlen, heads, d] tensor, or of a varlen [total, heads, d]
// one (batch stride 0: rows count from the sequence's first row, cu_seqlens).
inline void row_strides(const TensorView& t, bool varlen, int64_t& batch, int64_t& row,
                        int64_t& head) {
  batch = varlen ? 0 : t.stride[0];
  row = t.stride[varlen ? 0 : 1];
  head = t.stride[varlen ? 1 : 2];
}

// The lse layout: dense [batch, h_q, seqlen_q], varlen [h_q, total_q].
inline void lse_strides(const TensorView& l, bool varlen, int64_t& batch, int64_t& row,
                        int64_t& head) {
  batch = varlen ? 0 : l.stride[0];
  head = l.stride[varlen ? 0 : 1];
  row = l.stride[varlen ? 1 : 2];
}

inline sm80::FwdParams fwd_params(const AttentionParams& params, const Problem& pr) {
  sm80::FwdParams p{};
  p.q = params.q.data;
  p.k = params.k.data;
  p.v = params.v.data;
  p.out = params.out.data;
  p.lse = params.lse.defined() ? params.lse.ptr<float>() : nullptr;
  row_strides(params.q, pr.varlen_q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  row_strides(params.out, pr.varlen_q, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  row_strides(params.k, pr.varlen_k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  row_strides(params.v, pr.varlen_k, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  if (pr.paged) {  // [num_pages, page_size, h_kv, d]: dimension 0 is the page, not the sequence
    p.block_table = params.block_table.ptr<const int32_t>();
    p.block_table_stride = params.block_table.stride[0];
    p.page = sm80::PageDiv::make(static_cast<int>(pr.page_size));
    p.k_page_stride = p.k_batch_stride;
    p.v_page_stride = p.v_batch_stride;
    p.k_batch_stride = p.v_batch_stride = 0;
  }
  if (p.lse != nullptr)
    lse_strides(params.lse, pr.varlen_q, p.lse_batch_stride, p.lse_row_stride, p.lse_head_stride);
  p.cu_seqlens_q = pr.varlen_q ? params.cu_seqlens_q.ptr<const int32_t>() : nullptr;
  p.cu_seqlens_k = pr.varlen_k ? params.cu_seqlens_k.ptr<const int32_t>() : nullptr;
  p.seqused_k = pr.seqused ? params.seqused_k.ptr<const int32_t>() : nullptr;
  p.seqlen_q = pr.varlen_q ? 0 : static_cast<int32_t>(params.q.shape[1]);
  p.seqlen_k = pr.varlen_k ? 0 : static_cast<int32_t>(params.k.shape[1]);
  p.h_q = static_cast<int32_t>(pr.h_q);
  p.h_ratio = static_cast<int32_t>(pr.h_q / pr.h_kv);
  const int64_t bound = pr.max_q_len + pr.max_kv_len;
  p.window_left = clamp_window(pr.mask.left, bound);
  p.window_right = clamp_window(pr.mask.right, bound);
  p.scale = pr.scale;
  p.scale_log2 = static_cast<float>(pr.scale * M_LOG2E);
  p.num_splits = 1;
  return p;
}

// The modifier kernels' parameters (sm80/score_mod.h), and their units in p: the block holds the
// modified score divided by u (softcap when capped, else the softmax scale), so u becomes the
// scale that the running max, the exponent and the LSE apply.
inline sm80::ScoreModParams score_mod_params(const Problem& pr, sm80::FwdParams& p) {
  const ScoreMod& m = pr.score_mod;
  const double unit = m.capped() ? double{m.softcap} : double{pr.scale};
  sm80::ScoreModParams s{};
  s.capped = m.capped();
  s.cap_scale = m.capped() ? static_cast<float>(double{pr.scale} / m.softcap) : 0.0f;
  s.unit_inv = static_cast<float>(1.0 / unit);
  s.alibi = m.alibi;
  s.alibi_batch_stride = m.alibi_batch_stride;
  s.alibi_head_stride = m.alibi_head_stride;
  p.scale = static_cast<float>(unit);
  p.scale_log2 = static_cast<float>(unit * M_LOG2E);
  return s;
}

}  // namespace flashserve::attention
