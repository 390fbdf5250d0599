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

// The main kernel (and in deterministic mode the dq kernel) of Cfg, between the preprocess and the
// postprocess: once, or for BwdPaddedConfig past 128 columns once per kOutDim columns (col0).
template <class Cfg, class Elem, bool kHasMask>
void launch_bwd(BwdParams params, const BwdLaunch& launch) {
  auto* kernel = launch.deterministic ? &bwd_kernel<Cfg, Elem, kHasMask, false>
                                      : &bwd_kernel<Cfg, Elem, kHasMask, true>;
  auto* dq_kernel = &bwd_dq_kernel<Cfg, Elem, kHasMask>;
  check_cuda(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
      "cudaFuncSetAttribute (sm80 backward shared memory)");
  if (launch.deterministic)
    check_cuda(cudaFuncSetAttribute(dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    Cfg::kSmemBytes),
               "cudaFuncSetAttribute (sm80 backward dq shared memory)");
  const int head_dim = params.head_dim;
  run_bwd_preprocess(params, launch.dtype, head_dim, launch.max_q_len, launch.stream);
  const dim3 grid((launch.max_kv_len + Cfg::kBlockN - 1) / Cfg::kBlockN, launch.h_kv, params.batch);
  const dim3 q_grid((launch.max_q_len + Cfg::kBlockM - 1) / Cfg::kBlockM, params.fwd.h_q,
                    params.batch);
  for (int col0 = 0; col0 < head_dim; col0 += Cfg::kOutDim) {
    params.col0 = col0;
    if (launch.max_kv_len > 0) {
      kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, launch.stream>>>(params);
      check_cuda(cudaGetLastError(), "sm80 backward kernel launch");
    }
    if (launch.deterministic && launch.max_q_len > 0) {
      dq_kernel<<<q_grid, Cfg::kThreads, Cfg::kSmemBytes, launch.stream>>>(params);
      check_cuda(cudaGetLastError(), "sm80 backward dq kernel launch");
    }
  }
  if (!launch.deterministic)
    run_bwd_postprocess(params, launch.dtype, head_dim, launch.max_q_len, launch.stream);
}

template <class Cfg>
void run_bwd_config(const BwdParams& params, const BwdLaunch& launch) {
  if (launch.smem_per_block < Cfg::kSmemBytes)
    throw Error(ErrorKind::kUnsupported, "q",
                "the backward at head_dim " + std::to_string(params.head_dim) + " needs " +
                    std::to_string(Cfg::kSmemBytes / 1024) +
                    " KB of shared memory per block; this device allows " +
                    std::to_string(launch.smem_per_block / 1024) + " KB");
  const bool bf16 = launch.dtype == DType::kBFloat16;
  if (launch.has_mask)
    return bf16 ? launch_bwd<Cfg, __nv_bfloat16, true>(params, launch)
                : launch_bwd<Cfg, __half, true>(params, launch);
  return bf16 ? launch_bwd<Cfg, __nv_bfloat16, false>(params, launch)
              : launch_bwd<Cfg, __half, false>(params, launch);
}

template <int kHeadDim>
void run_bwd(const BwdParams& params, const BwdLaunch& launch) {
  run_bwd_config<BwdConfig<kHeadDim>>(params, launch);
}

template <int kHeadDim>
void run_bwd_padded(const BwdParams& params, const BwdLaunch& launch) {
  const int d = params.head_dim;
  if (d <= 0 || d > kHeadDim || d % 8 != 0)
    throw Error(ErrorKind::kInternal, "q",
                "head_dim " + std::to_string(d) + " reached the padded backward of d" +
                    std::to_string(kHeadDim));
  run_bwd_config<BwdPaddedConfig<kHeadDim>>(params, launch);
}

}  // namespace flashserve::attention::sm80
