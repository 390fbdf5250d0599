// Epilogue of one warp: the normalised O fragments go through shared memory, eight rows at a
// time, so that global stores are whole 16-byte chunks, coalesced along each row; LSE is written by
// one thread per row. The staging rows belong to this warp alone: its own (dead) rows of the Q
// tile; eight are enough.
#pragma once

#include <cstdint>

#include "ptx.h"
#include "smem_tile.h"

namespace flashserve::attention::sm80 {

// o: normalised accumulators; lse[mi][r]: each fragment row's LSE. stage: eight rows of shared
// staging; out: global address of the warp's first row; rows_valid: how many of the warp's rows
// exist (the rest are padding past q_len); lse_out: the warp's first row's LSE or null.
template <int kHeadDim, int kMTiles, int kDTiles, class Elem>
__device__ __forceinline__ void store_output(const float (&o)[kMTiles][kDTiles][4],
                                             const float (&lse)[kMTiles][2], Elem* stage, Elem* out,
                                             int64_t out_row_stride, float* lse_out,
                                             int64_t lse_row_stride, int rows_valid, int lane) {
  const int g = lane >> 2, t = lane & 3;
  constexpr int kChunksPerRow = kHeadDim / 8;
  static_assert(8 * kChunksPerRow % 32 == 0);
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row0 = mi * 16 + r * 8;  // the pass's first row: fragment row g is row0 + g
      __syncwarp();  // the stage's last readers (the previous pass, or Q's ldmatrix) are done
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) {
        const uint32_t v = pack2<Elem>(o[mi][dt][2 * r], o[mi][dt][2 * r + 1]);
        *reinterpret_cast<uint32_t*>(stage + swizzled<kHeadDim>(g, dt) + 2 * t) = v;
      }
      if (lse_out != nullptr && t == 0 && row0 + g < rows_valid)
        lse_out[(row0 + g) * lse_row_stride] = lse[mi][r];
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 8 * kChunksPerRow / 32; ++i) {
        const int id = lane + i * 32;
        const int row = id / kChunksPerRow, chunk = id % kChunksPerRow;
        if (row0 + row < rows_valid) {
          const uint4 v = *reinterpret_cast<const uint4*>(stage + swizzled<kHeadDim>(row, chunk));
          *reinterpret_cast<uint4*>(out + (row0 + row) * out_row_stride + chunk * 8) = v;
        }
      }
    }
  }
}

// Split-KV epilogue: normalised fp32 O straight from the fragments (8-byte stores; the partial
// buffers are small next to K/V in the cases that split) and the split's LSE. `o` points at the
// warp's first row, rows `row_stride` floats apart; lse_out likewise with lse_row_stride.
template <int kMTiles, int kDTiles>
__device__ __forceinline__ void store_partial(const float (&o)[kMTiles][kDTiles][4],
                                              const float (&lse)[kMTiles][2], float* out,
                                              int64_t row_stride, float* lse_out,
                                              int64_t lse_row_stride, int rows_valid, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = mi * 16 + r * 8 + g;
      if (row >= rows_valid) continue;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
        *reinterpret_cast<float2*>(out + row * row_stride + dt * 8 + 2 * t) =
            make_float2(o[mi][dt][2 * r], o[mi][dt][2 * r + 1]);
      if (t == 0) lse_out[row * lse_row_stride] = lse[mi][r];
    }
  }
}

}  // namespace flashserve::attention::sm80
