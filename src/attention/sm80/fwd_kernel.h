// The sm80 forward kernel (FlashAttention-2 partitioning): one thread block per query tile
// (fwd_tile.h); its warps split the tile's rows, so the key loop needs no cross-warp reduction.
// K/V tiles stream through a `kStages`-deep cp.async ring with one __syncthreads per key block, or
// (kStages == 1) through single K and V buffers with two.
#pragma once

#include <cstdint>
#include <type_traits>

#include "epilogue.h"
#include "fwd_params.h"
#include "fwd_tile.h"
#include "ptx.h"
#include "smem_tile.h"
#include "softmax.h"
#include "tile_config.h"
#include "warp_gemm.h"

namespace flashserve::attention::sm80 {

// Shared memory of a block: Q [kBlockM, D], then kStages K tiles and kStages V tiles [kBlockN, D].
template <class Cfg, class Elem>
struct FwdSmem {
  Elem* q;
  Elem* k;
  Elem* v;
  __device__ __forceinline__ explicit FwdSmem(unsigned char* base)
      : q(reinterpret_cast<Elem*>(base)),
        k(q + Cfg::kBlockM * Cfg::kHeadDim),
        v(k + Cfg::kStages * Cfg::kBlockN * Cfg::kHeadDim) {}
  __device__ __forceinline__ Elem* k_slot(int s) const {
    return k + s * Cfg::kBlockN * Cfg::kHeadDim;
  }
  __device__ __forceinline__ Elem* v_slot(int s) const {
    return v + s * Cfg::kBlockN * Cfg::kHeadDim;
  }
};

// What one warp carries through a tile's key loop: its O accumulators and softmax statistics.
template <class Cfg>
struct WarpState {
  float o[Cfg::kMTiles][Cfg::kDTiles][4];
  OnlineSoftmax<Cfg::kMTiles, Cfg::kSkipUnchangedRescale> softmax;
  __device__ __forceinline__ WarpState() {
#pragma unroll
    for (int mi = 0; mi < Cfg::kMTiles; ++mi)
#pragma unroll
      for (int dt = 0; dt < Cfg::kDTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mi][dt][e] = 0.0f;
  }
};

// The key loop of tile `t`, right to left: the boundary blocks of the diagonal / kv_len first,
// then the fast path, then the left edge of a sliding window. On entry the first kS - 1 blocks
// (kS >= 2) or K of the first block (kS == 1) have been issued and committed, and Q is in flight
// or in place. kS >= 2: each step's barrier retires the previous block's ring slot, which then
// receives the block kS - 1 ahead.
template <class Cfg, class Elem, class Tile>
__device__ __forceinline__ void attend(const FwdParams& p, const Tile& t,
                                       const FwdSmem<Cfg, Elem>& sm, const Elem* sq_warp,
                                       WarpState<Cfg>& ws, int row0, int tid) {
  constexpr int D = Cfg::kHeadDim, kBN = Cfg::kBlockN, kS = Cfg::kStages;
  constexpr int kMT = Cfg::kMTiles, kNT = Cfg::kNTiles, kDT = Cfg::kDTiles;
  constexpr int kThreads = Cfg::kThreads;
  const int lane = tid & 31;
  const int offset = t.seq.kv_len - t.seq.q_len;
  int buf = 0;
  auto step = [&](int n, auto masked) {
    float s[kMT][kNT][4];
    if constexpr (kS == 1) {
      cp_async_wait<0>();  // K(n)
      __syncthreads();     // ... for every thread; and every warp is done with V(n + 1)
      t.template load_v<kThreads>(p, n, sm.v_slot(0), tid);
      cp_async_commit();
      gemm_qk<D, kMT, kNT, Cfg::kPipelineFrags>(s, sq_warp, sm.k_slot(0), lane);
    } else {
      cp_async_wait<kS - 2>();
      __syncthreads();
      const int ahead = n - (kS - 1);
      const int slot = buf == 0 ? kS - 1 : buf - 1;
      if (ahead >= t.blocks.n_min) {
        t.template load_k<kThreads>(p, ahead, sm.k_slot(slot), tid);
        t.template load_v<kThreads>(p, ahead, sm.v_slot(slot), tid);
      }
      cp_async_commit();
      gemm_qk<D, kMT, kNT, Cfg::kPipelineFrags>(s, sq_warp, sm.k_slot(buf), lane);
    }
    if constexpr (decltype(masked)::value)
      mask_scores<kMT, kNT, Tile::kMasked>(s, row0, n * kBN + 2 * (lane & 3), t.seq.kv_len, offset,
                                           p.window_left, p.window_right);
    if constexpr (kS == 1) {
      cp_async_wait<0>();  // V(n)
      __syncthreads();     // ... for every thread; and every warp is done reading K(n)
      if (n - 1 >= t.blocks.n_min) t.template load_k<kThreads>(p, n - 1, sm.k_slot(0), tid);
      cp_async_commit();
    }
    ws.softmax.update(s, ws.o, p.scale_log2);
    gemm_pv<D, kMT, kNT, kDT, Cfg::kPipelineFrags>(ws.o, s, sm.v_slot(buf), lane);
    buf = buf == kS - 1 ? 0 : buf + 1;
  };
  for (int n = t.blocks.n_max - 1; n >= t.blocks.n_min; --n) {
    if (t.blocks.needs_mask(n)) {
      step(n, std::true_type{});
    } else {
      step(n, std::false_type{});
    }
  }
}

// Normalises the warp's rows and writes them: to out and lse, or (split-KV) to the partials.
// `stage` is the warp's own rows of the Q tile (dead once its last QK^T has run; 8 are used).
template <class Cfg, class Elem, class Tile>
__device__ __forceinline__ void write_rows(const FwdParams& p, const Tile& t, WarpState<Cfg>& ws,
                                           Elem* stage, int warp_row, int lane) {
  constexpr int kMT = Cfg::kMTiles, kDT = Cfg::kDTiles;
  float lse[kMT][2];
  ws.softmax.finish(ws.o, p.scale, lse);
  const int rows_valid = t.seq.q_len - t.m0 - warp_row;
  if constexpr (Tile::kWritesPartials) {
    const int64_t slot = t.partial_slot(p, warp_row);
    const int64_t step = t.partial_step(p);
    store_partial<kMT, kDT>(ws.o, lse, p.o_partial + slot * Cfg::kHeadDim, step * Cfg::kHeadDim,
                            p.lse_partial + slot, step, rows_valid, lane);
  } else {
    store_output<Cfg::kHeadDim, kMT, kDT>(ws.o, lse, stage, t.out_row(p, warp_row), t.out_step(p),
                                          t.lse_row(p, warp_row), t.lse_step(p), rows_valid, lane);
  }
}

template <class Cfg, class Elem, bool kHasMask, bool kPaged, bool kSplit>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    fwd_kernel(const __grid_constant__ FwdParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  using Tile = FwdTile<Cfg, Elem, kHasMask, kPaged, kSplit>;
  constexpr int kS = Cfg::kStages, kThreads = Cfg::kThreads;
  const FwdSmem<Cfg, Elem> sm(smem);
  const int tid = threadIdx.x, lane = tid & 31, warp_row = (tid >> 5) * Cfg::kWarpRows;
  // Masked (causal / window) tiles differ in cost; launching the heaviest (last) ones first
  // shortens the tail of the grid.
  const int m_block = kHasMask ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const Tile t(p, m_block, blockIdx.y, blockIdx.z);
  if (!t.valid()) return;

  WarpState<Cfg> ws;
  Elem* sq_warp = sm.q + warp_row * Cfg::kHeadDim;
  if (t.has_keys()) {
    // Prologue: Q, then K of the first block (kS == 1: FlashAttention-2's schedule, V loads
    // during QK^T) or the first kS - 1 blocks, one commit group each.
    load_tile_async<Cfg::kBlockM, Cfg::kHeadDim, kThreads>(sm.q, t.q_row(p, 0), t.q_step(p),
                                                           t.seq.q_len - t.m0, tid);
    if constexpr (kS == 1) {
      t.template load_k<kThreads>(p, t.blocks.n_max - 1, sm.k_slot(0), tid);
      cp_async_commit();
    } else {
#pragma unroll
      for (int s = 0; s < kS - 1; ++s) {
        if (t.blocks.n_max - 1 - s >= t.blocks.n_min) {
          t.template load_k<kThreads>(p, t.blocks.n_max - 1 - s, sm.k_slot(s), tid);
          t.template load_v<kThreads>(p, t.blocks.n_max - 1 - s, sm.v_slot(s), tid);
        }
        cp_async_commit();
      }
    }
    attend(p, t, sm, sq_warp, ws, t.m0 + warp_row + (lane >> 2), tid);
  }
  write_rows(p, t, ws, sq_warp, warp_row, lane);
}

}  // namespace flashserve::attention::sm80
