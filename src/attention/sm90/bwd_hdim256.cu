// The sm90 backward kernels for head dim 256 (bf16/fp16, masked or not): the swapped products of
// bwd_swapped_kernel.h, between the shared preprocess and postprocess (sm80/bwd_launch.h), as
// bwd_launch_template.h's run_bwd_hdim does for 64 and 128. Head dims 136-248 (multiples of 8)
// run them padded: the tensor maps describe the call's head dim, so TMA fills q, k, v and dout's
// columns past it with zeros (S and dP exact, the extra columns of dQ, dK, dV zeros), drops the
// dQ reduce-adds' columns past it, and the kernel stores dk and dv's rows up to it.
#include <string>

#include "attention/cuda_check.h"
#include "attention/sm80/bwd_launch.h"
#include "bwd_launch.h"
#include "bwd_swapped_kernel.h"
#include "tensor_map.h"

namespace flashserve::attention::sm90 {
namespace {

template <class Cfg, bool kBf16, bool kMasked>
void launch_bwd_swapped(BwdParams& bp, const BwdArgs& a) {
  const sm80::BwdParams& p = bp.p;
  const int d = p.head_dim;  // the call's: 256, or 136-248 padded
  const sm80::FwdParams& f = p.fwd;
  // Varlen tensors are one sequence of all their rows for TMA (bwd_launch_template.h's launch_bwd).
  const bool varlen_q = f.cu_seqlens_q != nullptr, varlen_k = f.cu_seqlens_k != nullptr;
  const int q_seqs = varlen_q ? 1 : a.batch, kv_seqs = varlen_k ? 1 : a.batch;
  const int q_rows = std::max(a.q_rows, 1), kv_rows = std::max(a.kv_rows, 1);
  bp.tma_q = make_map(f.q, a.dtype, q_seqs, q_rows, f.h_q, d, f.q_batch_stride, f.q_row_stride,
                      f.q_head_stride, Cfg::kBlockM, "q");
  bp.tma_do = make_map(p.dout, a.dtype, q_seqs, q_rows, f.h_q, d, p.do_batch_stride,
                       p.do_row_stride, p.do_head_stride, Cfg::kBlockM, "dout");
  bp.tma_k = make_map(f.k, a.dtype, kv_seqs, kv_rows, a.h_kv, d, f.k_batch_stride, f.k_row_stride,
                      f.k_head_stride, Cfg::kBlockN, "k");
  bp.tma_v = make_map(f.v, a.dtype, kv_seqs, kv_rows, a.h_kv, d, f.v_batch_stride, f.v_row_stride,
                      f.v_head_stride, Cfg::kBlockN, "v");
  // The dq accumulator [q_rows][h_q][d] fp32 (d the call's head dim) as one sequence of all its
  // rows, boxes of 32 columns x 64 rows (the step's kBlockM queries).
  if (p.q_rows > INT32_MAX) throw Error(ErrorKind::kUnsupported, "q", "more than 2^31 rows of q");
  const int64_t row = int64_t{f.h_q} * d;
  bp.tma_dq_accum = make_map(p.dq_accum, DType::kFloat32, 1, static_cast<int>(p.q_rows), f.h_q, d,
                             0, row, d, Cfg::kBlockM, "dq accumulator");
  auto kernel = bwd_swapped_kernel<Cfg, kBf16, kMasked>;
  constexpr int smem = bwd_swapped_smem_bytes<Cfg>();
  static_assert(smem <= 227 * 1024, "the tile's shared memory exceeds what one block may have");
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute (sm90 d256 backward shared memory)");
  const dim3 grid((a.max_kv_len + Cfg::kBlockN - 1) / Cfg::kBlockN, a.h_kv, a.batch);
  kernel<<<grid, Cfg::kThreads, smem, a.stream>>>(bp);
  check_cuda(cudaGetLastError(), "sm90 d256 backward kernel launch");
}

}  // namespace

// The dQ paths, the overlapped step, heaviest first and the persistent grid are bwd_kernel.h's
// (d64, d128): this kernel has the bulk reduce-add only and ignores the other switches.
template <>
void run_bwd_hdim<256>(const sm80::BwdParams& params, const BwdArgs& a) {
  using Cfg = DefaultBwdTile<256>::type;
  if (a.batch == 0 || a.max_q_len == 0) return;
  sm80::run_bwd_preprocess(params, a.dtype, params.head_dim, a.max_q_len, a.stream);
  if (a.max_kv_len > 0 && a.h_kv > 0) {
    BwdParams bp{};
    bp.p = params;
    const bool bf16 = a.dtype == DType::kBFloat16;
    if (bf16 && a.masked) launch_bwd_swapped<Cfg, true, true>(bp, a);
    if (bf16 && !a.masked) launch_bwd_swapped<Cfg, true, false>(bp, a);
    if (!bf16 && a.masked) launch_bwd_swapped<Cfg, false, true>(bp, a);
    if (!bf16 && !a.masked) launch_bwd_swapped<Cfg, false, false>(bp, a);
  }
  sm80::run_bwd_postprocess(params, a.dtype, params.head_dim, a.max_q_len, a.stream);
}

}  // namespace flashserve::attention::sm90
