// The launcher behind run_bwd<kHeadDim>: the dtype and mask instantiations of the backward's three
// kernels, on the caller's stream.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "attention/cuda_check.h"
#include "bwd_kernel.h"
#include "bwd_launch.h"
#include "flashserve/error.h"

namespace flashserve::attention::sm80 {

template <int kHeadDim, class Elem, bool kHasMask>
void launch_bwd(const BwdParams& params, const BwdLaunch& launch) {
  using Cfg = BwdConfig<kHeadDim>;
  auto* kernel = launch.deterministic ? &bwd_kernel<Cfg, Elem, kHasMask, false>
                                      : &bwd_kernel<Cfg, Elem, kHasMask, true>;
  check_cuda(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
      "cudaFuncSetAttribute (sm80 backward shared memory)");
  run_bwd_preprocess(params, launch.dtype, kHeadDim, launch.max_q_len, launch.stream);
  const dim3 grid((launch.max_kv_len + Cfg::kBlockN - 1) / Cfg::kBlockN, launch.h_kv, params.batch);
  if (launch.max_kv_len > 0) {
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, launch.stream>>>(params);
    check_cuda(cudaGetLastError(), "sm80 backward kernel launch");
  }
  if (launch.max_q_len == 0) return;
  if (launch.deterministic) {
    auto* dq_kernel = &bwd_dq_kernel<Cfg, Elem, kHasMask>;
    check_cuda(cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    Cfg::kSmemBytes),
               "cudaFuncSetAttribute (sm80 backward dq shared memory)");
    const dim3 q_grid((launch.max_q_len + Cfg::kBlockM - 1) / Cfg::kBlockM, params.fwd.h_q,
                      params.batch);
    dq_kernel<<<q_grid, Cfg::kThreads, Cfg::kSmemBytes, launch.stream>>>(params);
    check_cuda(cudaGetLastError(), "sm80 backward dq kernel launch");
  } else {
    run_bwd_postprocess(params, launch.dtype, kHeadDim, launch.max_q_len, launch.stream);
  }
}

template <int kHeadDim>
void run_bwd(const BwdParams& params, const BwdLaunch& launch) {
  if (launch.smem_per_block < BwdConfig<kHeadDim>::kSmemBytes)
    throw Error(ErrorKind::kUnsupported, "q",
                "the backward at head_dim " + std::to_string(kHeadDim) + " needs " +
                    std::to_string(BwdConfig<kHeadDim>::kSmemBytes / 1024) +
                    " KB of shared memory per block; this device allows " +
                    std::to_string(launch.smem_per_block / 1024) + " KB");
  const bool bf16 = launch.dtype == DType::kBFloat16;
  if (launch.has_mask)
    return bf16 ? launch_bwd<kHeadDim, __nv_bfloat16, true>(params, launch)
                : launch_bwd<kHeadDim, __half, true>(params, launch);
  return bf16 ? launch_bwd<kHeadDim, __nv_bfloat16, false>(params, launch)
              : launch_bwd<kHeadDim, __half, false>(params, launch);
}

}  // namespace flashserve::attention::sm80
