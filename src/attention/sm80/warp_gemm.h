// The two GEMMs of one key block, per warp, on tensor cores (mma.sync m16n8k16):
//   S = Q K^T : A = Q (ldmatrix from shared memory), B = K (ldmatrix: K's rows are B's columns)
//   O += P V  : A = P straight from the S accumulators (the m16n8 accumulators of n-tiles 2k and
//               2k+1 are exactly the A fragment of an m16k16 tile; a PV pair's partner slice
//               comes through shared memory in that layout), B = V (ldmatrix.trans).
// Shared tiles are swizzled (smem_tile.h); all fragment row addresses of one 8x8 matrix share
// row % 8 == lane % 8, so a lane's physical chunk is (logical chunk) ^ (lane % 8).
#pragma once

#include <cstdint>

#include "ptx.h"
#include "smem_tile.h"

namespace flashserve::attention::sm80 {

// acc[mi][2j] += a[mi] . (b[0], b[1]) and acc[mi][2j + 1] += a[mi] . (b[2], b[3]) for every m16
// slice: one ldmatrix x4 of B feeds two n8 tiles of each slice.
template <class Elem, int kMTiles, int kN>
__device__ __forceinline__ void mma_pair(float (&acc)[kMTiles][kN][4], int j,
                                         const uint32_t (&a)[kMTiles][4], const uint32_t (&b)[4]) {
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
    mma_16816<Elem>(acc[mi][2 * j], a[mi], b[0], b[1]);
    mma_16816<Elem>(acc[mi][2 * j + 1], a[mi], b[2], b[3]);
  }
}

// acc += A(ks) . B(ks, j) over kKSteps k16 steps and kPairs pairs of n8 tiles, each fragment
// fetched right before its MMAs (the GEMMs' form without copy-ahead): a_frags(ks, a) sets every
// slice's A fragment, b_frag(ks, j, b) loads one ldmatrix x4 of B. Padded head dims (smem_tile.h's
// ChunkBound, counting k16 steps or pairs here): the steps past `steps` and the pairs past `pairs`
// hold only zero-filled columns; they are skipped (a warp-uniform branch), not multiplied.
template <class Elem, int kKSteps, int kPairs, int kSlices, int kN, class AFrags, class BFrag,
          class Steps = AllChunks, class Pairs = AllChunks>
__device__ __forceinline__ void mma_steps(float (&acc)[kSlices][kN][4], const AFrags& a_frags,
                                          const BFrag& b_frag, Steps steps = {}, Pairs pairs = {}) {
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    if constexpr (!Steps::kAll)
      if (!steps.has(ks)) break;
    uint32_t a[kSlices][4];
    a_frags(ks, a);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      if constexpr (!Pairs::kAll)
        if (!pairs.has(j)) break;
      uint32_t b[4];
      b_frag(ks, j, b);
      mma_pair<Elem>(acc, j, a, b);
    }
  }
}

// acc[mi][nt] = Q[warp rows of slice mi] . K[n-tile nt]^T over the whole head dim (padded head
// dims: over its first `steps` k16 steps, the rest being zero-filled columns).
// sq: the warp's first Q row in shared memory; sk: the K tile. kPipelined: each fragment is loaded
// one MMA pair ahead of its use (FlashAttention-2's copy-ahead), so that ldmatrix latency overlaps
// the tensor-core work instead of preceding it; costs a second set of fragment registers.
template <int kHeadDim, int kMTiles, int kNTiles, bool kPipelined, class Elem,
          class Steps = AllChunks>
__device__ __forceinline__ void gemm_qk(float (&acc)[kMTiles][kNTiles][4], const Elem* sq,
                                        const Elem* sk, int lane, Steps steps = {}) {
  constexpr int kRowBytes = kHeadDim * 2;
  constexpr int kKSteps = kHeadDim / 16, kNPairs = kNTiles / 2;
  const int l7 = lane & 7;
  // A (x4): matrices = (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k
  // 8-15)
  const uint32_t a_base = smem_addr(sq) + (l7 + ((lane >> 3) & 1) * 8) * kRowBytes;
  const int a_chunk = lane >> 4;
  // B (x4): matrices = (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15, k 0-7), (keys 8-15, k
  // 8-15)
  const uint32_t b_base = smem_addr(sk) + (l7 + (lane >> 4) * 8) * kRowBytes;
  const int b_chunk = (lane >> 3) & 1;
  auto load_a = [&](int ks, uint32_t(&a)[kMTiles][4]) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
      ldmatrix_x4(a[mi], a_base + mi * 16 * kRowBytes + (((2 * ks + a_chunk) ^ l7) << 4));
  };
  auto load_b = [&](int ks, int np, uint32_t(&b)[4]) {
    ldmatrix_x4(b, b_base + np * 16 * kRowBytes + (((2 * ks + b_chunk) ^ l7) << 4));
  };
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][nt][e] = 0.0f;
  if constexpr (kPipelined) {
    // Current and next fragments as plain variables (copied, not indexed by parity: an indexed
    // pair ended up in local memory where the loops were not fully unrolled).
    uint32_t a[kMTiles][4], b[4], a_next[kMTiles][4], b_next[4];
    load_a(0, a);
    load_b(0, 0, b);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      // Padded: the fragments of the first dead step were loaded ahead, unused (zero columns).
      if constexpr (!Steps::kAll)
        if (!steps.has(ks)) break;
#pragma unroll
      for (int np = 0; np < kNPairs; ++np) {
        const bool last_pair = np == kNPairs - 1;
        if (!last_pair) {
          load_b(ks, np + 1, b_next);
        } else if (ks + 1 < kKSteps) {
          load_a(ks + 1, a_next);
          load_b(ks + 1, 0, b_next);
        }
        mma_pair<Elem>(acc, np, a, b);
#pragma unroll
        for (int e = 0; e < 4; ++e) b[e] = b_next[e];
        if (last_pair)
#pragma unroll
          for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
            for (int e = 0; e < 4; ++e) a[mi][e] = a_next[mi][e];
      }
    }
  } else {
    mma_steps<Elem, kKSteps, kNPairs>(acc, load_a, load_b, steps);
  }
}

// The probabilities of keys 16 ks .. 16 ks + 15 of one m16 slice, packed to 16 bits as an A
// fragment: the m16n8 accumulators of n-tiles 2 ks and 2 ks + 1 are exactly its layout.
template <class Elem, int kNTiles>
__device__ __forceinline__ void pack_p(const float (&p)[kNTiles][4], int ks, uint32_t (&a)[4]) {
  a[0] = pack2<Elem>(p[2 * ks][0], p[2 * ks][1]);
  a[1] = pack2<Elem>(p[2 * ks][2], p[2 * ks][3]);
  a[2] = pack2<Elem>(p[2 * ks + 1][0], p[2 * ks + 1][1]);
  a[3] = pack2<Elem>(p[2 * ks + 1][2], p[2 * ks + 1][3]);
}

// acc[mi][dt] += P[slice mi] . V[:, d-tile dt] over kKSteps k16 steps of keys. a_frags(ks, a) sets
// a[mi] to slice mi's A fragment of step ks (pack_p of the warp's own scores, or a PV partner's
// from shared memory). sv: the V tile's column of d-tile 0 (a whole number of 64-column swizzle
// groups into the row, so the swizzle is unchanged); rows are kHeadDim elements apart.
// kPipelined as in gemm_qk (one V fragment ahead). Padded head dims: only the first `pairs` pairs
// of d-tiles are computed (the rest of V is zero-filled columns, their O stays 0).
template <int kHeadDim, int kSlices, int kKSteps, int kDTiles, bool kPipelined, class Elem,
          class AFrags, class Pairs = AllChunks>
__device__ __forceinline__ void gemm_pv(float (&acc)[kSlices][kDTiles][4], const AFrags& a_frags,
                                        const Elem* sv, int lane, Pairs pairs = {}) {
  constexpr int kRowBytes = kHeadDim * 2;
  constexpr int kDPairs = kDTiles / 2;
  const int l7 = lane & 7;
  // B via .trans (x4): matrices = (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15),
  // (keys 8-15, d 8-15); stored rows are keys, so .trans hands each lane keys 2t, 2t+1 of column g.
  const uint32_t b_base = smem_addr(sv) + (l7 + ((lane >> 3) & 1) * 8) * kRowBytes;
  const int b_chunk = lane >> 4;
  auto load_b = [&](int ks, int dp, uint32_t(&b)[4]) {
    ldmatrix_x4_trans(b, b_base + ks * 16 * kRowBytes + (((2 * dp + b_chunk) ^ l7) << 4));
  };
  if constexpr (kPipelined && Pairs::kAll) {
    uint32_t b[4], b_next[4];
    load_b(0, 0, b);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t a[kSlices][4];
      a_frags(ks, a);
#pragma unroll
      for (int dp = 0; dp < kDPairs; ++dp) {
        if (dp + 1 < kDPairs)
          load_b(ks, dp + 1, b_next);
        else if (ks + 1 < kKSteps)
          load_b(ks + 1, 0, b_next);
        mma_pair<Elem>(acc, dp, a, b);
#pragma unroll
        for (int e = 0; e < 4; ++e) b[e] = b_next[e];
      }
    }
  } else if constexpr (kPipelined) {
    // Padded: the step's last live pair loads the next step's first fragment ahead.
    uint32_t b[4], b_next[4];
    load_b(0, 0, b);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t a[kSlices][4];
      a_frags(ks, a);
#pragma unroll
      for (int dp = 0; dp < kDPairs; ++dp) {
        if (!pairs.has(dp)) break;
        if (dp + 1 < kDPairs && pairs.has(dp + 1))
          load_b(ks, dp + 1, b_next);
        else if (ks + 1 < kKSteps)
          load_b(ks + 1, 0, b_next);
        mma_pair<Elem>(acc, dp, a, b);
#pragma unroll
        for (int e = 0; e < 4; ++e) b[e] = b_next[e];
      }
    }
  } else {
    mma_steps<Elem, kKSteps, kDPairs>(acc, a_frags, load_b, AllChunks{}, pairs);
  }
}

}  // namespace flashserve::attention::sm80
