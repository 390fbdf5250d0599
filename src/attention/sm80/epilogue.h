// Epilogue of one warp, one m16 slice at a time: the normalised O fragments go through shared
// memory, eight rows at a time, so that global stores are whole 16-byte chunks, coalesced along
// each row; LSE is written by one thread per row. The staging rows belong to this warp alone: its
// own (dead) rows of the Q tile; eight are enough. A slice may cover part of the head dim (PV
// pairs: half of it), from column chunk `chunk0` on.
#pragma once

#include <cstdint>

#include "ptx.h"
#include "smem_tile.h"

namespace flashserve::attention::sm80 {

// o: normalised accumulators of one slice (kDTiles n8 tiles of columns); lse[r]: the LSE of
// fragment row r (g or g + 8). stage: eight rows of shared staging, kHeadDim wide; out: global
// address of the slice's first row at its first column; chunk0: that column / 8; rows_valid: how
// many of the slice's rows exist (the rest are padding past q_len); lse_out: the slice's first
// row's LSE, or null when this warp does not write it; chunks: the column chunks of the head dim
// that are real (smem_tile.h; padded kernels store none past the value head dim).
template <int kHeadDim, int kDTiles, class Elem, class Chunks = AllChunks>
__device__ __forceinline__ void store_slice(const float (&o)[kDTiles][4], const float (&lse)[2],
                                            Elem* stage, Elem* out, int chunk0,
                                            int64_t out_row_stride, float* lse_out,
                                            int64_t lse_row_stride, int rows_valid, int lane,
                                            Chunks chunks = {}) {
  const int g = lane >> 2, t = lane & 3;
  static_assert(8 * kDTiles % 32 == 0);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row0 = r * 8;  // the pass's first row: fragment row g is row0 + g
    __syncwarp();  // the stage's last readers (the previous pass, or Q's ldmatrix) are done
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      const uint32_t v = pack2<Elem>(o[dt][2 * r], o[dt][2 * r + 1]);
      *reinterpret_cast<uint32_t*>(stage + swizzled<kHeadDim>(g, chunk0 + dt) + 2 * t) = v;
    }
    if (lse_out != nullptr && t == 0 && row0 + g < rows_valid)
      lse_out[(row0 + g) * lse_row_stride] = lse[r];
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 8 * kDTiles / 32; ++i) {
      const int id = lane + i * 32;
      const int row = id / kDTiles, chunk = id % kDTiles;
      bool store = row0 + row < rows_valid;
      if constexpr (!Chunks::kAll) store = store && chunks.has(chunk0 + chunk);
      if (store) {
        const uint4 v =
            *reinterpret_cast<const uint4*>(stage + swizzled<kHeadDim>(row, chunk0 + chunk));
        *reinterpret_cast<uint4*>(out + (row0 + row) * out_row_stride + chunk * 8) = v;
      }
    }
  }
}

// Split-KV epilogue of one slice: normalised fp32 O straight from the fragments (8-byte stores;
// the partial buffers are small next to K/V in the cases that split) and the split's LSE. `out`
// points at the slice's first row and first column, rows `row_stride` floats apart; lse_out (null:
// not this warp's to write) likewise with lse_row_stride.
template <int kDTiles>
__device__ __forceinline__ void store_partial(const float (&o)[kDTiles][4], const float (&lse)[2],
                                              float* out, int64_t row_stride, float* lse_out,
                                              int64_t lse_row_stride, int rows_valid, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r * 8 + g;
    if (row >= rows_valid) continue;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
      *reinterpret_cast<float2*>(out + row * row_stride + dt * 8 + 2 * t) =
          make_float2(o[dt][2 * r], o[dt][2 * r + 1]);
    if (lse_out != nullptr && t == 0) lse_out[row * lse_row_stride] = lse[r];
  }
}

}  // namespace flashserve::attention::sm80
