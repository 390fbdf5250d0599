// The sm80 forward kernel (FlashAttention-2 partitioning): one thread block per query tile
// (fwd_tile.h); its warps split the tile's rows, so the key loop needs no cross-warp reduction.
// K/V tiles stream through a `kStages`-deep cp.async ring with one __syncthreads per key block, or
// (kStages == 1) through single K and V buffers with two. With PV pairs (tile_config.h) two warps
// also swap their probabilities between those two barriers, so that each V fragment read from
// shared memory feeds two m16 slices: half the V ldmatrix (and their waits) of one-slice tiles.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cluster_combine.h"
#include "common/pdl.cuh"
#include "epilogue.h"
#include "fwd_params.h"
#include "fwd_tile.h"
#include "ptx.h"
#include "score_mod.h"
#include "smem_tile.h"
#include "softmax.h"
#include "tile_config.h"
#include "warp_gemm.h"

namespace flashserve::attention::sm80 {

// The read-ahead block-table entries of paged K and V (smem_tile.h), after Cfg::kSmemBytes: the
// 16-bit tiles' count, which e4m3 tiles share (the loader asserts it).
template <class Cfg>
using PagedShape = PagedTileShape<Cfg::kBlockN, Cfg::kHeadDim / 8, Cfg::kThreads>;
template <class Cfg, bool kPaged>
inline constexpr int kFwdSmemBytes = Cfg::kSmemBytes +
                                     (kPaged ? 2 * PagedShape<Cfg>::kEntries * int(sizeof(int32_t))
                                             : 0);

// Shared memory of a block: Q [kBlockM, D], then kStages K tiles and kStages V tiles [kBlockN, D],
// then (PV pairs) each warp's exchange words (tile_config.h's pv_exchange_bytes), then (paged) the
// K and V streams' read-ahead table entries.
template <class Cfg, class Elem>
struct FwdSmem {
  Elem* q;
  Elem* k;
  Elem* v;
  uint4* exchange;
  int32_t* k_pages;
  int32_t* v_pages;
  __device__ __forceinline__ explicit FwdSmem(unsigned char* base)
      : q(reinterpret_cast<Elem*>(base)),
        k(q + Cfg::kBlockM * Cfg::kHeadDim),
        v(k + Cfg::kStages * Cfg::kBlockN * Cfg::kHeadDim),
        exchange(reinterpret_cast<uint4*>(v + Cfg::kStages * Cfg::kBlockN * Cfg::kHeadDim)),
        k_pages(reinterpret_cast<int32_t*>(base + Cfg::kSmemBytes)),
        v_pages(k_pages + PagedShape<Cfg>::kEntries) {}
  // PV pairs: lane 0's 16-byte word `word` of warp `warp`'s exchange; lane i's is i words on.
  // Words 0 .. kPvSteps - 1 hold the packed probabilities, kPvSteps the step's corrections,
  // kPvSteps + 1 the final normalisers.
  __device__ __forceinline__ uint4* exchange_word(int warp, int word) const {
    return exchange + (warp * (Cfg::kPvSteps + 2) + word) * 32;
  }
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
  // [slice][n8 column tile]: the warp's own slices, or (PV pairs) its own and its partner's over
  // its half of the head dim.
  float o[Cfg::kOSlices][Cfg::kODTiles][4];
  OnlineSoftmax<Cfg::kMTiles, Cfg::kSkipUnchangedRescale> softmax;
  __device__ __forceinline__ WarpState() {
#pragma unroll
    for (int mi = 0; mi < Cfg::kOSlices; ++mi)
#pragma unroll
      for (int dt = 0; dt < Cfg::kODTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mi][dt][e] = 0.0f;
  }
};

// The softmax scale of a tile, as the key loop (log2 units) and the LSE (natural units) use it:
// the call's own, read from the parameters where it is used (ParamScales; the 16-bit kernels'
// code depends on that: docs/fp8.md), or (fp8 KV cache, KvScales) the call's times the tile's
// KV head's k descale, which turns scale x q.code(k) into scale x q.k.
struct ParamScales {
  __device__ __forceinline__ float log2(const FwdParams& p) const { return p.scale_log2; }
  __device__ __forceinline__ float natural(const FwdParams& p) const { return p.scale; }
};
struct KvScales {
  float scale_log2, scale;
  float v;  // the v descale, which multiplies O
  __device__ __forceinline__ float log2(const FwdParams&) const { return scale_log2; }
  __device__ __forceinline__ float natural(const FwdParams&) const { return scale; }
};

// The key loop of tile `t`, right to left: the boundary blocks of the diagonal / kv_len first,
// then the fast path, then the left edge of a sliding window. On entry the first kS - 1 blocks
// (kS >= 2) or K of the first block (kS == 1) have been issued and committed, and Q is in flight
// or in place. kS >= 2: each step's barrier retires the previous block's ring slot, which then
// receives the block kS - 1 ahead. `mod`: the score modifiers (score_mod.h), or NoScoreMod.
template <class Cfg, class Elem, class Tile, class Mod, class Scales>
__device__ __forceinline__ void attend(const FwdParams& p, const Tile& t,
                                       const FwdSmem<Cfg, Elem>& sm, const Elem* sq_warp,
                                       WarpState<Cfg>& ws, int row0, int tid, const Mod& mod,
                                       const Scales& sc) {
  constexpr int D = Cfg::kHeadDim, kBN = Cfg::kBlockN, kS = Cfg::kStages;
  constexpr int kMT = Cfg::kMTiles, kNT = Cfg::kNTiles, kODT = Cfg::kODTiles;
  constexpr int kThreads = Cfg::kThreads, kPvSteps = Cfg::kPvSteps;
  const int lane = tid & 31, warp = tid >> 5;
  const int offset = t.seq.kv_len - t.seq.q_len;
  int buf = 0;
  auto step = [&](int n, auto masked) {
    float s[kMT][kNT][4];
    if constexpr (kS == 1) {
      cp_async_wait<0>();  // K(n)
      t.template widen_kv<kThreads>(sm.k_slot(0));
      __syncthreads();  // ... for every thread; and every warp is done with V(n + 1)
      t.template load_v<kThreads>(p, n, sm.v_slot(0), sm.v_pages, tid);
      cp_async_commit();
      gemm_qk<D, kMT, kNT, Cfg::kPipelineFrags>(s, sq_warp, sm.k_slot(0), lane, t.qk_steps());
    } else {
      cp_async_wait<kS - 2>();  // block n
      t.template widen_kv<kThreads>(sm.k_slot(buf));
      t.template widen_kv<kThreads>(sm.v_slot(buf));
      __syncthreads();
      const int ahead = n - (kS - 1);
      const int slot = buf == 0 ? kS - 1 : buf - 1;
      if (ahead >= t.blocks.n_min) {
        t.template load_k<kThreads>(p, ahead, sm.k_slot(slot), sm.k_pages, tid);
        t.template load_v<kThreads>(p, ahead, sm.v_slot(slot), sm.v_pages, tid);
      }
      cp_async_commit();
      gemm_qk<D, kMT, kNT, Cfg::kPipelineFrags>(s, sq_warp, sm.k_slot(buf), lane, t.qk_steps());
    }
    // Modifiers before the mask, on every block (the fast path's too): a masked score stays -inf
    // whatever the modifier would make of it.
    if constexpr (Mod::kActive) {
      if constexpr (Tile::kPack)  // packed rows: the sequence's one query, at kv_len - 1
        mod.apply(s, t.seq.kv_len - 1, n * kBN + 2 * (lane & 3));
      else
        mod.apply(s, row0 + offset, n * kBN + 2 * (lane & 3));
    }
    if constexpr (decltype(masked)::value) {
      if constexpr (Tile::kPack)  // every row is the sequence's query, at key position kv_len - 1
        mask_scores<kMT, kNT, true, true>(s, 0, n * kBN + 2 * (lane & 3), t.seq.kv_len,
                                          t.seq.kv_len - 1, p.window_left, -1);
      else
        mask_scores<kMT, kNT, Tile::kMasked>(s, row0, n * kBN + 2 * (lane & 3), t.seq.kv_len,
                                             offset, p.window_left, p.window_right);
    }
    // kS == 1: wait for V(n); the barrier also retires K(n), whose buffer takes K(n - 1).
    auto retire_k = [&] {
      cp_async_wait<0>();
      t.template widen_kv<kThreads>(sm.v_slot(0));
      __syncthreads();
      if (n - 1 >= t.blocks.n_min)
        t.template load_k<kThreads>(p, n - 1, sm.k_slot(0), sm.k_pages, tid);
      cp_async_commit();
    };
    if constexpr (Cfg::kPvPairs) {
      static_assert(!Cfg::kPadded, "PV pairs split the head dim: no padded bound here");
      // The warp's own slice: probabilities, packed, and offered to the partner together with
      // the step's corrections before the barrier; after it, the partner's are there.
      float correction[1][2];
      const bool rescale_own =
          ws.softmax.must_rescale(ws.softmax.probabilities(s, sc.log2(p), correction));
      uint32_t own[kPvSteps][4];
      uint4* mine = sm.exchange_word(warp, 0) + lane;
#pragma unroll
      for (int ks = 0; ks < kPvSteps; ++ks) {
        pack_p<Elem>(s[0], ks, own[ks]);
        mine[ks * 32] = make_uint4(own[ks][0], own[ks][1], own[ks][2], own[ks][3]);
      }
      mine[kPvSteps * 32] = make_uint4(__float_as_uint(correction[0][0]),
                                       __float_as_uint(correction[0][1]), rescale_own, 0);
      retire_k();
      const uint4* theirs = sm.exchange_word(warp ^ 1, 0) + lane;
      const uint4 their_correction = theirs[kPvSteps * 32];
      if (rescale_own) scale_rows(ws.o[0], correction[0][0], correction[0][1]);
      if (their_correction.z != 0)
        scale_rows(ws.o[1], __uint_as_float(their_correction.x),
                   __uint_as_float(their_correction.y));
      auto a_frags = [&](int ks, uint32_t(&a)[2][4]) {
        const uint4 w = theirs[ks * 32];
#pragma unroll
        for (int e = 0; e < 4; ++e) a[0][e] = own[ks][e];
        a[1][0] = w.x;
        a[1][1] = w.y;
        a[1][2] = w.z;
        a[1][3] = w.w;
      };
      gemm_pv<D, 2, kPvSteps, kODT, Cfg::kPipelineFrags>(ws.o, a_frags,
                                                         sm.v_slot(0) + (warp & 1) * (D / 2), lane);
    } else {
      if constexpr (kS == 1) retire_k();
      ws.softmax.update(s, ws.o, sc.log2(p));
      auto a_frags = [&](int ks, uint32_t(&a)[kMT][4]) {
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) pack_p<Elem>(s[mi], ks, a[mi]);
      };
      gemm_pv<D, kMT, kPvSteps, kODT, Cfg::kPipelineFrags>(ws.o, a_frags, sm.v_slot(buf), lane,
                                                           t.v_pairs());
    }
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

// Writes one normalised m16 slice of O, tile rows row .. row + 15, columns col0 onwards: to out
// (and its LSE when write_lse), or (split-KV, but for a length-aware sequence's only item) to the
// partials.
template <class Cfg, class Elem, class Tile>
__device__ __forceinline__ void write_slice(const FwdParams& p, const Tile& t,
                                            const float (&o)[Cfg::kODTiles][4],
                                            const float (&lse)[2], bool write_lse, Elem* stage,
                                            int row, int col0, int lane) {
  constexpr int D = Cfg::kHeadDim;
  const int rows_valid = t.seq.q_len - t.m0 - row;
  if constexpr (Tile::kWritesPartials) {
    if (!t.writes_out()) {
      const int64_t slot = t.partial_slot(p, row), step = t.partial_step(p);
      store_partial<Cfg::kODTiles>(o, lse, p.o_partial + slot * D + col0, step * D,
                                   write_lse ? p.lse_partial + slot : nullptr, step, rows_valid,
                                   lane);
      return;
    }
  }
  store_slice<D, Cfg::kODTiles>(o, lse, stage, t.out_row(p, row) + col0, col0 / 8, t.out_step(p),
                                write_lse ? t.lse_row(p, row) : nullptr, t.lse_step(p), rows_valid,
                                lane, t.v_chunks());
}

// Normalises the warp's rows and writes them. `stage` is the warp's own rows of the Q tile (dead
// once its last QK^T has run; 8 are used). PV pairs: the partner's normalisers come through the
// exchange, and each warp writes both slices over its half of the head dim (the LSE of its own).
template <class Cfg, class Elem, class Tile, class Scales>
__device__ __forceinline__ void write_rows(const FwdParams& p, const Tile& t, WarpState<Cfg>& ws,
                                           const FwdSmem<Cfg, Elem>& sm, Elem* stage, int warp,
                                           int lane, const Scales& sc) {
  constexpr int kMT = Cfg::kMTiles;
  const int warp_row = warp * Cfg::kWarpRows;
  float lse[kMT][2];
  if constexpr (Cfg::kPvPairs) {
    float inv[1][2];
    ws.softmax.finish_rows(sc.natural(p), inv, lse);
    uint4* mine = sm.exchange_word(warp, Cfg::kPvSteps + 1) + lane;
    *mine = make_uint4(__float_as_uint(inv[0][0]), __float_as_uint(inv[0][1]), 0, 0);
    __syncthreads();
    const uint4 theirs = *(sm.exchange_word(warp ^ 1, Cfg::kPvSteps + 1) + lane);
    scale_rows(ws.o[0], inv[0][0], inv[0][1]);
    scale_rows(ws.o[1], __uint_as_float(theirs.x), __uint_as_float(theirs.y));
    const int col0 = (warp & 1) * (Cfg::kHeadDim / 2);
    write_slice<Cfg>(p, t, ws.o[0], lse[0], true, stage, warp_row, col0, lane);
    write_slice<Cfg>(p, t, ws.o[1], lse[0], false, stage, (warp ^ 1) * Cfg::kWarpRows, col0, lane);
  } else {
    ws.softmax.finish(ws.o, sc.natural(p), lse);
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi)
      write_slice<Cfg>(p, t, ws.o[mi], lse[mi], true, stage, warp_row + 16 * mi, 0, lane);
  }
}

// The kernel body, with or without score modifiers (`ModParams`: NoScoreMod, or the modifier
// kernels' ScoreModParams); kKvFp8: K and V are e4m3 codes (p is then FwdKvFp8Params), staged
// by cp.async and widened to Elem in place after each block's wait (attend), the k descale
// folded into the softmax scale and the v descale into O (one KV head per tile, so each is one
// number per tile). kClusterCombine: split decode tiles whose cluster merges the splits
// (cluster_combine.h) instead of writing partials.
template <class Cfg, class Elem, bool kHasMask, bool kPaged, bool kSplit, class ModParams,
          bool kKvFp8 = false, bool kClusterCombine = false>
__device__ __forceinline__ void fwd_body(const FwdParams& p, const ModParams& mod_params) {
  static_assert(!kClusterCombine || (kSplit && Cfg::kPackGqa && !kKvFp8));
  // Launched programmatically (AttentionRunOptions::programmatic_launch), the kernel may start
  // while the one before it (q and the cache's new rows) still runs: nothing is read before the
  // wait. The next kernel's CTAs may be scheduled from here on; they wait for this grid in turn.
  pdl::wait_for_producer();
  pdl::release_dependents();
  extern __shared__ __align__(128) unsigned char smem[];
  using KvElem = std::conditional_t<kKvFp8, __nv_fp8_e4m3, Elem>;
  using Tile = FwdTile<Cfg, Elem, kHasMask, kPaged, kSplit, KvElem>;
  constexpr int kS = Cfg::kStages, kThreads = Cfg::kThreads;
  // The table entries a paged load reads were copied in the previous load's commit group, which
  // the step's wait retires only when at most one group runs ahead (kStages <= 2).
  static_assert(!kPaged || kS <= 2, "paged read-ahead needs the previous group retired");
  const FwdSmem<Cfg, Elem> sm(smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_row = warp * Cfg::kWarpRows;
  // Masked (causal / window) tiles differ in cost: their grid is 1-D, heaviest first by sections
  // of heads (attention/kernel/tile_order.h), unless too large for that (then heaviest first per
  // head).
  TileCoords c{int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
  if constexpr (kHasMask) {
    if (p.order.sections > 0)
      c = tile_of(p.order, blockIdx.x);
    else
      c.m_block = gridDim.x - 1 - blockIdx.x;
  }
  const Tile t(p, c.m_block, c.head, c.z);
  if (!t.valid()) return;

  WarpState<Cfg> ws;
  Elem* sq_warp = sm.q + warp_row * Cfg::kHeadDim;
  using Scales = std::conditional_t<kKvFp8, KvScales, ParamScales>;
  Scales sc{};
  if constexpr (kKvFp8) {
    const auto& f = static_cast<const FwdKvFp8Params&>(p);
    const int hk = t.kv_head(p);
    const float k_descale =
        f.k_descale ? f.k_descale[t.seq.b * f.k_descale_batch_stride + hk * f.k_descale_head_stride]
                    : 1.0f;
    const float v_descale =
        f.v_descale ? f.v_descale[t.seq.b * f.v_descale_batch_stride + hk * f.v_descale_head_stride]
                    : 1.0f;
    sc = KvScales{p.scale_log2 * k_descale, p.scale * k_descale, v_descale};
  }
  if (t.has_keys()) {
    // Prologue: Q, then K of the first block (kS == 1: FlashAttention-2's schedule, V loads
    // during QK^T) or the first kS - 1 blocks, one commit group each.
    load_tile_async<Cfg::kBlockM, Cfg::kHeadDim, kThreads>(sm.q, t.q_row(p, 0), t.q_step(p),
                                                           t.seq.q_len - t.m0, tid, t.qk_chunks());
    if constexpr (kS == 1) {
      t.template load_k<kThreads>(p, t.blocks.n_max - 1, sm.k_slot(0), sm.k_pages, tid);
      cp_async_commit();
    } else {
#pragma unroll
      for (int s = 0; s < kS - 1; ++s) {
        if (t.blocks.n_max - 1 - s >= t.blocks.n_min) {
          t.template load_k<kThreads>(p, t.blocks.n_max - 1 - s, sm.k_slot(s), sm.k_pages, tid);
          t.template load_v<kThreads>(p, t.blocks.n_max - 1 - s, sm.v_slot(s), sm.v_pages, tid);
        }
        cp_async_commit();
      }
    }
    const int row0 = t.m0 + warp_row + (lane >> 2);
    if constexpr (std::is_same_v<ModParams, NoScoreMod>) {
      attend(p, t, sm, sq_warp, ws, row0, tid, NoScoreMod{}, sc);
    } else {
      // The slopes of (sequence, query head), read once. Packed tiles' rows are the group's
      // heads; those past the group (rows >= q_len) read none.
      const ScoreModRows<Cfg::kMTiles, Tile::kPack> mod(mod_params, t.seq.b, [&](int mi, int r) {
        if constexpr (!Tile::kPack) return t.head;
        const int row = row0 + mi * 16 + r * 8;
        return row < t.seq.q_len ? t.head * p.h_ratio + row : -1;
      });
      attend(p, t, sm, sq_warp, ws, row0, tid, mod, sc);
    }
  }
  if constexpr (kKvFp8) {
    // O = sum_j P_j code(v_j) x v_descale: the descale is linear, so it is applied once here
    // (split-KV partials too: the combine's weights do not depend on it).
#pragma unroll
    for (int mi = 0; mi < Cfg::kOSlices; ++mi)
#pragma unroll
      for (int dt = 0; dt < Cfg::kODTiles; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) ws.o[mi][dt][e] *= sc.v;
  }
  if constexpr (kClusterCombine)
    combine_in_cluster<Cfg, Elem>(p, t, ws, sm.k, lane, sc);
  else
    write_rows(p, t, ws, sm, sq_warp, warp, lane, sc);
}

template <class Cfg, class Elem, bool kHasMask, bool kPaged, bool kSplit>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    fwd_kernel(const __grid_constant__ FwdParams p) {
  fwd_body<Cfg, Elem, kHasMask, kPaged, kSplit>(p, NoScoreMod{});
}

// Head dims below Cfg::kHeadDim (Cfg a PaddedConfig; FwdPaddedParams holds the call's): q, k and
// v are read only up to their head dims (the rest of each tile zero-filled, so the padded columns
// add 0 to every score and give 0 in O) and out is stored only up to head_dim_v. Split-KV
// partials keep the kernel's head dim (their padded columns 0). A kernel of its own, as the
// modifier kernels below, for the same reason.
template <class Cfg, class Elem, bool kHasMask, bool kPaged, bool kSplit>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    fwd_kernel_padded(const __grid_constant__ FwdPaddedParams p) {
  static_assert(Cfg::kPadded);
  fwd_body<Cfg, Elem, kHasMask, kPaged, kSplit>(p, NoScoreMod{});
}

// K and V of an fp8 KV cache (e4m3 codes with per-(sequence, KV head) descales; paged): a kernel
// of its own with its own parameters (FwdKvFp8Params), as the padded and modifier kernels.
template <class Cfg, class Elem, bool kHasMask, bool kPaged, bool kSplit>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    fwd_kernel_kv_fp8(const __grid_constant__ FwdKvFp8Params p) {
  static_assert(kPaged && !Cfg::kPadded, "the fp8 KV kernels are paged, at the compiled head dims");
  fwd_body<Cfg, Elem, kHasMask, kPaged, kSplit, NoScoreMod, true>(p, NoScoreMod{});
}

// Decode tiles split p.num_splits ways (2-16) whose splits merge in their thread-block cluster
// (cluster_combine.h; launched with clusters of num_splits CTAs along z, launch_template.h): a
// kernel of its own, so that the split kernel that writes partials keeps its code.
template <class Cfg, class Elem, bool kPaged>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    fwd_kernel_cluster_combine(const __grid_constant__ FwdParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  fwd_body<Cfg, Elem, false, kPaged, true, NoScoreMod, false, true>(p, NoScoreMod{});
#else
  __trap();  // no clusters before sm_90: the plan never launches it there
#endif
}

// With score modifiers: a kernel of its own (not a template flag of fwd_kernel), so that the
// kernels without them keep their names, parameters and code.
template <class Cfg, class Elem, bool kHasMask, bool kPaged, bool kSplit>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    fwd_kernel_score_mod(const __grid_constant__ FwdModParams p) {
  fwd_body<Cfg, Elem, kHasMask, kPaged, kSplit>(p, p.mod);
}

}  // namespace flashserve::attention::sm80
