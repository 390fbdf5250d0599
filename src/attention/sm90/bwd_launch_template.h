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

template <class Cfg, bool kBf16, bool kMasked>
void launch_bwd(BwdParams& bp, const BwdArgs& a) {
  constexpr int kD = Cfg::kHeadDim;
  const sm80::BwdParams& p = bp.p;
  const sm80::FwdParams& f = p.fwd;
  // Varlen tensors are one sequence of all their rows for TMA (the kernel offsets each block by
  // its sequence's first row); TMA refuses a dimension of 0, so no rows describe one.
  const bool varlen_q = f.cu_seqlens_q != nullptr, varlen_k = f.cu_seqlens_k != nullptr;
  const int q_seqs = varlen_q ? 1 : a.batch, kv_seqs = varlen_k ? 1 : a.batch;
  const int q_rows = std::max(a.q_rows, 1), kv_rows = std::max(a.kv_rows, 1);
  bp.tma_q = make_map(f.q, a.dtype, q_seqs, q_rows, f.h_q, kD, f.q_batch_stride, f.q_row_stride,
                      f.q_head_stride, Cfg::kBlockM, "q");
  bp.tma_do = make_map(p.dout, a.dtype, q_seqs, q_rows, f.h_q, kD, p.do_batch_stride,
                       p.do_row_stride, p.do_head_stride, Cfg::kBlockM, "dout");
  bp.tma_k = make_map(f.k, a.dtype, kv_seqs, kv_rows, a.h_kv, kD, f.k_batch_stride, f.k_row_stride,
                      f.k_head_stride, Cfg::kBlockN, "k");
  bp.tma_v = make_map(f.v, a.dtype, kv_seqs, kv_rows, a.h_kv, kD, f.v_batch_stride, f.v_row_stride,
                      f.v_head_stride, Cfg::kBlockN, "v");
  auto kernel = bwd_kernel<Cfg, kBf16, kMasked>;
  constexpr int smem = bwd_smem_bytes<Cfg>();
  static_assert(smem <= 227 * 1024, "the tile's shared memory exceeds what one block may have");
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute (sm90 backward shared memory)");
  const dim3 grid((a.max_kv_len + Cfg::kBlockN - 1) / Cfg::kBlockN, a.h_kv, a.batch);
  kernel<<<grid, Cfg::kThreads, smem, a.stream>>>(bp);
  check_cuda(cudaGetLastError(), "sm90 backward kernel launch");
}

template <int kHeadDim>
void run_bwd_hdim(const sm80::BwdParams& params, const BwdArgs& a) {
  using Cfg = typename DefaultBwdTile<kHeadDim>::type;
  if (a.batch == 0 || a.max_q_len == 0) return;
  sm80::run_bwd_preprocess(params, a.dtype, kHeadDim, a.max_q_len, a.stream);
  if (a.max_kv_len > 0 && a.h_kv > 0) {
    BwdParams bp{};
    bp.p = params;
    const bool bf16 = a.dtype == DType::kBFloat16;
    if (bf16 && a.masked) launch_bwd<Cfg, true, true>(bp, a);
    if (bf16 && !a.masked) launch_bwd<Cfg, true, false>(bp, a);
    if (!bf16 && a.masked) launch_bwd<Cfg, false, true>(bp, a);
    if (!bf16 && !a.masked) launch_bwd<Cfg, false, false>(bp, a);
  }
  sm80::run_bwd_postprocess(params, a.dtype, kHeadDim, a.max_q_len, a.stream);
}

}  // namespace flashserve::attention::sm90
