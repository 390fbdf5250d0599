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
// row (key0 + row) % page_size; `head_base` already points at the kv head. Any page size.
//
// Addresses are resolved once per tile and row, by the warp that copies the row: lane l of a warp
// looks up the page of the l-th row of the warp's share of the tile (one table read, one division
// per row, all issued before any copy), and each thread then takes its rows' offsets from their
// owners by shuffle. Looking the page up in every thread of every row serialised a dependent
// table read and a 64-bit division in front of each cp.async: 16x the work, and for the one-warp
// decode tiles 32 table round trips per K or V tile (docs/kernel-notes.md, run 23: paged decode
// at a fifth of contiguous). The next tile's table entries are prefetched into L1 (the key loop
// runs right to left), so the next lookup is an L1 hit.
template <int kRows, int kHeadDim, int kThreads, class Elem>
__device__ __forceinline__ void load_tile_paged_async(Elem* smem, const Elem* head_base,
                                                      const int32_t* table, int page_size,
                                                      int64_t page_stride, int64_t row_stride,
                                                      int key0, int valid_rows, int tid) {
  constexpr int kChunksPerRow = kHeadDim / 8;
  static_assert(kThreads % kChunksPerRow == 0 && 32 % kChunksPerRow == 0);
  constexpr int kRowStep = kThreads / kChunksPerRow;
  static_assert(kRows % kRowStep == 0);
  constexpr int kIters = kRows / kRowStep;
  // A warp copies kWarpStep consecutive rows per iteration: kWarpRows rows of the tile in all,
  // its k-th being row warp * kWarpStep + k % kWarpStep + (k / kWarpStep) * kRowStep.
  constexpr int kWarpStep = 32 / kChunksPerRow;
  constexpr int kWarpRows = kIters * kWarpStep;
  constexpr int kSlots = (kWarpRows + 31) / 32;  // rows each lane resolves
  const int lane = tid & 31, warp = tid >> 5;
  const auto warp_row = [&](int k) {
    return warp * kWarpStep + k % kWarpStep + (k / kWarpStep) * kRowStep;
  };
  int64_t offset[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int k = s * 32 + lane;
    const int row = warp_row(k);
    offset[s] = 0;
    if ((kWarpRows % 32 == 0 || k < kWarpRows) && row < valid_rows) {
      const int key = key0 + row;
      const int page = key / page_size;
      offset[s] = int64_t{table[page]} * page_stride + int64_t{key - page * page_size} * row_stride;
      const int next = key - kRows;  // the same row of the next tile (the loop runs leftwards)
      if (next >= 0) asm volatile("prefetch.global.L1 [%0];" ::"l"(table + next / page_size));
    }
  }
  const int row0 = tid / kChunksPerRow, chunk = tid % kChunksPerRow;
  const int sub = lane / kChunksPerRow;  // this thread's row among the warp's kWarpStep
  const uint32_t base = smem_addr(smem);
  const Elem* chunk_base = head_base + chunk * 8;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int row = row0 + i * kRowStep;
    const bool ok = row < valid_rows;
    // Warp row k = i * kWarpStep + sub: owned by lane k % 32, slot k / 32 (a constant, since
    // kWarpStep divides 32 and sub < kWarpStep).
    const int k0 = i * kWarpStep;
    const int64_t off = __shfl_sync(0xffffffffu, offset[k0 / 32], k0 % 32 + sub);
    cp_async_16(base + 2 * swizzled<kHeadDim>(row, chunk), ok ? chunk_base + off : head_base, ok);
  }
}

}  // namespace flashserve::attention::sm80
