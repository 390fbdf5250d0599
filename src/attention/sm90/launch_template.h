// The sm90 forward launch for one head dim: tensor maps, grid, shared memory, the instantiation.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <string>

#include "attention/cuda_check.h"
#include "common/env_switch.h"
#include "common/str_cat.h"
#include "fp8_vt.h"
#include "fwd_kernel.h"
#include "launch.h"
#include "tensor_map.h"

namespace flashserve::attention::sm90 {

// Whether the call has a mask (causal or a window) and so runs the masked instantiation.
inline bool masked(const FwdArgs& a) {
  return a.window_left >= 0 || a.window_right >= 0;
}

// FLASHSERVE_SM90_MULTICAST: unset, empty or "1", calls that can take it run with multicast; "0",
// none does (the A/B switch that measures it through the public API in one run,
// bench/sustained_clock.py, and lets the tests compare both). Read per call, as FLASHSERVE_KERNEL.
inline bool multicast_enabled() {
  return env_switch(std::getenv("FLASHSERVE_SM90_MULTICAST"), "FLASHSERVE_SM90_MULTICAST", true);
}

// Whether tile Cfg's call `a` may run as Multicast<Cfg> (tile_config.h): the two CTAs of every
// cluster must visit the same key blocks in the same order and both have rows, so dense q and k
// (every sequence the same lengths), no mask, no paging, no seqused_k, every sequence taken, and
// an even number of query tiles (so no pair has a tile past the rows).
template <class Cfg>
bool multicast_ok(const FwdArgs& a) {
  const int m_blocks = (a.max_seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  return kMulticastKV<Cfg::kHeadDim> && !masked(a) && a.cu_seqlens_q == nullptr &&
         a.cu_seqlens_k == nullptr && a.seqused_k == nullptr && a.block_table == nullptr &&
         a.only == 0 && m_blocks % 2 == 0;
}

// A launch of `grid` CTAs of `threads` in clusters of two along x; `attr` holds the cluster
// attribute the config points to.
inline cudaLaunchConfig_t pair_cluster_config(int grid, int threads, int smem, cudaStream_t stream,
                                              cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr = cudaLaunchAttribute{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 2;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cfg;
}

// How many clusters of `kernel` (one CTA per multiprocessor, two per cluster) the device holds at
// once: a cluster's CTAs share a GPC, so a GPC with an odd number of free multiprocessors leaves
// one idle. The persistent grid launches no more (a cluster beyond them would wait for a whole
// wave). Asked once per kernel and device.
template <class Kernel>
int resident_clusters(Kernel kernel, int threads, int smem) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice (sm90 forward)");
  static std::atomic<int> cached[64] = {};
  std::atomic<int>* slot = device >= 0 && device < 64 ? &cached[device] : nullptr;
  if (slot != nullptr && slot->load() > 0) return slot->load();
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pair_cluster_config(2, threads, smem, nullptr, attr);
  int clusters = 0;
  check_cuda(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg),
             "cudaOccupancyMaxActiveClusters (sm90 forward)");
  if (clusters < 1)
    throw Error(ErrorKind::kCuda, "",
                "the sm90 forward's clusters of two CTAs do not fit the device");
  if (slot != nullptr) slot->store(clusters);
  return clusters;
}

// Launches the kernel of tile Cfg on `a` with `p`'s outputs and scalars (fwd_params): the maps,
// the tile order and the grid are set here.
template <class Cfg, bool kBf16, bool kMasked>
void launch(FwdParams& p, const FwdArgs& a) {
  constexpr int kHeadDim = Cfg::kHeadDim;
  // Varlen tensors are one sequence of all their rows for TMA (the kernel offsets each tile by
  // its sequence's first row). No keys: the maps are never read (every tile has zero key
  // blocks), but TMA refuses a dimension of 0; describe one row.
  const bool varlen_q = a.cu_seqlens_q != nullptr, varlen_k = a.cu_seqlens_k != nullptr;
  const int q_seqs = varlen_q ? 1 : a.batch, kv_seqs = varlen_k ? 1 : a.batch;
  const int q_rows = std::max(a.seqlen_q, 1), kv_rows = std::max(a.seqlen_k, 1);
  p.tma_q = make_map(a.q, a.dtype, q_seqs, q_rows, a.h_q, kHeadDim, a.q_batch_stride,
                     a.q_row_stride, a.q_head_stride, Cfg::kBlockM, "q", Cfg::kRowBytes);
  if constexpr (Cfg::kFp8) {
    // K as the 16-bit tiles read it; V from its transpose (fp8_vt.h, run_fwd_fp8_tiles).
    if (a.block_table != nullptr)
      throw Error(ErrorKind::kInternal, "block_table",
                  "the sm90 fp8 tiles were launched on paged K/V (the plan refuses it)");
    p.tma_k = make_map(a.k, a.dtype, kv_seqs, kv_rows, a.h_kv, kHeadDim, a.k_batch_stride,
                       a.k_row_stride, a.k_head_stride, Cfg::kBlockN, "k", Cfg::kRowBytes);
    p.tma_v = make_vt_map(a.vt, a.batch, a.h_kv, kHeadDim, a.vt_keys, Cfg::kVtBoxKeys);
    p.zero_v_tail = 0;  // V^T holds zeros past each sequence's keys
  } else if (a.block_table != nullptr) {
    // Paged: boxes of page_rows rows, each within one page (fwd_params.h).
    p.page_rows = std::gcd(Cfg::kBlockN, a.page_size);
    if (p.page_rows % 8 != 0)
      throw Error(ErrorKind::kUnsupported, "block_table",
                  str_cat("the sm90 kernel's paged K/V needs a page size that is a multiple of 8, "
                          "got ",
                          a.page_size));
    p.tma_k = make_map(a.k, a.dtype, a.num_pages, a.page_size, a.h_kv, kHeadDim, a.k_page_stride,
                       a.k_row_stride, a.k_head_stride, p.page_rows, "k");
    p.tma_v = make_map(a.v, a.dtype, a.num_pages, a.page_size, a.h_kv, kHeadDim, a.v_page_stride,
                       a.v_row_stride, a.v_head_stride, p.page_rows, "v");
    p.kv_cp_async = Cfg::kPagedCpAsync && p.page_rows < Cfg::kBlockN;
    if (p.kv_cp_async) {
      p.k_pool = a.k;
      p.v_pool = a.v;
      p.k_page_stride = a.k_page_stride, p.k_row_stride = a.k_row_stride;
      p.k_head_stride = a.k_head_stride;
      p.v_page_stride = a.v_page_stride, p.v_row_stride = a.v_row_stride;
      p.v_head_stride = a.v_head_stride;
      p.page_shift = (a.page_size & (a.page_size - 1)) == 0
                         ? std::countr_zero(static_cast<unsigned>(a.page_size))
                         : -1;
      p.zero_v_tail = 0;  // the copies zero-fill every row past a sequence's keys
    }
  } else {
    p.tma_k = make_map(a.k, a.dtype, kv_seqs, kv_rows, a.h_kv, kHeadDim, a.k_batch_stride,
                       a.k_row_stride, a.k_head_stride, Cfg::kBlockN, "k");
    p.tma_v = make_map(a.v, a.dtype, kv_seqs, kv_rows, a.h_kv, kHeadDim, a.v_batch_stride,
                       a.v_row_stride, a.v_head_stride, Cfg::kBlockN, "v");
  }
  auto kernel = fwd_kernel<Cfg, kBf16, kMasked>;
  constexpr int smem = smem_bytes<Cfg>();
  static_assert(smem <= kMaxSmemPerBlock,
                "the tile's shared memory exceeds what one block may have");
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "cudaFuncSetAttribute (sm90 forward shared memory)");
  if constexpr (Cfg::kTmaStoreO) {
    // One consumer warpgroup's 64 rows per box, out described as q is (varlen: one sequence of
    // all rows, whose boxes the kernel keeps inside their sequence: tma_box_in_sequence), in
    // its own dtype: bfloat16 behind e4m3 inputs (the first fp8 run mapped it as q's bytes).
    const DType out_dtype = Cfg::kFp8 ? DType::kBFloat16 : a.dtype;
    p.tma_o = make_map(a.out, out_dtype, q_seqs, q_rows, a.h_q, kHeadDim, a.o_batch_stride,
                       a.o_row_stride, a.o_head_stride, 64, "out");
  }
  // The tiles in the heaviest-first order of tile_order.h (L2-sized sections of heads).
  // Varlen: as many query tiles per sequence as the longest has; a shorter one's extra tiles
  // end at once. Multicast: the order's entries are pairs of query tiles, one per cluster.
  constexpr int kCluster = Cfg::kCluster;
  static_assert(kCluster == 1 || kCluster == 2, "one CTA, or pairs (pair_cluster_config)");
  const int clusters =
      kCluster == 1 ? std::max(a.sms, 1) : resident_clusters(kernel, Cfg::kThreads, smem);
  if (kCluster > 1 && !multicast_ok<Cfg>(a))
    throw Error(ErrorKind::kInternal, "q",
                "the sm90 multicast tile was launched on a call it cannot take");
  const int m_blocks = (a.max_seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM / kCluster;
  const int64_t units = int64_t{a.h_q} * a.seqs;
  // Heads of a GQA group are adjacent units and share their K/V.
  const int64_t kv_bytes = int64_t{a.max_seqlen_k} * kHeadDim * 4 / (a.h_q / a.h_kv);
  p.order = kernel::heaviest_first(m_blocks, a.h_q, units, clusters, kv_bytes, a.l2_bytes);
  if (p.order.sections == 0)
    throw Error(ErrorKind::kUnsupported, "q",
                str_cat("the sm90 kernel's grid of ", units * m_blocks,
                        " tiles does not fit 32-bit tile indices"));
  p.num_tiles = static_cast<int32_t>(units * m_blocks);
  // One CTA per multiprocessor (the shared memory allows one), each walking its tiles, so that
  // a tile's first loads overlap the previous tile's last GEMMs and epilogue. Equal tiles (no
  // mask) go by a fixed stride; causal tiles differ in cost by up to the number of query tiles,
  // and a fixed stride over the sorted list leaves some CTAs only heavy ones (run 32: d256
  // causal 16k 694 -> 458 TFLOP/s), so masked tiles take the next tile from a counter (the plan
  // gives every masked launch one, from the workspace or the run's scratch).
  if (kMasked && a.tile_counter == nullptr)
    throw Error(ErrorKind::kInternal, "workspace",
                "a masked sm90 launch was given no tile counter");
  p.tile_counter = kMasked ? a.tile_counter : nullptr;
  const int grid = static_cast<int>(std::min<int64_t>(p.num_tiles, clusters)) * kCluster;
  if (p.tile_counter != nullptr)
    check_cuda(cudaMemsetAsync(p.tile_counter, 0, sizeof(int), a.stream),
               "cudaMemsetAsync (sm90 tile counter)");
  if constexpr (kCluster == 1) {
    kernel<<<grid, Cfg::kThreads, smem, a.stream>>>(p);
    check_cuda(cudaGetLastError(), "sm90 forward kernel launch");
  } else {
    static_assert(!kMasked, "multicast tiles are unmasked (multicast_ok)");
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = pair_cluster_config(grid, Cfg::kThreads, smem, a.stream, attr);
    check_cuda(cudaLaunchKernelEx(&cfg, kernel, p), "sm90 forward kernel launch (clusters of 2)");
  }
}

// The kernel parameters that do not depend on the tile: outputs, lengths, scales.
inline FwdParams fwd_params(const FwdArgs& a) {
  FwdParams p{};
  p.out = a.out;
  p.lse = a.lse;
  p.o_batch_stride = a.o_batch_stride;
  p.o_row_stride = a.o_row_stride;
  p.o_head_stride = a.o_head_stride;
  p.lse_batch_stride = a.lse_batch_stride;
  p.lse_row_stride = a.lse_row_stride;
  p.lse_head_stride = a.lse_head_stride;
  p.cu_seqlens_q = a.cu_seqlens_q;
  p.cu_seqlens_k = a.cu_seqlens_k;
  p.seqused_k = a.seqused_k;
  p.block_table = a.block_table;
  p.block_table_stride = a.block_table_stride;
  p.page_size = a.page_size;
  p.seqlen_q = a.seqlen_q;
  p.seqlen_k = a.seqlen_k;
  p.seq_begin = a.seq_begin;
  p.only = a.only;
  // Rows past a sequence's keys are real memory (another sequence's, or unused cache) only with
  // varlen keys or seqused_k (paged K/V has it); dense keys end at the map's edge, where TMA
  // fills zeros.
  p.zero_v_tail = a.cu_seqlens_k != nullptr || a.seqused_k != nullptr;
  p.window_left = a.window_left;
  p.window_right = a.window_right;
  p.h_ratio = a.h_q / a.h_kv;
  p.scale = a.scale;
  p.scale_log2 = static_cast<float>(a.scale * M_LOG2E);
  p.q_descale = a.q_descale;
  p.k_descale = a.k_descale;
  p.v_descale = a.v_descale;
  p.q_descale_batch_stride = a.q_descale_batch_stride;
  p.q_descale_head_stride = a.q_descale_head_stride;
  p.k_descale_batch_stride = a.k_descale_batch_stride;
  p.k_descale_head_stride = a.k_descale_head_stride;
  p.v_descale_batch_stride = a.v_descale_batch_stride;
  p.v_descale_head_stride = a.v_descale_head_stride;
  return p;
}

// The forward with tile CfgDense for unmasked calls and CfgMasked for causal or windowed ones
// (with a.epilogue, as their EpilogueTile: session 18's tile boundary).
template <class CfgDense, class CfgMasked>
void run_fwd_tiles(const FwdArgs& a) {
  static_assert(CfgDense::kHeadDim == CfgMasked::kHeadDim, "one head dim");
  if (a.seqs == 0 || a.max_seqlen_q == 0 || a.h_q == 0) return;
  FwdParams p = fwd_params(a);
  const bool bf16 = a.dtype == DType::kBFloat16, mask = masked(a);
  if constexpr (kMulticastKV<CfgDense::kHeadDim>) {
    if (multicast_enabled() && multicast_ok<CfgDense>(a)) {
      if (bf16)
        launch<Multicast<CfgDense>, true, false>(p, a);
      else
        launch<Multicast<CfgDense>, false, false>(p, a);
      return;
    }
  }
  if (bf16 && mask) launch<CfgMasked, true, true>(p, a);
  if (bf16 && !mask) launch<CfgDense, true, false>(p, a);
  if (!bf16 && mask) launch<CfgMasked, false, true>(p, a);
  if (!bf16 && !mask) launch<CfgDense, false, false>(p, a);
}

// V^T of the whole call (every sequence, fp8_vt.h) into a.vt, on a.stream before the kernel.
template <int kHeadDim>
void transpose_v(const FwdArgs& a, int block_keys) {
  if (a.vt_keys == 0 || a.batch == 0) return;
  VtArgs t{};
  t.v = static_cast<const uint8_t*>(a.v);
  t.batch_stride = a.v_batch_stride;  // 0 for varlen keys (their rows count from cu_seqlens_k)
  t.row_stride = a.v_row_stride;
  t.head_stride = a.v_head_stride;
  t.cu_seqlens_k = a.cu_seqlens_k;
  t.seqused_k = a.seqused_k;
  t.seqlen_k = a.seqlen_k;
  t.vt = static_cast<uint8_t*>(a.vt);
  t.h_kv = a.h_kv;
  t.keys = a.vt_keys;
  t.block_keys = block_keys;
  launch_fp8_transpose_v<kHeadDim>(t, a.batch, a.stream);
  check_cuda(cudaGetLastError(), "sm90 fp8 V^T pre-pass launch");
}

// The tile as it is (the softmax of a tile without Exp2Fma).
template <class Cfg>
using AsIs = Cfg;

// The fp8 tile Cfg on the call: V^T's pre-pass, then the kernel, masked or not.
template <class Cfg>
void launch_fp8(FwdParams& p, const FwdArgs& a) {
  transpose_v<Cfg::kHeadDim>(a, Cfg::kBlockN);
  if (masked(a))
    launch<Cfg, true, true>(p, a);
  else
    launch<Cfg, true, false>(p, a);
}

// The float8_e4m3fn forward (tile_config.h Fp8Tile), each tile as Softmax<tile> (AsIs, or Exp2Fma:
// run_fwd_fp8_exp2_fma_hdim), with a.epilogue as its EpilogueTile (kEpilogueTiles: the AsIs
// tiles only; the plan leaves the Exp2Fma ones on the register stores): V^T's pre-pass, then
// the kernel, masked or not. No multicast and no paged K/V (the plan refuses paging; multicast
// is not measured yet).
template <int kHeadDim, template <class> class Softmax, bool kEpilogueTiles>
void run_fwd_fp8_tile_set(const FwdArgs& a) {
  if (a.seqs == 0 || a.max_seqlen_q == 0 || a.h_q == 0) return;
  if (a.vt == nullptr || a.vt_keys < fp8_vt_keys(a.max_seqlen_k))
    throw Error(ErrorKind::kInternal, "workspace",
                "the sm90 fp8 forward ran without V^T's workspace (the plan sizes it)");
  if (a.epilogue && !kEpilogueTiles)
    throw Error(ErrorKind::kInternal, "FLASHSERVE_SM90_EPILOGUE",
                "the sm90 fp8 Exp2Fma tiles have no overlapped epilogue (the plan says so)");
  FwdParams p = fwd_params(a);
  const auto run = [&](auto tile) {
    using Tile = Softmax<typename decltype(tile)::type>;
    if constexpr (kEpilogueTiles) {
      if (a.epilogue) return launch_fp8<EpilogueTile<Tile>>(p, a);
    }
    launch_fp8<Tile>(p, a);
  };
  if constexpr (kHeadDim == 128) {
    if (fp8_block_n(kHeadDim, a.fp8_block_n) == 192) return run(Fp8Tile<kHeadDim, 192>{});
  }
  run(Fp8Tile<kHeadDim, 128>{});
}

// The fp8 forward at one head dim; with a.exp2_fma (the plan's FLASHSERVE_SM90_EXP2_FMA) the
// Exp2Fma tiles, defined and instantiated in fwd_fp8_exp2_fma.cu, so that
// fwd_fp8_hdim{64,128,256}.cu's kernels stay as they were.
template <int kHeadDim>
void run_fwd_fp8_hdim(const FwdArgs& a) {
  if constexpr (fp8_exp2_fma_head_dim(kHeadDim)) {
    if (a.exp2_fma) return run_fwd_fp8_exp2_fma_hdim<kHeadDim>(a);
  }
  run_fwd_fp8_tile_set<kHeadDim, AsIs, true>(a);
}

// The tiles of tile_config.h, each as Softmax<tile> (AsIs, or Exp2Fma: run_fwd_exp2_fma_hdim):
// ShortTile's up to kShortKeys keys, DefaultTile's beyond; with a.epilogue (the plan's
// FLASHSERVE_SM90_EPILOGUE) each as its EpilogueTile.
template <int kHeadDim, template <class> class Softmax>
void run_fwd_tile_set(const FwdArgs& a) {
  using ShortDense = Softmax<typename ShortTile<kHeadDim, false>::type>;
  using ShortMasked = Softmax<typename ShortTile<kHeadDim, true>::type>;
  using Dense = Softmax<typename DefaultTile<kHeadDim, false>::type>;
  using Masked = Softmax<typename DefaultTile<kHeadDim, true>::type>;
  if (short_keys(a.max_seqlen_k)) {
    if (a.epilogue)
      run_fwd_tiles<EpilogueTile<ShortDense>, EpilogueTile<ShortMasked>>(a);
    else
      run_fwd_tiles<ShortDense, ShortMasked>(a);
  } else {
    if (a.epilogue)
      run_fwd_tiles<EpilogueTile<Dense>, EpilogueTile<Masked>>(a);
    else
      run_fwd_tiles<Dense, Masked>(a);
  }
}

// The 16-bit forward at one head dim; with a.exp2_fma (the plan's FLASHSERVE_SM90_EXP2_FMA, d64
// only) the Exp2Fma tiles, defined and instantiated in a translation unit of their own
// (fwd_hdim64_exp2_fma.cu), so that fwd_hdim64.cu's kernels stay as they were and the two
// compile side by side.
template <int kHeadDim>
void run_fwd_hdim(const FwdArgs& a) {
  if constexpr (exp2_fma_head_dim(kHeadDim)) {
    if (a.exp2_fma) return run_fwd_exp2_fma_hdim<kHeadDim>(a);
  }
  run_fwd_tile_set<kHeadDim, AsIs>(a);
}

}  // namespace flashserve::attention::sm90
