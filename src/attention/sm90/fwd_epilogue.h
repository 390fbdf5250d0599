// The epilogue of the sm90 forward kernel (fwd_kernel.h): a consumer warpgroup's 64 rows of O
// (normalised by the softmax's sum, fwd_softmax.h) and their LSE out to global memory,
// FwdEpilogue. O leaves either by register stores (16 bytes, 8 columns of a row, each:
// store_row_vec16) or, with kTmaStoreO (tile_config.h OverlappedEpilogue, session 18's tile
// boundary), through a staging buffer in shared memory (OStaging, written by stmatrix: stage_o) by
// TMA stores that drain while the warpgroup goes on to its next tile; tiles without room for a
// staging buffer of their own keep the register stores (fwd_kernel.h EpilogueTile).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention/kernel/seqlen.h"
#include "attention/kernel/tile_order.h"
#include "device_util.h"
#include "fwd_params.h"
#include "fwd_softmax.h"
#include "fwd_sync.h"
#include "fwd_tile_scheduler.h"
#include "tma.h"
#include "trace.h"

namespace flashserve::attention::sm90 {

// Tiles with kTmaStoreO: each consumer warpgroup's 64 rows of O, in 64-column chunks of 8-row
// 128-byte swizzle atoms (the layout the O tensor map's boxes have), for its TMA stores.
template <class Cfg, bool = Cfg::kTmaStoreO && !Cfg::kOInQ>
struct OStaging {};
template <class Cfg>
struct OStaging<Cfg, true> {
  static constexpr int kChunkBytes = 64 * 128;
  alignas(1024) uint8_t o[Cfg::kConsumers][Cfg::kOChunks][kChunkBytes];
};

// The kernel's shared memory (fwd_kernel.h): O's staging (OStaging, or Q's buffer with kOInQ).
template <class Cfg>
struct SharedStorage;

// Where warpgroup cw stages column chunk c of its 64 rows of O: 64 rows of 128-byte swizzled
// rows, 8 KB on a 1024-byte boundary (the layout of the O map's boxes), in the staging buffer or
// in the warpgroup's own rows of Q (kOInQ; Q's chunks have that layout, and only this
// warpgroup's QK^T reads those rows).
template <class Cfg>
__device__ __forceinline__ uint8_t* o_chunk(SharedStorage<Cfg>& s, int cw, int c) {
  if constexpr (Cfg::kOInQ) {
    static_assert(!Cfg::kFp8 && Cfg::kRowBytes == 128 && Cfg::kQChunkBytes == Cfg::kBlockM * 128,
                  "Q's chunks are 128-byte rows of 16-bit values, as O's staging");
    return s.q[c] + cw * 64 * 128;
  } else {
    return s.o[cw][c];
  }
}

// Whether the 64 rows of a warpgroup from row wg_row0 of its sequence can leave as TMA boxes
// (kTmaStoreO). A box clips only at the map's end: a dense map's sequences are a dimension of
// their own, so their boxes clip at each sequence's last row, but a varlen map is all sequences'
// rows in one, and a box that reaches past its sequence's last row writes the next sequence's
// first rows (racing with that tile's own stores). So a varlen warpgroup whose rows end past its
// sequence's last row takes the register stores, unless its sequence is the last of the tensor
// (the box then clips at the map's end). Chosen per tile rather than by a map per sequence: the
// register stores are the same values, one tile per sequence at most takes them, and a map per
// sequence would be a host-side array of 128-byte maps per call (not CUDA-graph friendly).
// A warpgroup whose rows all lie past q_len stores nothing either way.
__device__ __forceinline__ bool tma_box_in_sequence(const FwdParams& p, const kernel::SeqLens& seq,
                                                    int wg_row0) {
  return wg_row0 < seq.q_len &&
         (wg_row0 + 64 <= seq.q_len || seq.q_start + seq.q_len >= p.seqlen_q);
}

// This thread's share of warpgroup cw's 64 rows of O (packed[h][g]: row 16 warp + lane / 4 +
// 8 h, columns 8 g + 2 (lane % 4) + {0, 1}, the accumulator's layout) into its staging chunks
// (o_chunk: 64 rows of 128 bytes each, 16-byte unit g % 8 of row r at unit (g % 8) ^ (r % 8):
// TMA's 128-byte swizzle). One stmatrix x4 per 16 columns, as the backward's store_ds: matrix m
// of the four is row half m % 2 of group 2 j + m / 2, exactly the registers' layout (row
// lane / 4, columns 2 (lane % 4) and + 1), and lane L gives the address of row L % 8 of matrix
// L / 8. It replaces 4 shuffles and a 16-byte store per 32 columns and row half
// (store_row_vec16), traffic through the MIO queue beside the other warpgroup's wgmma:
// sm90_trace (session 38, H100, 512 keys) put the epilogue's O-and-LSE part at 1490-1940 cycles
// before and 1190-1560 after, and the whole forward at +0.4-1.8% at d64 / d128 with 512-1k keys.
// A matrix's 8 rows land in 8 distinct swizzled units: no bank conflict. Group 2 j + m / 2 has
// unit (2 j % 8) + L / 16, a sum of disjoint bits, so each store XORs its compile-time part into
// the lane's offset, computed once.
template <class Cfg>
__device__ __forceinline__ void stage_o(SharedStorage<Cfg>& s, int cw,
                                        const uint32_t (&packed)[2][Cfg::kHeadDim / 8], int tid) {
  const int lane = tid % 32, r = (tid / 32) * 16 + 8 * ((lane / 8) % 2) + lane % 8;
  const uint32_t offset = r * 128 + (((lane / 16) ^ (lane % 8)) << 4);
#pragma unroll
  for (int j = 0; j < Cfg::kHeadDim / 16; ++j) {
    const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(o_chunk(s, cw, j / 4))) +
                          (offset ^ (((2 * j) % 8) << 4));
    stmatrix_x4(addr, packed[0][2 * j], packed[1][2 * j], packed[0][2 * j + 1],
                packed[1][2 * j + 1]);
  }
}

template <class Cfg_, bool kBf16_>
class FwdEpilogue {
 public:
  using Cfg = Cfg_;
  static constexpr bool kBf16 = kBf16_;

  // The epilogue of one consumer warpgroup's 64 rows of `tile` (cw c: tile rows 64c .. 64c + 63,
  // tid its thread 0..127): O / sum and LSE; rows past q_len are not stored. With kTmaStoreO, O
  // goes to the warpgroup's staging (o_chunk) and thread 0 stores it with TMA (tma_box_in_sequence;
  // the rows past q_len fall outside the tensor map and are not written), so the warpgroup moves
  // on to its next tile while the store drains. A staging buffer of its own is written again only
  // once the previous tile's stores have read it. Staged in Q (kOInQ), `keyed` says whether the
  // tile had key blocks and so a Q load of its own: only then may O go there (the producer loads
  // no Q for a tile without keys, and may already have loaded the next tile's), and only then does
  // the warpgroup release Q (q_empty, 4 arrivals: its warps'), once its O has left it.
  static __device__ __forceinline__ void store(SharedStorage<Cfg>& s, const FwdParams& p,
                                               const kernel::TileCoords& tile,
                                               const kernel::SeqLens& seq, int cw, int tid,
                                               const float (&o)[Cfg::kHeadDim / 2],
                                               const RowsOf<Cfg>& rows, bool keyed,
                                               Trace<Cfg::kTrace>& trace) {
    constexpr int kD = Cfg::kHeadDim;
    using Elem = std::conditional_t<kBf16, __nv_bfloat16, __half>;
    const int lane = tid % 32, b = seq_of(p, tile);
    // kFp8: O times v_descale; the LSE in the descaled scores' units, less P's 2^8.
    [[maybe_unused]] float o_scale = 1.0f, lse_scale = p.scale;
    if constexpr (Cfg::kFp8) {
      const int hk = tile.head / p.h_ratio;
      o_scale = descale_of(p.v_descale, p.v_descale_batch_stride, p.v_descale_head_stride, b, hk);
      lse_scale = p.scale * score_descale<Cfg>(p, b, hk);
    }
    const int wg_row0 = tile.m_block * Cfg::kBlockM + cw * 64;
    const int row0 = wg_row0 + (tid / 32) * 16 + lane / 4;
    // The same for the warpgroup's 128 threads (tile and lengths are), so its barriers are too.
    const bool by_tma =
        Cfg::kTmaStoreO && (!Cfg::kOInQ || keyed) && tma_box_in_sequence(p, seq, wg_row0);
    if (!Cfg::kOInQ && by_tma) {
      if (tid == 0) tma_store_wait_read();
      epilogue_sync(cw);  // the staging buffer is free for every thread of the warpgroup
      trace(kEpilogueFree);
    }
    uint32_t packed[2][kD / 8];  // row half h's 8-column groups, as 16-bit pairs
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = rows.sum[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int t = row0 + 8 * h;
      // No key seen (fully masked row or no keys): O = 0 and LSE = -inf. A NaN score (NaN input;
      // fmaxf skips it in the max but its exp2 is NaN) or a +inf one (inf - inf) leaves sum NaN,
      // so the row's O and LSE come out NaN, as in PyTorch and the sm80 kernels.
      const bool seen = sum != 0.0f;
      float inv = seen ? 1.0f / sum : 0.0f;
      if constexpr (Cfg::kFp8) inv *= o_scale;
#pragma unroll
      for (int i = 0; i < kD / 8; ++i)
        packed[h][i] = pack2<kBf16>(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
      if (!by_tma) {
        Elem* out = static_cast<Elem*>(p.out) + b * p.o_batch_stride +
                    int64_t{seq.q_start + t} * p.o_row_stride + tile.head * p.o_head_stride;
        // The dispatch refuses outputs whose rows are not 16-byte aligned (check_aligned).
        store_row_vec16<kD>(packed[h], lane % 4, [&](int g, uint4 v) {
          if (t < seq.q_len)
            *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(out) + 16 * g) = v;
        });
      }
      if (t < seq.q_len && p.lse != nullptr && lane % 4 == 0) {
        float lse = seen ? rows.max[h] * p.scale + logf(sum) : -INFINITY;
        if constexpr (Cfg::kFp8)
          lse = seen ? rows.max[h] * lse_scale + logf(sum) - 8.0f * 0.693147180559945f : -INFINITY;
        p.lse[b * p.lse_batch_stride + tile.head * p.lse_head_stride +
              int64_t{seq.q_start + t} * p.lse_row_stride] = lse;
      }
    }
    if constexpr (Cfg::kTmaStoreO) {
      if (by_tma) {
        stage_o(s, cw, packed, tid);
        trace(kEpilogueWritten);
        fence_shared_to_async();  // each thread's staging writes, before the TMA store reads them
        epilogue_sync(cw);
        trace(kEpilogueSynced);
        if (tid == 0) {
          // Varlen maps are one sequence of all rows (the launch's tma_o, as tma_q).
          const int z = p.cu_seqlens_q != nullptr ? 0 : b;
#pragma unroll
          for (int c = 0; c < Cfg::kOChunks; ++c)
            tma_store_4d(&p.tma_o, o_chunk(s, cw, c), c * 64, seq.q_start + wg_row0, tile.head, z);
          tma_store_commit();
          if constexpr (Cfg::kOInQ) {
            // Q's rows are free once the stores have read them: the next tile's Q may load.
            tma_store_wait_read();
            for (int w = 0; w < 4; ++w) s.q_empty.arrive();
          }
        }
      } else if (Cfg::kOInQ && keyed) {
        release(s.q_empty);  // each warp: its warpgroup's QK^T have finished reading its Q rows
      }
    }
  }

  // After the warpgroup's last tile: thread 0's TMA stores of O complete before it leaves.
  static __device__ __forceinline__ void store_tail(int tid) {
    if constexpr (Cfg::kTmaStoreO)
      if (tid == 0) tma_store_wait_all();  // the staging buffer lives as long as the CTA
  }
};

}  // namespace flashserve::attention::sm90
