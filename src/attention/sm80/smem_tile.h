// Shared-memory tiles of [rows, kHeadDim] 16-bit elements, swizzled: the 16-byte chunk c of row r
// is stored at chunk c ^ (r % 8). The eight row addresses of one ldmatrix 8x8 matrix (rows
// r..r+7, one logical chunk) then fall in eight different 16-byte bank groups, so ldmatrix,
// ldmatrix.trans, the cp.async fills and the epilogue's fragment stores are bank-conflict free.
#pragma once

#include <cstdint>

#include "ptx.h"

namespace flashserve::attention::sm80 {

template <int kHeadDim>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * kHeadDim + ((chunk ^ (row & 7)) << 3);  // in elements
}

// Global [rows, kHeadDim] (rows `row_stride` elements apart) -> shared, by cp.async in 16-byte
// chunks spread over the block's threads. Rows at or past `valid_rows` are zero-filled and their
// global memory is never touched.
template <int kRows, int kHeadDim, int kThreads, class Elem>
__device__ __forceinline__ void load_tile_async(Elem* smem, const Elem* gmem, int64_t row_stride,
                                                int valid_rows, int tid) {
  constexpr int kChunksPerRow = kHeadDim / 8;
  // Each thread copies one fixed chunk column of rows row0, row0 + kRowStep, ...: one 64-bit
  // pointer bump per row and, since kRowStep is a multiple of 8, one swizzle for all of them
  // (per-row 64-bit addresses hoisted for a whole tile cost ~32 registers and caused spills).
  static_assert(kThreads % kChunksPerRow == 0);
  constexpr int kRowStep = kThreads / kChunksPerRow;
  static_assert(kRows % kRowStep == 0);
  const int row0 = tid / kChunksPerRow, chunk = tid % kChunksPerRow;
  const Elem* src = gmem + row0 * row_stride + chunk * 8;
  const uint32_t base = smem_addr(smem);
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; ++i) {
    const int row = row0 + i * kRowStep;
    const bool ok = row < valid_rows;
    // With kRowStep % 8 == 0 the swizzle is the same for every i and this folds to a constant
    // offset from the first address.
    cp_async_16(base + 2 * swizzled<kHeadDim>(row, chunk), ok ? src : gmem, ok);
    src += kRowStep * row_stride;
  }
}

// Paged K or V: key `key0 + row` of the sequence lives in page table[(key0 + row) / page_size] at
// row (key0 + row) % page_size; `head_base` already points at the kv head. Any page size; each
// thread looks up the pages of its own rows (the table row is small and stays in L1).
template <int kRows, int kHeadDim, int kThreads, class Elem>
__device__ __forceinline__ void load_tile_paged_async(Elem* smem, const Elem* head_base,
                                                      const int32_t* table, int page_size,
                                                      int64_t page_stride, int64_t row_stride,
                                                      int key0, int valid_rows, int tid) {
  constexpr int kChunksPerRow = kHeadDim / 8;
  static_assert(kThreads % kChunksPerRow == 0);
  constexpr int kRowStep = kThreads / kChunksPerRow;
  static_assert(kRows % kRowStep == 0);
  const int row0 = tid / kChunksPerRow, chunk = tid % kChunksPerRow;
  const uint32_t base = smem_addr(smem);
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; ++i) {
    const int row = row0 + i * kRowStep;
    const bool ok = row < valid_rows;
    const Elem* src = head_base;
    if (ok) {
      const int key = key0 + row;
      const int64_t page = table[key / page_size];
      src = head_base + page * page_stride + (key % page_size) * row_stride + chunk * 8;
    }
    cp_async_16(base + 2 * swizzled<kHeadDim>(row, chunk), src, ok);
  }
}

}  // namespace flashserve::attention::sm80
