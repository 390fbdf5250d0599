// What the host passes to the sm90 forward kernel: the three TMA tensor maps (q, k, v as
// [batch, seqlen, heads, d] 4-D maps, d innermost; varlen tensors as one sequence of all their
// rows), plain pointers and strides for the outputs (written with direct 16-byte stores: the
// dispatch refuses rows that are not 16-byte aligned), the lengths' sources, the mask, and the
// persistent grid's tile order.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "attention/kernel/tile_order.h"

namespace flashserve::attention::sm90 {

struct FwdParams {
  CUtensorMap tma_q, tma_k, tma_v;  // boxes of 64 columns x kBlockM (q) or kBlockN (k, v) rows
  CUtensorMap tma_o;                // tiles with kTmaStoreO: boxes of 64 columns x 64 rows of out

  void* out;
  float* lse;  // null: not written
  // Elements; varlen: the batch strides are 0 and rows count from the sequence's first row.
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_row_stride, lse_head_stride;

  // Lengths (kernel/seqlen.h): dense tensors have seqlen_q / seqlen_k rows per sequence; varlen
  // ones start sequence b at row cu_seqlens[b] (their maps and batch strides see one sequence of
  // all rows); seqused_k[b], when given, is sequence b's number of keys.
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  const int32_t* seqused_k;
  int32_t seqlen_q, seqlen_k;
  // The launch's share of the batch (attention/cuda/plan.h): grid coordinate z is sequence
  // seq_begin + z, and `only` (kernel::SeqKind) skips the sequences of the range that the other
  // launch of a mixed batch takes.
  int32_t seq_begin, only;
  // Paged K/V (block_table not null): k and v are [num_pages, page_size, h_kv, d] and their maps
  // have boxes of page_rows rows, gcd(kBlockN, page_size), a multiple of 8: a key block is
  // kBlockN / page_rows boxes, each within one page. Key j of sequence b is row j % page_size of
  // page block_table[b * block_table_stride + j / page_size].
  const int32_t* block_table;
  int64_t block_table_stride;
  int32_t page_size, page_rows;
  // Pages shorter than a key block (page_rows < kBlockN) where TileConfig::kPagedCpAsync: the
  // producer warpgroup's 128 threads copy K and V with cp.async, 16 bytes of a row each,
  // zero-filled past the sequence's keys, instead of one TMA box per page. The pools and their
  // element strides; page_shift is log2(page_size) for a power of two, else -1.
  int32_t kv_cp_async, page_shift;
  const void* k_pool;
  const void* v_pool;
  int64_t k_page_stride, k_row_stride, k_head_stride;
  int64_t v_page_stride, v_row_stride, v_head_stride;
  // Rows past a sequence's last key that a key block still covers are another sequence's keys
  // (varlen) or unused cache (seqused_k, paged), not TMA's zero fill: the consumers zero them in V,
  // since P = 0 there does not cancel a NaN or an infinity (0 x inf = NaN).
  int32_t zero_v_tail;
  // Bottom-right aligned window (mask.h), -1 unbounded; causal is right = 0. The host clamps a
  // side wider than any sequence to -1. Read only by kernels instantiated as masked.
  int32_t window_left, window_right;
  int32_t h_ratio;   // h_q / h_kv: query head h reads kv head h / h_ratio
  float scale;       // softmax scale (for the natural-log LSE)
  float scale_log2;  // scale * log2(e), folded into the exponent's FFMA

  // The persistent grid: CTA b computes tiles b, b + gridDim.x, ... of this 1-D order
  // (heaviest first in L2-sized sections of heads; units = h_q x batch).
  kernel::GridOrder order;
  int32_t num_tiles;
  // Not null: after its first tile (blockIdx.x) a CTA takes tile gridDim.x + atomicAdd(counter,
  // 1), so each takes the heaviest tile left when it frees (causal). Null: every gridDim-th tile.
  int* tile_counter;
  // Tuning builds' timeline (trace.h): read only by tiles with kTrace; null otherwise.
  uint64_t* trace;

  // The fp8 tiles (TileConfig::kFp8) only, after everything the 16-bit kernels read (their
  // parameter offsets stay as they were). tma_v is then V^T's map (fp8_vt.h: keys innermost, boxes
  // of 128 keys x d rows of sequence z = b). The descale factors of sequence b and KV head hk
  // (attention.h; null: 1): q_descale[b * batch_stride + hk * head_stride], the same for k and v.
  // S = scale q_descale k_descale (q . k) on the codes; O is multiplied by v_descale.
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  int64_t q_descale_batch_stride, q_descale_head_stride;
  int64_t k_descale_batch_stride, k_descale_head_stride;
  int64_t v_descale_batch_stride, v_descale_head_stride;
};

}  // namespace flashserve::attention::sm90
