// Shared-memory tiles of [rows, kHeadDim] 16-bit elements, swizzled: the 16-byte chunk c of row r
// is stored at chunk c ^ (r % 8). The eight row addresses of one ldmatrix 8x8 matrix (rows
// r..r+7, one logical chunk) then fall in eight different 16-byte bank groups, so ldmatrix,
// ldmatrix.trans, the cp.async fills and the epilogue's fragment stores are bank-conflict free.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "common/float8_cuda.cuh"
#include "ptx.h"

namespace flashserve::attention::sm80 {

template <int kHeadDim>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * kHeadDim + ((chunk ^ (row & 7)) << 3);  // in elements
}

// Which 16-byte chunks (8 columns) of a row hold real columns. AllChunks: every chunk of the
// kernel's head dim, a compile-time fact (the kernels of the compiled head dims, whose code does
// not change for it). ChunkBound: the first n, a run-time count (padded kernels, fwd_kernel.h:
// a head dim that is a multiple of 8 below the kernel's; the chunks past it are zero-filled on
// load and never stored, so their global memory is never touched).
// Users test kAll with `if constexpr` rather than calling has() on AllChunks: even a constant
// `&& true` changed the machine code of the unpadded kernels (block order; kernel-identity.py).
struct AllChunks {
  static constexpr bool kAll = true;
  __device__ __forceinline__ bool has(int) const { return true; }
};
struct ChunkBound {
  static constexpr bool kAll = false;
  int n;
  __device__ __forceinline__ bool has(int chunk) const { return chunk < n; }
};

// Global [rows, kHeadDim] (rows `row_stride` elements apart) -> shared, by cp.async in 16-byte
// chunks spread over the block's threads. Rows at or past `valid_rows`, and chunks `chunks` does
// not have, are zero-filled and their global memory is never touched.
template <int kRows, int kHeadDim, int kThreads, class Elem, class Chunks = AllChunks>
__device__ __forceinline__ void load_tile_async(Elem* smem, const Elem* gmem, int64_t row_stride,
                                                int valid_rows, int tid, Chunks chunks = {}) {
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
    bool ok = row < valid_rows;
    if constexpr (!Chunks::kAll) ok = ok && chunks.has(chunk);
    // With kRowStep % 8 == 0 the swizzle is the same for every i and this folds to a constant
    // offset from the first address.
    cp_async_16(base + 2 * swizzled<kHeadDim>(row, chunk), ok ? src : gmem, ok);
    src += kRowStep * row_stride;
  }
}

// Division by the page size as a multiply and a shift (Granlund-Montgomery, as CUTLASS's
// FastDivmod): a 32-bit integer division is a ~20-instruction sequence, and the loader divides
// once per row it resolves. Exact for 0 <= key < 2^31.
struct PageDiv {
  int size;
  uint32_t mul;  // 0: size 1
  int shift;
  static PageDiv make(int size) {  // host
    PageDiv d{size, 0, 0};
    if (size > 1) {
      int log2_ceil = 0;
      while ((int64_t{1} << log2_ceil) < size) ++log2_ceil;
      const int p = 31 + log2_ceil;
      d.mul = static_cast<uint32_t>(((uint64_t{1} << p) + size - 1) / size);
      d.shift = p - 32;
    }
    return d;
  }
  __device__ __forceinline__ int of(int key) const {
    return mul == 0 ? key : static_cast<int>(__umulhi(static_cast<uint32_t>(key), mul) >> shift);
  }
};

// How the threads of a block split a tile of kRows rows of kChunksPerRow 16-byte chunks for the
// paged loader below: each thread copies one chunk column of rows row0, row0 + kRowStep, ...; a
// warp copies kWarpStep consecutive rows per step, kWarpRows rows of the tile in all, its k-th
// being row warp * kWarpStep + k % kWarpStep + (k / kWarpStep) * kRowStep; lane l resolves the
// page of its warp's rows l, l + 32, ... (kSlots of them). A 16-bit row of d elements has d / 8
// chunks, an e4m3 row d / 16; kWarpRows (32 kRows / kThreads) and so the table entries do not
// depend on it.
template <int kRows, int kChunksPerRow_, int kThreads>
struct PagedTileShape {
  static constexpr int kChunksPerRow = kChunksPerRow_;
  static_assert(kThreads % kChunksPerRow == 0 && 32 % kChunksPerRow == 0);
  static constexpr int kRowStep = kThreads / kChunksPerRow;
  static_assert(kRows % kRowStep == 0);
  static constexpr int kIters = kRows / kRowStep;
  static constexpr int kWarpStep = 32 / kChunksPerRow;
  static constexpr int kWarpRows = kIters * kWarpStep;
  static constexpr int kSlots = (kWarpRows + 31) / 32;
  // The read-ahead block-table entries of one K or V stream in shared memory: one per (thread,
  // slot) for two blocks, by the parity of the block.
  static constexpr int kEntries = 2 * kThreads * kSlots;
};

// Elements of Src in a 16-byte chunk, and the shape of a [kRows, kHeadDim] tile of Src elements.
template <class Src>
inline constexpr int kChunkElems = 16 / static_cast<int>(sizeof(Src));
template <int kRows, int kHeadDim, int kThreads, class Src>
using PagedSrcShape = PagedTileShape<kRows, kHeadDim / kChunkElems<Src>, kThreads>;

// An fp8 KV cache's tiles are staged in place: the 16 e4m3 codes of bfloat16 chunks 2 cc and
// 2 cc + 1 of a row (one 16-byte copy) wait in one of those two chunks of the bfloat16 tile until
// widened (widen_e4m3_tile), so the codes need no shared memory of their own. Which of the two:
// under the row swizzle (chunk ^ row % 8), 2 cc alone would put a quarter warp's eight 16-byte
// accesses (one row's eight code chunks; at d64 an even row's four and the next row's four) in
// four bank groups, two ways each; taking 2 cc + 1 for cc % 8 >= 4 spreads them over all eight.
// The widening's two stores are conflict-free too when the first goes to the other chunk of the
// pair and the second to the staging chunk.
__device__ __forceinline__ int e4m3_stage_chunk(int cc) {
  return 2 * cc + ((cc >> 2) & 1);
}

// An fp8 KV cache's code tile (the decode tiles that convert at operand load, kv_fp8_reg.h): the
// [rows, kHeadDim] e4m3 codes as copied, one byte each, half the bytes of a 16-bit tile. Its
// 16-byte chunk `chunk` of row `row` lives at the byte offset code_offset returns: a 128-byte line
// holds one row at d128 (d256: two lines a row) or two rows at d64, and the 16-byte slot within
// the line is XORed with code_swizzle of the line's row (d64: of the line). The readers' accesses
// (kv_fp8_reg.h) then fall in distinct bank groups: K's 16-byte loads take rows r, r + 1 (an even
// r) and four consecutive chunks per quarter warp, which needs slot bit 2 to differ between the
// two rows (code_swizzle(2m) ^ code_swizzle(2m + 1) == 4); V's loads take rows 2q (or 2q + 1, 2q +
// 8, 2q + 9) for q = 0..3 and two chunks (d64: eight-byte halves of two chunks, per half warp),
// which needs the swizzles of rows {0, 2, 4, 6} (and {1, 3, 5, 7}) to be four distinct even
// values; the loader's copies write whole rows (d64: two rows, one line) per quarter warp.
__device__ __forceinline__ int code_swizzle(int r) {
  return (r & 6) ^ ((r & 1) << 2);
}
template <int kHeadDim>
__device__ __forceinline__ int code_offset(int row, int chunk) {  // in bytes
  if constexpr (kHeadDim == 64) {
    const int line = row >> 1;
    return line * 128 + (((((row & 1) << 2) | chunk) ^ code_swizzle(line)) << 4);
  } else {
    return row * kHeadDim + ((chunk ^ code_swizzle(row)) << 4);
  }
}

// Paged K or V: key `key0 + row` of the sequence lives in page table[(key0 + row) / page_size] at
// row (key0 + row) % page_size; `head_base` already points at the kv head. Any page size. Chunks
// `chunks` does not have are zero-filled, as load_tile_async's.
//
// Addresses are resolved once per tile row, by the warp that copies the row: lane l finds the
// page of the l-th row of the warp's share (one table entry, one division per row), and each
// thread takes its rows' offsets from their owners by shuffle. The table entries themselves are
// read one block ahead: this call copies the entries of block `block - 1` (the key loop runs right
// to left) into `entries` by cp.async, in the commit group of this block's K or V, so the next
// call finds them in shared memory, read by the same thread that copied them (no barrier needed).
// Only the first block of a tile's loop (`have_entries` false) reads the table directly.
// Looking the page up in every thread of every row, with a dependent table read and a division
// before each cp.async, ran paged decode at a fifth of contiguous, and a direct table read per
// tile still left it 23% behind (docs/kernel-notes.md, runs 23-24).
//
// Src = __nv_fp8_e4m3 (an fp8 KV cache; the shared tile stays Elem = bfloat16): the same copies,
// 16 codes each, into the bfloat16 tile's staging chunks (e4m3_stage_chunk); rows past kv_len
// are zero-filled as 16-bit ones are (a page's unwritten slots may hold any code, NaN's 0x7f
// included; the zeros widen to +0). The caller widens them after its wait for this group
// (widen_e4m3_tile), so the codes of block n - 1 are in flight during block n's MMAs, as 16-bit
// tiles are (plain loads widened on arrival, before: docs/kernel-notes.md, "Issue 23: the fp8 KV
// cache's loader").
// kCodeTile (e4m3 only): the codes go to a code tile (code_offset) instead, `smem` being its
// first byte, and stay codes (kv_fp8_reg.h converts them at operand load).
template <int kRows, int kHeadDim, int kThreads, class Elem, class Chunks = AllChunks,
          class Src = Elem, bool kCodeTile = false>
__device__ __forceinline__ void load_tile_paged_async(Elem* smem, const Src* head_base,
                                                      const int32_t* table, const PageDiv& div,
                                                      int64_t page_stride, int64_t row_stride,
                                                      int key0, int valid_rows, int32_t* entries,
                                                      int block, bool have_entries, bool fetch_next,
                                                      int tid, Chunks chunks = {}) {
  constexpr bool kE4m3 = !std::is_same_v<Src, Elem>;
  static_assert(!kCodeTile || kE4m3, "a code tile holds e4m3 codes");
  static_assert(!kE4m3 || (std::is_same_v<Src, __nv_fp8_e4m3> &&
                           std::is_same_v<Elem, __nv_bfloat16> && Chunks::kAll),
                "an e4m3 source is widened to bfloat16 tiles of the compiled head dims only");
  using S = PagedSrcShape<kRows, kHeadDim, kThreads, Src>;
  // The entries the kernel's shared memory reserves are the 16-bit tile's (fwd_kernel.h).
  static_assert(S::kEntries == PagedSrcShape<kRows, kHeadDim, kThreads, Elem>::kEntries);
  constexpr int kSlots = S::kSlots, kWarpStep = S::kWarpStep, kWarpRows = S::kWarpRows;
  const int lane = tid & 31, warp = tid >> 5;
  // This thread's entry of slot s for a block of parity `parity`.
  const auto entry = [&](int parity, int s) {
    return parity * (kThreads * kSlots) + (warp * kSlots + s) * 32 + lane;
  };
  // Offsets from head_base in units of 8 elements: 32 bits (the dispatch refuses pools of 2^35
  // elements), so one shuffle per row moves them.
  uint32_t offset[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int k = s * 32 + lane;
    const int row = warp * kWarpStep + k % kWarpStep + (k / kWarpStep) * S::kRowStep;
    const bool mine = kWarpRows % 32 == 0 || k < kWarpRows;
    offset[s] = 0;
    if (mine && row < valid_rows) {
      const int key = key0 + row;
      const int page = div.of(key);
      const int32_t at = have_entries ? entries[entry(block & 1, s)] : table[page];
      offset[s] = static_cast<uint32_t>(
          (int64_t{at} * page_stride + int64_t{key - page * div.size} * row_stride) >> 3);
    }
    // The previous block is whole (only a tile's last block can be partial).
    if (mine && fetch_next)
      cp_async_4(smem_addr(entries + entry((block - 1) & 1, s)),
                 table + div.of(key0 - kRows + row));
  }
  const int row0 = tid / S::kChunksPerRow, chunk = tid % S::kChunksPerRow;
  const int sub = lane / S::kChunksPerRow;  // this thread's row among the warp's kWarpStep
  const uint32_t base = smem_addr(smem);
  const Src* chunk_base = head_base + chunk * kChunkElems<Src>;
  const int dst_chunk = kE4m3 ? e4m3_stage_chunk(chunk) : chunk;
#pragma unroll
  for (int i = 0; i < S::kIters; ++i) {
    const int row = row0 + i * S::kRowStep;
    bool ok = row < valid_rows;
    if constexpr (!Chunks::kAll) ok = ok && chunks.has(chunk);
    // Warp row k = i * kWarpStep + sub: owned by lane k % 32, slot k / 32 (a constant, since
    // kWarpStep divides 32 and sub < kWarpStep).
    const int k0 = i * kWarpStep;
    const uint32_t off = __shfl_sync(0xffffffffu, offset[k0 / 32], k0 % 32 + sub);
    if constexpr (kCodeTile) {
      cp_async_16(base + code_offset<kHeadDim>(row, chunk),
                  ok ? chunk_base + uint64_t{off} * 8 : head_base, ok);
    } else {
      cp_async_16(base + 2 * swizzled<kHeadDim>(row, dst_chunk),
                  ok ? chunk_base + uint64_t{off} * 8 : head_base, ok);
    }
  }
}

// Widens in place the e4m3 codes of a [kRows, kHeadDim] tile that load_tile_paged_async staged
// in the bfloat16 tile `smem`, once this thread has waited for their group: each thread widens
// the chunks it copied (the same shape), reading its codes before writing the two chunks they
// become, so it overwrites no other thread's codes; the barrier after it publishes the tile, as
// it publishes a 16-bit tile's cp.async (no barrier of its own). e4m3x8_to_bf16x8 is exact.
template <int kRows, int kHeadDim, int kThreads>
__device__ __forceinline__ void widen_e4m3_tile(__nv_bfloat16* smem) {
  using S = PagedSrcShape<kRows, kHeadDim, kThreads, __nv_fp8_e4m3>;
  // Loads in batches of up to 8 chunks (32 registers), then the conversions and stores: the
  // stores' "memory" clobber keeps every later load behind them, so one load per chunk would
  // wait out its latency each time.
  constexpr int kBatch = S::kIters < 8 ? S::kIters : 8;
  static_assert(S::kIters % kBatch == 0);
  // The thread index read afresh: its chunks' addresses are then computed here, not hoisted out
  // of the key loop and held in registers through it (ptxas 13.0, sm_90a: 8-16 bytes less spill
  // in the masked tiles, 20-36 less in d256's split decode tile).
  const int tid = thread_index_x();
  const int row0 = tid / S::kChunksPerRow, cc = tid % S::kChunksPerRow;
  const int stage = e4m3_stage_chunk(cc);
  // Codes 0-7 become chunk 2 cc, 8-15 chunk 2 cc + 1; the first store goes to chunk stage ^ 1,
  // so a staging chunk of 2 cc swaps the halves first.
  const bool swap = (stage & 1) == 0;
  const uint32_t base = smem_addr(smem);
#pragma unroll
  for (int i0 = 0; i0 < S::kIters; i0 += kBatch) {
    uint4 codes[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
      codes[j] = ld_shared_16(base + 2 * swizzled<kHeadDim>(row0 + (i0 + j) * S::kRowStep, stage));
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int row = row0 + (i0 + j) * S::kRowStep;
      const uint4 c = codes[j];
      st_shared_16(base + 2 * swizzled<kHeadDim>(row, stage ^ 1),
                   e4m3x8_to_bf16x8(swap ? make_uint2(c.z, c.w) : make_uint2(c.x, c.y)));
      st_shared_16(base + 2 * swizzled<kHeadDim>(row, stage),
                   e4m3x8_to_bf16x8(swap ? make_uint2(c.x, c.y) : make_uint2(c.z, c.w)));
    }
  }
}

}  // namespace flashserve::attention::sm80
