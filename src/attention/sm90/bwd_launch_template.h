// The sm90 backward launch for one head dim: tensor maps, grid, shared memory, the dtype and mask
// instantiations, between the preprocess and postprocess the sm80 backward shares
// (sm80/bwd_launch.h).
#pragma once

#include <algorithm>
#include <string>

#include "attention/cuda_check.h"
#include "attention/sm80/bwd_launch.h"
#include "bwd_kernel.h"
#include "bwd_launch.h"
#include "tensor_map.h"

namespace flashserve::attention::sm90 {

// The call's tensor maps: q and dout in boxes of `block_m` rows, k and v of `block_n`, and with
// `dq_bulk` the dq accumulator in boxes of 32 columns x 64 rows (kDqBoxBytes), all `d` columns wide
// (the call's head dim; a kernel padded past it gets TMA's zeros for the columns beyond). Varlen
// tensors are one sequence of all their rows for TMA (the kernel offsets each block by its
// sequence's first row); TMA refuses a dimension of 0, so no rows describe one.
inline void make_bwd_maps(BwdParams& bp, const BwdArgs& a, int d, int block_m, int block_n,
                          bool dq_bulk) {
  const sm80::BwdParams& p = bp.p;
  const sm80::FwdParams& f = p.fwd;
  const bool varlen_q = f.cu_seqlens_q != nullptr, varlen_k = f.cu_seqlens_k != nullptr;
  const int q_seqs = varlen_q ? 1 : a.batch, kv_seqs = varlen_k ? 1 : a.batch;
  const int q_rows = std::max(a.q_rows, 1), kv_rows = std::max(a.kv_rows, 1);
  bp.tma_q = make_map(f.q, a.dtype, q_seqs, q_rows, f.h_q, d, f.q_batch_stride, f.q_row_stride,
                      f.q_head_stride, block_m, "q");
  bp.tma_do = make_map(p.dout, a.dtype, q_seqs, q_rows, f.h_q, d, p.do_batch_stride,
                       p.do_row_stride, p.do_head_stride, block_m, "dout");
  bp.tma_k = make_map(f.k, a.dtype, kv_seqs, kv_rows, a.h_kv, d, f.k_batch_stride, f.k_row_stride,
                      f.k_head_stride, block_n, "k");
  bp.tma_v = make_map(f.v, a.dtype, kv_seqs, kv_rows, a.h_kv, d, f.v_batch_stride, f.v_row_stride,
                      f.v_head_stride, block_n, "v");
  if (dq_bulk) {
    // The dq accumulator [q_rows][h_q][d] fp32 as one sequence of all its rows (dense batches
    // too: the kernel adds at the sequence's first row, row0). Its bytes bound q_rows far below
    // 2^31 (h_q d 4 >= 256 bytes a row).
    if (p.q_rows > INT32_MAX) throw Error(ErrorKind::kUnsupported, "q", "more than 2^31 rows of q");
    const int64_t row = int64_t{f.h_q} * d;
    bp.tma_dq_accum = make_map(p.dq_accum, DType::kFloat32, 1, static_cast<int>(p.q_rows), f.h_q, d,
                               0, row, d, 64, "dq accumulator");
  }
}

template <class Cfg, bool kBf16, bool kMasked, bool kDqBulk>
void launch_bwd(BwdParams& bp, const BwdArgs& a) {
  make_bwd_maps(bp, a, Cfg::kHeadDim, Cfg::kBlockM, Cfg::kBlockN, kDqBulk);
  const kernel::GridOrder& order = bp.p.fwd.order;
  auto kernel = bwd_kernel<Cfg, kBf16, kMasked, kDqBulk>;
  constexpr int smem = bwd_smem_bytes<Cfg, kDqBulk>();
  static_assert(smem <= 227 * 1024, "the tile's shared memory exceeds what one block may have");
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute (sm90 backward shared memory)");
  dim3 grid((a.max_kv_len + Cfg::kBlockN - 1) / Cfg::kBlockN, a.h_kv, a.batch);
  if constexpr (Cfg::kPersistent) {
    // One CTA per multiprocessor, each taking tiles of the order from the counter until none is
    // left.
    grid = dim3(std::min(order.units * order.m_blocks, a.sms));
    bp.tile_counter = a.tile_counter;
    check_cuda(cudaMemsetAsync(a.tile_counter, 0, sizeof(int), a.stream),
               "cudaMemsetAsync (sm90 backward tile counter)");
  } else if constexpr (Cfg::kHeavyFirst) {
    grid = dim3(order.units * order.m_blocks);  // tile_of's
  }
  kernel<<<grid, Cfg::kThreads, smem, a.stream>>>(bp);
  check_cuda(cudaGetLastError(), "sm90 backward kernel launch");
}

// The dtype and mask instantiations of one tile and dQ path.
template <class Cfg, bool kDqBulk>
void launch_dtypes(BwdParams& bp, const BwdArgs& a) {
  const bool bf16 = a.dtype == DType::kBFloat16;
  if (bf16 && a.masked) launch_bwd<Cfg, true, true, kDqBulk>(bp, a);
  if (bf16 && !a.masked) launch_bwd<Cfg, true, false, kDqBulk>(bp, a);
  if (!bf16 && a.masked) launch_bwd<Cfg, false, true, kDqBulk>(bp, a);
  if (!bf16 && !a.masked) launch_bwd<Cfg, false, false, kDqBulk>(bp, a);
}

// The bulk-dQ kernel's dtype instantiations of one mask alone: masked for the heaviest-first tile
// (an unmasked grid's CTAs cost the same), either for the persistent grid (masked: heaviest
// first; unmasked: the natural order).
template <class Cfg, bool kMasked>
void launch_bulk_dtypes(BwdParams& bp, const BwdArgs& a) {
  if (a.dtype == DType::kBFloat16)
    launch_bwd<Cfg, true, kMasked, true>(bp, a);
  else
    launch_bwd<Cfg, false, kMasked, true>(bp, a);
}

// The heaviest-first order of this call's CTAs (tile_order.h), or one with sections = 0 where the
// call keeps the 3-D grid: the switch off, the atomics' kernel, no mask (equal CTAs), or a grid
// too large for 32-bit tile indices. Units are (KV head, sequence) pairs; the bytes that bound a
// section by L2 are what a unit's CTAs all stream and re-read from L2 when they run close
// together: its query heads' Q and dO. One CTA per multiprocessor.
template <class Cfg>
kernel::GridOrder heavy_first_order(const sm80::BwdParams& p, const BwdArgs& a) {
  if (!a.heavy_first || !a.dq_bulk || !a.masked) return kernel::GridOrder{};
  const int n_blocks = (a.max_kv_len + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const int64_t q_bytes = int64_t{p.fwd.h_ratio} * a.max_q_len * Cfg::kHeadDim * 2 * 2;
  return kernel::heaviest_first(n_blocks, a.h_kv, int64_t{a.h_kv} * a.batch, a.sms, q_bytes,
                                a.l2_bytes);
}

// The persistent grid's order (FLASHSERVE_SM90_BWD_PERSISTENT, the bulk-dQ kernel), or one with
// units = 0 where the call keeps a grid of one CTA per tile: the switch off, the atomics' kernel,
// no tile counter, or more tiles than 32-bit tile indices hold (with the CTAs' overshoot: each
// takes one index past the last). The CTAs take the order's tiles from a counter, so the order is
// the one a list scheduler sees: masked calls take the heaviest-first order whatever
// FLASHSERVE_SM90_BWD_HEAVY_FIRST says (the longest tiles first, the shortest filling the end);
// unmasked calls (tiles of equal cost, but for the sequences' lengths) the natural order, key block
// fastest, as the 3-D grid starts them, so that CTAs running together share the unit's Q and dO
// in L2.
template <class Cfg>
kernel::GridOrder persistent_order(const sm80::BwdParams& p, const BwdArgs& a) {
  if (!a.persistent || !a.dq_bulk || a.sms <= 0 || a.tile_counter == nullptr)
    return kernel::GridOrder{};
  const int n_blocks = (a.max_kv_len + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const int64_t units = int64_t{a.h_kv} * a.batch;
  if (units * n_blocks > INT32_MAX - a.sms) return kernel::GridOrder{};
  if (!a.masked) return kernel::GridOrder{n_blocks, a.h_kv, static_cast<int32_t>(units), 0};
  const int64_t q_bytes = int64_t{p.fwd.h_ratio} * a.max_q_len * Cfg::kHeadDim * 2 * 2;
  return kernel::heaviest_first(n_blocks, a.h_kv, units, a.sms, q_bytes, a.l2_bytes);
}

template <int kHeadDim>
void run_bwd_hdim(const sm80::BwdParams& params, const BwdArgs& a) {
  using Cfg = typename DefaultBwdTile<kHeadDim>::type;
  if (a.batch == 0 || a.max_q_len == 0) return;
  sm80::run_bwd_preprocess(params, a.dtype, kHeadDim, a.max_q_len, a.stream);
  bool fused_dq = false;
  if (a.max_kv_len > 0 && a.h_kv > 0) {
    BwdParams bp{};
    bp.p = params;
    bp.p.fwd.order = persistent_order<Cfg>(params, a);
    const bool persistent = bp.p.fwd.order.units > 0;
    if (!persistent) bp.p.fwd.order = heavy_first_order<Cfg>(params, a);
    // The fused dQ conversion needs the one-tile 3-D grid (kFusedDqTile): not the persistent
    // grid nor the heaviest-first order, and the bulk-dQ kernel.
    fused_dq = a.dq_counters != nullptr && a.dq_bulk && !persistent && bp.p.fwd.order.sections == 0;
    bp.dq_counters = fused_dq ? a.dq_counters : nullptr;
    if (persistent && a.masked && a.overlap)
      launch_bulk_dtypes<BwdPersistentTile<BwdOverlapTile<BwdHeavyFirstTile<Cfg>>>, true>(bp, a);
    else if (persistent && a.masked)
      launch_bulk_dtypes<BwdPersistentTile<BwdHeavyFirstTile<Cfg>>, true>(bp, a);
    else if (persistent && a.overlap)
      launch_bulk_dtypes<BwdPersistentTile<BwdOverlapTile<Cfg>>, false>(bp, a);
    else if (persistent)
      launch_bulk_dtypes<BwdPersistentTile<Cfg>, false>(bp, a);
    else if (bp.p.fwd.order.sections > 0 && a.overlap)
      launch_bulk_dtypes<BwdOverlapTile<BwdHeavyFirstTile<Cfg>>, true>(bp, a);
    else if (bp.p.fwd.order.sections > 0)
      launch_bulk_dtypes<BwdHeavyFirstTile<Cfg>, true>(bp, a);
    else if (a.dq_bulk && a.overlap)
      launch_dtypes<BwdOverlapTile<Cfg>, true>(bp, a);
    else if (a.dq_bulk)
      launch_dtypes<Cfg, true>(bp, a);
    else
      launch_dtypes<Cfg, false>(bp, a);
  }
  if (!fused_dq) sm80::run_bwd_postprocess(params, a.dtype, kHeadDim, a.max_q_len, a.stream);
}

}  // namespace flashserve::attention::sm90
