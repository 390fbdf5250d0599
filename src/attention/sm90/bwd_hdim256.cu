// The sm90 backward kernels for head dim 256 (bf16/fp16, masked or not): the swapped products of
// bwd_swapped_kernel.h, between the shared preprocess and postprocess (sm80/bwd_launch.h), as
// bwd_launch_template.h's run_bwd_hdim does for 64 and 128. Head dims 136-248 (multiples of 8)
// run them padded: the tensor maps describe the call's head dim, so TMA fills q, k, v and dout's
// columns past it with zeros (S and dP exact, the extra columns of dQ, dK, dV zeros), drops the
// dQ reduce-adds' columns past it, and the kernel stores dk and dv's rows up to it.
#include <string>

#include "bwd_launch_template.h"
#include "bwd_swapped_kernel.h"

namespace flashserve::attention::sm90 {
namespace {

template <class Cfg, bool kBf16, bool kMasked>
void launch_bwd_swapped(BwdParams& bp, const BwdArgs& a) {
  // The call's head dim: 256, or 136-248 padded.
  make_bwd_maps(bp, a, bp.p.head_dim, Cfg::kBlockM, Cfg::kBlockN, /*dq_bulk=*/true);
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
