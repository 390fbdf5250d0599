// What the host passes to a forward kernel: raw pointers, strides in elements (64-bit, so tensors
// past 2^31 elements address correctly), the lengths' sources and the mask. Filled by the CUDA
// dispatch from validated AttentionParams.
#pragma once

#include <cstdint>

#include "attention/kernel/seqlen.h"
#include "attention/kernel/split_items.h"
#include "attention/kernel/tile_order.h"
#include "attention/split_policy.h"  // kSplitMapItemBytes
#include "smem_tile.h"

namespace flashserve::attention::sm80 {

using kernel::GridOrder;
using kernel::heaviest_first;
using kernel::tile_of;
using kernel::TileCoords;

using kernel::kAllSeqs;
using kernel::kDecodeSeqs;
using kernel::kPrefillSeqs;
using kernel::takes_seq;

struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;  // null: not written

  // Dense tensors use the batch stride; varlen ones leave it 0 and offset rows by cu_seqlens.
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_row_stride, lse_head_stride;

  const int32_t* cu_seqlens_q;  // null: dense q with seqlen_q rows per sequence
  const int32_t* cu_seqlens_k;  // null: dense k/v with seqlen_k rows per sequence
  const int32_t* seqused_k;     // null: every row of the sequence's k/v is a key
  int32_t seqlen_q, seqlen_k;

  int32_t h_q;
  int32_t h_ratio;  // h_q / h_kv: query head h reads kv head h / h_ratio
  // Bottom-right aligned window (mask.h); -1 unbounded. The host clamps a side wider than any
  // sequence to -1, so row + offset + window stays far inside int32.
  int32_t window_left, window_right;
  float scale;       // softmax scale (for the natural-log LSE)
  float scale_log2;  // scale * log2(e), folded into the exponent's FFMA

  // Paged KV (load_tile_paged_async in smem_tile.h): k/v are [num_pages, page_size, h_kv, d]; key
  // j of sequence b is row j % page_size of page block_table[b][j / page_size]. k_row_stride is
  // then the stride within a page and k_batch_stride is 0.
  const int32_t* block_table;  // null: not paged
  int64_t block_table_stride;
  int64_t k_page_stride, v_page_stride;
  PageDiv page;  // page_size and its fast division

  // Split-KV: grid z is batch * num_splits; split s of a tile takes its share of the tile's key
  // blocks and writes fp32 O (normalised by its own sum) and its LSE to the partial buffers,
  // which combine.h merges. num_splits == 1: no partials, out and lse are written directly.
  int32_t num_splits;
  float* o_partial;      // [num_splits, q_rows, h_q, d]
  float* lse_partial;    // [num_splits, q_rows, h_q]
  int64_t q_rows;        // rows of the partial buffers
  int64_t partial_row0;  // the row of q that partial row 0 holds (prefill launches)
  // Decode launches (packed GQA tiles): partial row s holds sequence seq_begin + s, whose one
  // query is its row; so the partials of a decode launch take one row per sequence of its range,
  // not the rows of the chunks between them.
  int32_t partials_by_seq;

  // The launch's share of the batch (attention/cuda/plan.h): grid z covers sequences seq_begin ..
  // seq_end - 1, and `only` skips the sequences of that range that the other launch of a mixed
  // batch takes (a range holds both kinds only where the batch interleaves them).
  int32_t seq_begin, seq_end;
  int32_t only;  // SeqKind

  // Masked grids: the 1-D tile order of attention/kernel/tile_order.h (set by the launcher).
  GridOrder order;

  // Decode launches split by length (kernel/split_items.h, split_policy.h balanced_split): > 0,
  // the grid's num_splits slots a sequence are the launch's items, each a share of at least
  // split_min_blocks key blocks of split_block_n keys (the decode tile's), and the partials are
  // by item; 0, every sequence splits num_splits ways. split_map: the launch's item map in the
  // workspace (SplitMap below), which split_map.cu writes before the split kernel reads it.
  int32_t split_min_blocks;
  int32_t split_block_n;
  void* split_map;
};

// A length-aware launch's item map: for each of the grid's (seq_end - seq_begin) x num_splits
// items its (sequence, share, the sequence's count of shares, the launch's chunk), sequence -1
// past the last share; then for each sequence of the range its (first item, count).
struct SplitMap {
  int4* items;
  int2* rows;
};
static_assert(sizeof(int4) == kSplitMapItemBytes && sizeof(int2) == kSplitMapRowBytes);
__host__ __device__ inline SplitMap split_map_of(const FwdParams& p) {
  int4* items = static_cast<int4*>(p.split_map);
  return {items, reinterpret_cast<int2*>(items + int64_t{p.seq_end - p.seq_begin} * p.num_splits)};
}

// The padded kernels' parameters (fwd_kernel_padded, tile_config.h PaddedConfig): the call's real
// head dims, each a multiple of 8 no larger than the kernel's. A struct of its own (not fields of
// FwdParams) so that the kernels of the compiled head dims keep their parameters and code.
struct FwdPaddedParams : FwdParams {
  int32_t head_dim;    // of q and k
  int32_t head_dim_v;  // of v and out
};

// The fp8 KV cache's kernels' parameters (fwd_kernel_kv_fp8): K and V are float8_e4m3fn codes,
// element (b, j, h, c) worth code x k_descale[b * k_descale_batch_stride + h *
// k_descale_head_stride] (V alike); a null descale is 1. A struct of its own, as
// FwdPaddedParams, so that the 16-bit kernels keep their parameters and code.
struct FwdKvFp8Params : FwdParams {
  const float* k_descale;
  const float* v_descale;
  int64_t k_descale_batch_stride, k_descale_head_stride;
  int64_t v_descale_batch_stride, v_descale_head_stride;
};

// Key blocks of sequence b for a length-aware decode launch (kernel/split_items.h): those its
// decode tile visits, or 0 where the launch has no row of it (no query, or the other launch's).
__device__ __forceinline__ int split_key_blocks(const FwdParams& p, int b) {
  const kernel::SeqLens s =
      kernel::seq_lens(p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k, p.seqlen_q, p.seqlen_k, b);
  if (s.q_len != 1 || !takes_seq(p.only, s.q_len)) return 0;
  return kernel::decode_key_blocks(s.kv_len, p.window_left, p.split_block_n);
}

// One sequence's lengths and where it starts (kernel/seqlen.h). Offsets are computed where they
// are used (not held across the key loop: every register counts there).
struct SeqInfo : kernel::SeqLens {
  int b;

  __device__ __forceinline__ SeqInfo(const FwdParams& p, int batch)
      : kernel::SeqLens(kernel::seq_lens(p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k, p.seqlen_q,
                                         p.seqlen_k, batch)),
        b(batch) {}

  // Index of the sequence's row 0 among all rows of q (the partial buffers' row index).
  __device__ __forceinline__ int64_t q_row0(const FwdParams& p) const {
    return p.cu_seqlens_q ? int64_t{q_start} : int64_t{b} * p.seqlen_q;
  }

  // Element offsets of the sequence's row 0 (head 0) in each tensor.
  __device__ __forceinline__ int64_t q_off(const FwdParams& p) const {
    return p.cu_seqlens_q ? q_start * p.q_row_stride : b * p.q_batch_stride;
  }
  __device__ __forceinline__ int64_t o_off(const FwdParams& p) const {
    return p.cu_seqlens_q ? q_start * p.o_row_stride : b * p.o_batch_stride;
  }
  __device__ __forceinline__ int64_t lse_off(const FwdParams& p) const {
    return p.cu_seqlens_q ? q_start * p.lse_row_stride : b * p.lse_batch_stride;
  }
  __device__ __forceinline__ int64_t k_off(const FwdParams& p) const {
    return p.cu_seqlens_k ? k_start * p.k_row_stride : b * p.k_batch_stride;
  }
  __device__ __forceinline__ int64_t v_off(const FwdParams& p) const {
    return p.cu_seqlens_k ? k_start * p.v_row_stride : b * p.v_batch_stride;
  }
};

}  // namespace flashserve::attention::sm80
