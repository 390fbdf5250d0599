// The launcher behind run_fwd<kHeadDim>: picks the tile configuration the call and the device's
// shared memory allow (tile_config.h), the dtype and the mask instantiation, and launches on the
// caller's stream.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
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
  FwdParams p = params;
  p.tiles_m =
      (launch.max_q_len * (Cfg::kPackGqa ? params.h_ratio : 1) + Cfg::kBlockM - 1) / Cfg::kBlockM;
  p.tiles_h = Cfg::kPackGqa ? params.h_q / params.h_ratio : params.h_q;
  p.tiles_z = launch.batch * params.num_splits;
  dim3 grid(p.tiles_m, p.tiles_h, p.tiles_z);
  if constexpr (Cfg::kPersistent) {
    int per_sm = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Cfg::kThreads,
                                                             Cfg::kSmemBytes),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    const int64_t tiles = int64_t{p.tiles_m} * p.tiles_h * p.tiles_z;
    grid =
        dim3(static_cast<unsigned>(std::min<int64_t>(tiles, std::max(per_sm, 1) * launch.num_sms)));
  }
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, launch.stream>>>(p);
  check_cuda(cudaGetLastError(), "sm80 forward kernel launch");
}

template <class Cfg, bool kHasMask, bool kPaged>
void launch_dtype(const FwdParams& params, const FwdLaunch& launch) {
  if (launch.dtype == DType::kBFloat16)
    return launch_config<Cfg, __nv_bfloat16, kHasMask, kPaged>(params, launch);
  return launch_config<Cfg, __half, kHasMask, kPaged>(params, launch);
}

// Per mask, the Hopper-sized configuration, or the A100-sized one where it differs and the
// device's shared memory is smaller.
template <int kHeadDim, bool kHasMask, bool kPaged>
void launch_mask(const FwdParams& params, const FwdLaunch& launch) {
  using Hopper = FwdConfig<kHeadDim, fwd_tiles(kHeadDim, kSmemHopper, kHasMask)>;
  using Ampere = FwdConfig<kHeadDim, fwd_tiles(kHeadDim, kSmemAmpere, kHasMask)>;
  if (launch.smem_per_block >= Hopper::kSmemBytes)
    return launch_dtype<Hopper, kHasMask, kPaged>(params, launch);
  if constexpr (Ampere::kSmemBytes < Hopper::kSmemBytes) {
    if (launch.smem_per_block >= Ampere::kSmemBytes)
      return launch_dtype<Ampere, kHasMask, kPaged>(params, launch);
  }
  throw Error(ErrorKind::kUnsupported, "q",
              "head_dim " + std::to_string(kHeadDim) + " needs " +
                  std::to_string(Ampere::kSmemBytes / 1024) +
                  " KB of shared memory per block; this device allows " +
                  std::to_string(launch.smem_per_block / 1024) + " KB");
}

template <int kHeadDim>
void run_fwd_impl(const FwdParams& params, const FwdLaunch& launch) {
  if (launch.decode) {  // the dispatch checked: at most one query per sequence, no left window
    using Decode = FwdConfig<kHeadDim, decode_tiles(kHeadDim)>;
    if (launch.paged) return launch_dtype<Decode, false, true>(params, launch);
    return launch_dtype<Decode, false, false>(params, launch);
  }
  if (launch.paged) {
    if (launch.has_mask) return launch_mask<kHeadDim, true, true>(params, launch);
    return launch_mask<kHeadDim, false, true>(params, launch);
  }
  if (launch.has_mask) return launch_mask<kHeadDim, true, false>(params, launch);
  return launch_mask<kHeadDim, false, false>(params, launch);
}

}  // namespace flashserve::attention::sm80
