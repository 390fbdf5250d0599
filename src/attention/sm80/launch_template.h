// The launcher behind run_fwd<kHeadDim>: picks the tile configuration the device's shared memory
// allows (tile_config.h), the dtype and the mask instantiation, and launches on the caller's
// stream.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "attention/cuda_check.h"
#include "flashserve/error.h"
#include "fwd_kernel.h"
#include "launch.h"
#include "tile_config.h"

namespace flashserve::attention::sm80 {

template <class Cfg, class Elem, bool kHasMask, bool kPaged>
void launch_config(const FwdParams& params, const FwdLaunch& launch) {
  auto* kernel = params.num_splits > 1 ? &fwd_kernel<Cfg, Elem, kHasMask, kPaged, true>
                                       : &fwd_kernel<Cfg, Elem, kHasMask, kPaged, false>;
  check_cuda(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
      "cudaFuncSetAttribute (sm80 forward shared memory)");
  const dim3 grid((launch.max_q_len + Cfg::kBlockM - 1) / Cfg::kBlockM, params.h_q,
                  launch.batch * params.num_splits);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, launch.stream>>>(params);
  check_cuda(cudaGetLastError(), "sm80 forward kernel launch");
}

// Per mask, the Hopper-sized configuration, or the A100-sized one where it differs and the
// device's shared memory is smaller.
template <int kHeadDim, bool kHasMask, bool kPaged>
void launch_mask(const FwdParams& params, const FwdLaunch& launch) {
  using Hopper = FwdConfig<kHeadDim, fwd_tiles(kHeadDim, kSmemHopper, kHasMask)>;
  using Ampere = FwdConfig<kHeadDim, fwd_tiles(kHeadDim, kSmemAmpere, kHasMask)>;
  const bool bf16 = launch.dtype == DType::kBFloat16;
  if (launch.smem_per_block >= Hopper::kSmemBytes) {
    if (bf16) return launch_config<Hopper, __nv_bfloat16, kHasMask, kPaged>(params, launch);
    return launch_config<Hopper, __half, kHasMask, kPaged>(params, launch);
  }
  if constexpr (Ampere::kSmemBytes < Hopper::kSmemBytes) {
    if (launch.smem_per_block >= Ampere::kSmemBytes) {
      if (bf16) return launch_config<Ampere, __nv_bfloat16, kHasMask, kPaged>(params, launch);
      return launch_config<Ampere, __half, kHasMask, kPaged>(params, launch);
    }
  }
  throw Error(ErrorKind::kUnsupported, "q",
              "head_dim " + std::to_string(kHeadDim) + " needs " +
                  std::to_string(Ampere::kSmemBytes / 1024) +
                  " KB of shared memory per block; this device allows " +
                  std::to_string(launch.smem_per_block / 1024) + " KB");
}

template <int kHeadDim>
void run_fwd_impl(const FwdParams& params, const FwdLaunch& launch) {
  if (launch.paged) {
    if (launch.has_mask) return launch_mask<kHeadDim, true, true>(params, launch);
    return launch_mask<kHeadDim, false, true>(params, launch);
  }
  if (launch.has_mask) return launch_mask<kHeadDim, true, false>(params, launch);
  return launch_mask<kHeadDim, false, false>(params, launch);
}

}  // namespace flashserve::attention::sm80
