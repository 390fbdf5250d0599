// Split-KV decode without the combine launch: the splits of one (sequence, KV head) run as one
// thread-block cluster (sm_90's clusters, up to 16 CTAs) and merge their partials through
// distributed shared memory. Each split leaves its O (normalised by its own row sums) and its LSE
// in its own shared memory, the cluster synchronises, each CTA reads every split's LSE of the
// tile's rows once and keeps the rows' LSE and per-split weights in its own shared memory, and
// then merges a share of the outputs (row, column pair) from every split's partial, as
// combine_body.inc does from global memory: O = sum_s exp(LSE_s - LSE) O_s, LSE = log sum_s
// exp(LSE_s); a split that saw no key (LSE_s = -inf) weighs 0, a row no split saw gets O = 0 and
// LSE = -inf, a NaN LSE_s makes the row NaN. A second cluster barrier keeps every CTA's shared
// memory alive until the others have read it.
//
// Why (issue 21): a batch-1 decode over 1k keys splits 16 ways (one key block a CTA) and its
// combine is a second launch of ~3-5 us per layer, a dependent launch that the step waits for;
// the partials here never leave the SMs.
//
// Only the decode tiles of the plain kernel (fwd_kernel.h fwd_kernel_cluster_combine: one warp,
// one m16 slice), and only in sm_90 code: the sm_80 compilation traps (the plan never launches it
// where the device has no clusters).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fwd_params.h"
#include "ptx.h"
#include "tile_config.h"

namespace flashserve::attention::sm80 {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Every thread of every CTA of the cluster arrives; shared-memory writes before it are visible to
// the cluster's reads after it. Not the .aligned form: the threads of the warp may arrive from
// divergent paths (the merge's loop).
__device__ __forceinline__ void cluster_barrier() {
  asm volatile(
      "barrier.cluster.arrive.release;\n\t"
      "barrier.cluster.wait.acquire;" ::
          : "memory");
}

// The shared::cluster address of `local` (this CTA's shared memory) in CTA `rank`'s.
__device__ __forceinline__ uint32_t cluster_address(const void* local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))), "r"(rank));
  return remote;
}

__device__ __forceinline__ float load_cluster(uint32_t address) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(address) : "memory");
  return v;
}

__device__ __forceinline__ float2 load_cluster2(uint32_t address) {
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
               : "=f"(v.x), "=f"(v.y)
               : "r"(address)
               : "memory");
  return v;
}
#endif

// The epilogue of a split decode tile in a cluster of p.num_splits CTAs (rank = the tile's split):
// `ws` holds the tile's unnormalised O and its softmax state (fwd_kernel.h WarpState), `ring` the
// K/V ring's shared memory, free once the key loop is done (its last step issued no load).
template <class Cfg, class Elem, class Tile, class State, class Scales>
__device__ __forceinline__ void combine_in_cluster(const FwdParams& p, const Tile& t, State& ws,
                                                   void* ring, int lane, const Scales& sc) {
  static_assert(Cfg::kPackGqa && Cfg::kWarps == 1 && Cfg::kMTiles == 1 && !Cfg::kPvPairs,
                "the decode tiles: one warp, one m16 slice");
  constexpr int D = Cfg::kHeadDim, kRows = Cfg::kBlockM, kMaxSplits = kClusterCombineMaxSplits;
  static_assert(kRows <= 32, "a lane works out one row's weights");
  static_assert((kRows * D + kRows + kRows * (kMaxSplits + 1)) * int(sizeof(float)) <=
                    2 * Cfg::kStages * Cfg::kBlockN * D * int(sizeof(Elem)),
                "a split's partial and the merge weights fit the K/V ring");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kPairs = D / 2;
  float* o_part = static_cast<float*>(ring);     // [kRows][D], this split's O
  float* lse_part = o_part + kRows * D;          // [kRows], this split's LSE (read by the cluster)
  float* weight = lse_part + kRows;              // [kRows][kMaxSplits], exp(LSE_s - LSE) (own use)
  float* row_lse = weight + kRows * kMaxSplits;  // [kRows], the merged LSE (own use)
  float lse[1][2];
  ws.softmax.finish(ws.o, sc.natural(p), lse);
  cp_async_wait<0>();
  __syncwarp();  // the warp's last reads of the ring are done
  const int g = lane >> 2, quad = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
#pragma unroll
    for (int dt = 0; dt < Cfg::kDTiles; ++dt)
      *reinterpret_cast<float2*>(o_part + row * D + dt * 8 + 2 * quad) =
          make_float2(ws.o[0][dt][2 * r], ws.o[0][dt][2 * r + 1]);
    if (quad == 0) lse_part[row] = lse[0][r];
  }
  cluster_barrier();

  const int splits = p.num_splits, rank = t.split;
  const int rows = min(t.seq.q_len - t.m0, kRows);  // the group's heads in this tile
  if (lane < rows) {
    // All splits' LSE of this row in flight at once (the loop unrolls over the cluster's bound).
    float x[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
      x[s] = s < splits ? load_cluster(cluster_address(lse_part + lane, s)) : -INFINITY;
    float m = -INFINITY;
    bool nan = false;  // fmaxf skips NaN: hence the flag
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      nan |= x[s] != x[s];
      m = fmaxf(m, x[s]);
    }
    if (nan) m = NAN;
    float sum = 0.0f;
    if (m != -INFINITY) {
#pragma unroll
      for (int s = 0; s < kMaxSplits; ++s) sum += expf(x[s] - m);  // the bound's -inf add 0
    }
    const bool seen = m != -INFINITY && sum != 0.0f;  // NaN: seen, and lse, weights, O are NaN
    const float l = seen ? m + logf(sum) : -INFINITY;
    row_lse[lane] = l;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
      weight[lane * kMaxSplits + s] = seen ? expf(x[s] - l) : 0.0f;
  }
  __syncwarp();  // the weights are the warp's

  for (int i = rank + splits * lane; i < rows * kPairs; i += splits * 32) {
    const int row = i / kPairs, c = 2 * (i % kPairs);
    const float* w = weight + row * kMaxSplits;
    float2 acc = make_float2(0.0f, 0.0f);
    if (row_lse[row] != -INFINITY) {
      for (int s = 0; s < splits; ++s) {
        const float2 v = load_cluster2(cluster_address(o_part + row * D + c, s));
        acc.x += w[s] * v.x;
        acc.y += w[s] * v.y;
      }
    }
    Elem* out = t.out_row(p, row) + c;
    if constexpr (std::is_same_v<Elem, __nv_bfloat16>)
      *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(acc.x, acc.y);
    else
      *reinterpret_cast<__half2*>(out) = __floats2half2_rn(acc.x, acc.y);
    if (c == 0) {
      if (float* l = t.lse_row(p, row)) *l = row_lse[row];
    }
  }
  cluster_barrier();  // the other CTAs have read this one's partial
#else
  (void)p, (void)t, (void)ws, (void)ring, (void)lane, (void)sc;
  __trap();
#endif
}

}  // namespace flashserve::attention::sm80
