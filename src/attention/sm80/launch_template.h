// The launcher behind run_fwd<kHeadDim>: picks the tile configuration the device's shared memory
// allows (tile_config.h), the dtype and the mask instantiation, and launches on the caller's
// stream.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashserve/error.h"
#include "fwd_kernel.h"
#include "launch.h"
#include "tile_config.h"

namespace flashserve::attention::sm80 {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Error(ErrorKind::kCuda, "", std::string(what) + ": " + cudaGetErrorString(err));
}

template <class Cfg, class Elem, bool kHasMask>
void launch_config(const FwdParams& params, const FwdLaunch& launch) {
  auto* kernel = &fwd_kernel<Cfg, Elem, kHasMask>;
  check_cuda(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes),
      "cudaFuncSetAttribute (sm80 forward shared memory)");
  const dim3 grid((launch.max_q_len + Cfg::kBlockM - 1) / Cfg::kBlockM, params.h_q, launch.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, launch.stream>>>(params);
  check_cuda(cudaGetLastError(), "sm80 forward kernel launch");
}

template <class Cfg>
void launch_dtype(const FwdParams& params, const FwdLaunch& launch) {
  const bool bf16 = launch.dtype == DType::kBFloat16;
  if (bf16 && launch.has_mask) return launch_config<Cfg, __nv_bfloat16, true>(params, launch);
  if (bf16) return launch_config<Cfg, __nv_bfloat16, false>(params, launch);
  if (launch.has_mask) return launch_config<Cfg, __half, true>(params, launch);
  return launch_config<Cfg, __half, false>(params, launch);
}

template <int kHeadDim>
void run_fwd_impl(const FwdParams& params, const FwdLaunch& launch) {
  constexpr Tiles kHopper = fwd_tiles(kHeadDim, kSmemHopper);
  constexpr Tiles kAmpere = fwd_tiles(kHeadDim, kSmemAmpere);
  using Hopper = FwdConfig<kHeadDim, kHopper>;
  using Ampere = FwdConfig<kHeadDim, kAmpere>;
  if (launch.smem_per_block >= Hopper::kSmemBytes) return launch_dtype<Hopper>(params, launch);
  if constexpr (Ampere::kSmemBytes < Hopper::kSmemBytes) {
    if (launch.smem_per_block >= Ampere::kSmemBytes) return launch_dtype<Ampere>(params, launch);
  }
  throw Error(ErrorKind::kUnsupported, "q",
              "head_dim " + std::to_string(kHeadDim) + " needs " +
                  std::to_string(Ampere::kSmemBytes / 1024) +
                  " KB of shared memory per block; this device allows " +
                  std::to_string(launch.smem_per_block / 1024) + " KB");
}

}  // namespace flashserve::attention::sm80
