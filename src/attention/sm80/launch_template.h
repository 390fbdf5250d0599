// The launcher behind run_fwd<kHeadDim>: picks the tile configuration for the call (tile_config.h),
// the dtype and the mask instantiation, and launches on the caller's stream.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "attention/cuda_check.h"
#include "common/pdl.cuh"
#include "flashserve/error.h"
#include "fwd_kernel.h"
#include "launch.h"
#include "tile_config.h"

namespace flashserve::attention::sm80 {

// kMod: the score-modifier kernel (fwd_kernel_score_mod), which reads launch.score_mod.
// A PaddedConfig (Cfg::kPadded): the padded kernel (fwd_kernel_padded), which reads the call's
// head dims from launch.
// kKvFp8: the fp8 KV cache's kernel (fwd_kernel_kv_fp8), which reads launch's descales.
template <class Cfg, class Elem, bool kHasMask, bool kPaged, bool kMod, bool kKvFp8 = false>
void launch_config(const FwdParams& params, const FwdLaunch& launch) {
  static_assert(!(kMod && Cfg::kPadded), "no modifier kernels for padded head dims");
  static_assert(!(kKvFp8 && (kMod || Cfg::kPadded)), "the fp8 KV kernels have neither");
  using Params = std::conditional_t<
      kKvFp8, FwdKvFp8Params,
      std::conditional_t<kMod, FwdModParams,
                         std::conditional_t<Cfg::kPadded, FwdPaddedParams, FwdParams>>>;
  void (*kernel)(Params);
  if constexpr (kKvFp8)
    kernel = params.num_splits > 1 ? &fwd_kernel_kv_fp8<Cfg, Elem, kHasMask, kPaged, true>
                                   : &fwd_kernel_kv_fp8<Cfg, Elem, kHasMask, kPaged, false>;
  else if constexpr (Cfg::kPadded)
    kernel = params.num_splits > 1 ? &fwd_kernel_padded<Cfg, Elem, kHasMask, kPaged, true>
                                   : &fwd_kernel_padded<Cfg, Elem, kHasMask, kPaged, false>;
  else if constexpr (kMod)
    kernel = params.num_splits > 1 ? &fwd_kernel_score_mod<Cfg, Elem, kHasMask, kPaged, true>
                                   : &fwd_kernel_score_mod<Cfg, Elem, kHasMask, kPaged, false>;
  else
    kernel = params.num_splits > 1 ? &fwd_kernel<Cfg, Elem, kHasMask, kPaged, true>
                                   : &fwd_kernel<Cfg, Elem, kHasMask, kPaged, false>;
  constexpr int kSmem = kFwdSmemBytes<Cfg, kPaged>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
             "cudaFuncSetAttribute (sm80 forward shared memory)");
  // Grid: query tiles x grid heads (KV heads when the GQA group is packed into the rows) x
  // sequences and their splits; masked grids in the 1-D order of attention/kernel/tile_order.h.
  const int rows = launch.max_q_len * (Cfg::kPackGqa ? params.h_ratio : 1);
  const int m_blocks = (rows + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int heads = Cfg::kPackGqa ? params.h_q / params.h_ratio : params.h_q;
  const int z = launch.batch * params.num_splits;
  dim3 grid(m_blocks, heads, z);
  Params p{params};
  if constexpr (kMod) p.mod = launch.score_mod;
  if constexpr (kKvFp8) set_kv_descales(p, launch);
  if constexpr (Cfg::kPadded) {
    p.head_dim = launch.head_dim;
    p.head_dim_v = launch.head_dim_v;
  }
  p.order = GridOrder{};
  if (kHasMask && launch.heaviest_first) {
    const int64_t per_sm =
        std::min<int64_t>(Cfg::kMinBlocksPerSm, std::max(1, launch.smem_per_sm / (kSmem + 1024)));
    // Heads of a GQA group are adjacent units and share their K/V; a split reads its share.
    const int64_t kv_bytes = int64_t{launch.max_kv_len} * Cfg::kHeadDim * 4 /
                             (int64_t{params.h_ratio} * params.num_splits);
    p.order = heaviest_first(m_blocks, heads, int64_t{heads} * z, per_sm * launch.sms, kv_bytes,
                             launch.l2_bytes);
    if (p.order.sections > 0) grid = dim3(m_blocks * p.order.units);
  }
  check_cuda(pdl::launch(launch.pdl, kernel, grid, dim3(Cfg::kThreads), kSmem, launch.stream, p),
             "sm80 forward kernel launch");
}

// The fp8 KV kernels' descale pointers and strides, from the launch.
inline void set_kv_descales(FwdKvFp8Params& p, const FwdLaunch& launch) {
  p.k_descale = launch.k_descale;
  p.v_descale = launch.v_descale;
  p.k_descale_batch_stride = launch.k_descale_batch_stride;
  p.k_descale_head_stride = launch.k_descale_head_stride;
  p.v_descale_batch_stride = launch.v_descale_batch_stride;
  p.v_descale_head_stride = launch.v_descale_head_stride;
}

// Refuses a tile whose shared memory (smem bytes a block) the device does not allow.
inline void check_smem(int head_dim, int smem, const FwdLaunch& launch) {
  if (launch.smem_per_block < smem)
    throw Error(ErrorKind::kUnsupported, "q",
                "head_dim " + std::to_string(head_dim) + " needs " + std::to_string(smem / 1024) +
                    " KB of shared memory per block; this device allows " +
                    std::to_string(launch.smem_per_block / 1024) + " KB");
}

// Decode tiles whose splits merge in a thread-block cluster (the plan's cluster_combine;
// cluster_combine.h): launch_config's decode grid, with clusters of num_splits CTAs along z (a
// sequence's splits are adjacent there), through cudaLaunchKernelEx. Above 8 CTAs a cluster is
// of the non-portable size Hopper allows (16).
template <class Cfg, bool kPaged>
void launch_cluster_combine(const FwdParams& params, const FwdLaunch& launch) {
  static_assert(Cfg::kPackGqa);
  constexpr int kSmem = kFwdSmemBytes<Cfg, kPaged>;
  check_smem(Cfg::kHeadDim, kSmem, launch);
  const int splits = params.num_splits;
  if (splits < 2 || splits > kClusterCombineMaxSplits)
    throw Error(ErrorKind::kInternal, "num_splits",
                "the cluster combine takes 2 to " + std::to_string(kClusterCombineMaxSplits) +
                    " splits, got " + std::to_string(splits));
  auto run = [&](auto elem) {
    void (*kernel)(FwdParams) = &fwd_kernel_cluster_combine<Cfg, decltype(elem), kPaged>;
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
               "cudaFuncSetAttribute (sm80 decode cluster shared memory)");
    if (splits > 8)
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                 "cudaFuncSetAttribute (sm80 decode cluster of more than 8)");
    const int rows = launch.max_q_len * params.h_ratio;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3((rows + Cfg::kBlockM - 1) / Cfg::kBlockM, params.h_q / params.h_ratio,
                          launch.batch * splits);
    config.blockDim = dim3(Cfg::kThreads);
    config.dynamicSmemBytes = kSmem;
    config.stream = launch.stream;
    cudaLaunchAttribute attrs[2]{};
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = 1;
    attrs[0].val.clusterDim.y = 1;
    attrs[0].val.clusterDim.z = static_cast<unsigned>(splits);
    attrs[1] = pdl::attribute();
    config.attrs = attrs;
    config.numAttrs = launch.pdl ? 2 : 1;
    FwdParams p{params};
    p.order = GridOrder{};
    check_cuda(cudaLaunchKernelEx(&config, kernel, p), "sm80 decode cluster-combine launch");
  };
  if (launch.dtype == DType::kBFloat16) return run(__nv_bfloat16{});
  run(__half{});
}

// The configuration of tile_config.h for the call, if the device's shared memory holds it.
template <class Cfg, bool kHasMask, bool kPaged, bool kMod = false, bool kKvFp8 = false>
void launch_checked(const FwdParams& params, const FwdLaunch& launch) {
  constexpr int kSmem = kFwdSmemBytes<Cfg, kPaged>;
  check_smem(Cfg::kHeadDim, kSmem, launch);
  if constexpr (kKvFp8) {  // bfloat16 q and out only (the plan refuses the others by name)
    if (launch.dtype != DType::kBFloat16)
      throw Error(ErrorKind::kInternal, "q",
                  "a 16-bit q other than bfloat16 reached the fp8 KV kernels");
    return launch_config<Cfg, __nv_bfloat16, kHasMask, kPaged, kMod, true>(params, launch);
  } else {
    if (launch.dtype == DType::kBFloat16)
      return launch_config<Cfg, __nv_bfloat16, kHasMask, kPaged, kMod>(params, launch);
    return launch_config<Cfg, __half, kHasMask, kPaged, kMod>(params, launch);
  }
}

template <int kHeadDim, bool kHasMask, bool kPaged, bool kMod = false, bool kKvFp8 = false>
void launch_mask(const FwdParams& params, const FwdLaunch& launch) {
  using Cfg = FwdConfig<kHeadDim, fwd_tiles(kHeadDim, kHasMask)>;
  using Small = FwdConfig<kHeadDim, fwd_tiles_small_smem(kHeadDim, kHasMask)>;
  if constexpr (Small::kSmemBytes < Cfg::kSmemBytes) {
    if (launch.smem_per_block < kFwdSmemBytes<Cfg, kPaged>)
      return launch_checked<Small, kHasMask, kPaged, kMod, kKvFp8>(params, launch);
  }
  launch_checked<Cfg, kHasMask, kPaged, kMod, kKvFp8>(params, launch);
}

// Score modifiers have kernels of their own for the decode tiles and the masked prefill tiles
// only (each instantiation costs compile time): the plan runs a call with modifiers on masked
// tiles whatever its mask (attention/cuda/plan.cc choose_kernel), where an unbounded window
// masks only the keys past kv_len.
template <int kHeadDim, bool kPaged>
void launch_score_mod(const FwdParams& params, const FwdLaunch& launch) {
  if (launch.decode)
    return launch_checked<FwdConfig<kHeadDim, decode_tiles(kHeadDim)>, false, kPaged, true>(params,
                                                                                            launch);
  if (!launch.has_mask)
    throw Error(ErrorKind::kInternal, "softcap",
                "score modifiers reached the sm80 forward on unmasked prefill tiles");
  launch_mask<kHeadDim, true, kPaged, true>(params, launch);
}

// Padded head dims (launch.h run_fwd_padded): instantiated for the decode tiles and the masked
// prefill tiles only, as the modifier kernels (each instantiation costs compile time); the plan
// runs an unmasked call on the masked tiles, where an unbounded window masks only the keys past
// kv_len. The masked tiles need no small-shared-memory variant (fwd_tiles_small_smem differs
// only where PV pairs are on, which masked tiles are not).
template <int kHeadDim>
void run_fwd_padded_impl(const FwdParams& params, const FwdLaunch& launch) {
  if (launch.has_score_mod)
    throw Error(ErrorKind::kInternal, "softcap",
                "score modifiers reached the sm80 forward with padded head dims");
  if (launch.head_dim <= 0 || launch.head_dim > kHeadDim || launch.head_dim % 8 != 0 ||
      launch.head_dim_v <= 0 || launch.head_dim_v > kHeadDim || launch.head_dim_v % 8 != 0)
    throw Error(ErrorKind::kInternal, "q",
                "head dims " + std::to_string(launch.head_dim) + "/" +
                    std::to_string(launch.head_dim_v) + " reached the padded d" +
                    std::to_string(kHeadDim) + " kernels");
  if (launch.decode) {
    using Decode = PaddedConfig<FwdConfig<kHeadDim, decode_tiles(kHeadDim)>>;
    if (launch.paged) return launch_checked<Decode, false, true>(params, launch);
    return launch_checked<Decode, false, false>(params, launch);
  }
  if (!launch.has_mask)
    throw Error(ErrorKind::kInternal, "q",
                "padded head dims reached the sm80 forward on unmasked prefill tiles");
  using Masked = PaddedConfig<FwdConfig<kHeadDim, fwd_tiles(kHeadDim, true)>>;
  static_assert(fwd_tiles_small_smem(kHeadDim, true).pv_pairs ==
                fwd_tiles(kHeadDim, true).pv_pairs);
  if (launch.paged) return launch_checked<Masked, true, true>(params, launch);
  return launch_checked<Masked, true, false>(params, launch);
}

template <int kHeadDim>
void run_fwd_impl(const FwdParams& params, const FwdLaunch& launch) {
  if (launch.has_score_mod) {
    if (launch.paged) return launch_score_mod<kHeadDim, true>(params, launch);
    return launch_score_mod<kHeadDim, false>(params, launch);
  }
  if (launch.decode) {  // the dispatch checked: at most one query per sequence
    using Decode = FwdConfig<kHeadDim, decode_tiles(kHeadDim)>;
    if (launch.cluster_combine) {
      if (launch.paged) return launch_cluster_combine<Decode, true>(params, launch);
      return launch_cluster_combine<Decode, false>(params, launch);
    }
    if (launch.paged) return launch_checked<Decode, false, true>(params, launch);
    return launch_checked<Decode, false, false>(params, launch);
  }
  if (launch.paged) {
    if (launch.has_mask) return launch_mask<kHeadDim, true, true>(params, launch);
    return launch_mask<kHeadDim, false, true>(params, launch);
  }
  if (launch.has_mask) return launch_mask<kHeadDim, true, false>(params, launch);
  return launch_mask<kHeadDim, false, false>(params, launch);
}

}  // namespace flashserve::attention::sm80

#include "kv_fp8_reg.h"

namespace flashserve::attention::sm80 {

// The fp8 KV cache's decode tiles with the codes converted at operand load (kv_fp8_reg.h;
// launch.kv_fp8_register): the decode grid of launch_config, the code tiles' shared memory, and
// the carveout asked at its maximum so that the smaller blocks (36-40 KB) fit five or six an SM.
template <class Cfg>
void launch_kv_fp8_register(const FwdParams& params, const FwdLaunch& launch) {
  static_assert(Cfg::kPackGqa);
  constexpr int kSmem = kKvFp8RegSmemBytes<Cfg>;
  check_smem(Cfg::kHeadDim, kSmem, launch);
  if (launch.dtype != DType::kBFloat16)
    throw Error(ErrorKind::kInternal, "q",
                "a 16-bit q other than bfloat16 reached the fp8 KV kernels");
  void (*kernel)(FwdKvFp8Params) = params.num_splits > 1 ? &fwd_kernel_kv_fp8_reg<Cfg, true>
                                                         : &fwd_kernel_kv_fp8_reg<Cfg, false>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
             "cudaFuncSetAttribute (sm80 fp8 KV register shared memory)");
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  int{cudaSharedmemCarveoutMaxShared}),
             "cudaFuncSetAttribute (sm80 fp8 KV register carveout)");
  const int rows = launch.max_q_len * params.h_ratio;
  const dim3 grid((rows + Cfg::kBlockM - 1) / Cfg::kBlockM, params.h_q / params.h_ratio,
                  launch.batch * params.num_splits);
  FwdKvFp8Params p{params};
  set_kv_descales(p, launch);
  p.order = GridOrder{};
  check_cuda(pdl::launch(launch.pdl, kernel, grid, dim3(Cfg::kThreads), kSmem, launch.stream, p),
             "sm80 fp8 KV register kernel launch");
}

// The fp8 KV cache (launch.h run_fwd_kv_fp8): paged K/V only, decode tiles or masked prefill
// tiles (the plan runs every prefill launch masked, as the padded kernels: an unbounded window
// masks only the keys past kv_len), bfloat16 q; no modifiers, no padded head dims.
template <int kHeadDim>
void run_fwd_kv_fp8_impl(const FwdParams& params, const FwdLaunch& launch) {
  if (launch.has_score_mod || !launch.paged || (!launch.decode && !launch.has_mask))
    throw Error(ErrorKind::kInternal, "k",
                "the fp8 KV kernels were asked for modifiers, unpaged K/V or unmasked tiles");
  if (launch.decode) {
    using Decode = FwdConfig<kHeadDim, decode_tiles(kHeadDim)>;
    if (launch.kv_fp8_register) return launch_kv_fp8_register<Decode>(params, launch);
    return launch_checked<Decode, false, true, false, true>(params, launch);
  }
  launch_mask<kHeadDim, true, true, false, true>(params, launch);
}

}  // namespace flashserve::attention::sm80
