// Host entry point of the sm90 forward kernel: dense or varlen batches (seqused_k too), dense or
// paged K/V, head dims 64, 128 and 256, no mask, bottom-right causal or a sliding window, GQA.
// cuda_dispatch.cu decides when it runs (sm90_preferred; FLASHSERVE_KERNEL forces it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashserve/tensor.h"

namespace flashserve::attention::sm90 {

struct FwdArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;                      // null: not written
  DType dtype;                     // kBFloat16 or kFloat16
  int batch, h_q, h_kv, head_dim;  // batch: the call's sequences (dense tensors' first dimension)
  // The launch's sequences: seq_begin .. seq_begin + seqs - 1 of the call, of which it takes
  // `only` (kernel::SeqKind: all, or those with at most one query, or those with more).
  int seq_begin, seqs, only;
  // Rows of q and k/v per sequence (dense), or in all (varlen: cu_seqlens_q / cu_seqlens_k not
  // null; those rows form one sequence of the tensor maps).
  int seqlen_q, seqlen_k;
  int max_seqlen_q, max_seqlen_k;  // of any sequence (dense: seqlen_q, seqlen_k)
  // Device arrays (kernel/seqlen.h), null where the call has none.
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  const int32_t* seqused_k;
  // Paged K/V (block_table not null, seqused_k given): k/v [num_pages, page_size, h_kv, d], with
  // k/v_page_stride between pages (their batch strides unused); page_size a multiple of 8.
  const int32_t* block_table;
  int64_t block_table_stride;
  int num_pages, page_size;
  int64_t k_page_stride, v_page_stride;
  // Strides in elements: q/k/v/out [batch, seqlen, heads, d], lse [batch, heads, seqlen]; varlen:
  // q/k/v/out [total, heads, d] with batch stride 0, lse [heads, total_q] with batch stride 0.
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_row_stride, lse_head_stride;
  // mask.h's window, clamped by the host (a side wider than any sequence is -1); causal is
  // left -1, right 0. Either side >= 0 runs the masked instantiation.
  int window_left, window_right;
  float scale;
  int sms;           // the device's multiprocessors: one persistent CTA each
  int64_t l2_bytes;  // the device's L2: the tile order's head sections fit half of it
  // Masked: a device int the persistent CTAs take their next tile from (zeroed by the launch);
  // null: masked grids run one CTA per tile.
  int* tile_counter;
  cudaStream_t stream;
  // dtype kFloat8E4M3 (q, k, v; out bfloat16): the descale factors (null: 1; strides in floats)
  // and the workspace for V^T (fp8_vt.h: batch x h_kv x head_dim x vt_keys bytes, 256-byte
  // aligned; vt_keys = fp8_vt_keys(the call's longest kv), tile_config.h).
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  int64_t q_descale_batch_stride, q_descale_head_stride;
  int64_t k_descale_batch_stride, k_descale_head_stride;
  int64_t v_descale_batch_stride, v_descale_head_stride;
  void* vt;
  int64_t vt_keys;
  int fp8_block_n;  // the plan's key block (tile_config.h fp8_block_n: 128 or 192 at d128)
  // The 16-bit and fp8 tiles with session 18's tile boundary (tile_config.h OverlappedEpilogue:
  // O by TMA store, the tile's work announced): the plan's FLASHSERVE_SM90_EPILOGUE (cuda/plan.h).
  bool epilogue;
  // The d64 16-bit tiles and the fp8 tiles with part of the softmax's exponentials on the FMA
  // pipe (tile_config.h Exp2Fma): the plan's FLASHSERVE_SM90_EXP2_FMA (cuda/plan.h), false at
  // the other 16-bit head dims.
  bool exp2_fma;
};

// Throws flashserve::Error (kUnsupported for a head dim without an instantiation or a tensor TMA
// cannot describe, kCuda when the launch fails). dtype kFloat8E4M3 runs the fp8 tiles
// (run_fwd_fp8_hdim: head dims 64, 128 and 256, no paged K/V), V^T's pre-pass first.
void run_fwd(const FwdArgs& args);

template <int kHeadDim>
void run_fwd_hdim(const FwdArgs& args);
template <int kHeadDim>
void run_fwd_fp8_hdim(const FwdArgs& args);
// run_fwd_hdim's a.exp2_fma path (d64).
template <int kHeadDim>
void run_fwd_exp2_fma_hdim(const FwdArgs& args);
// run_fwd_fp8_hdim's a.exp2_fma path (d64, d128, d256: fwd_fp8_exp2_fma.cu).
template <int kHeadDim>
void run_fwd_fp8_exp2_fma_hdim(const FwdArgs& args);

}  // namespace flashserve::attention::sm90
