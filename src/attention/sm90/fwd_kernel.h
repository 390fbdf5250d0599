// The sm90 (Hopper, sm_90a) forward kernel: query tiles of 64 rows per consumer warpgroup
// (FlashAttention-3's mainloop, written from the PTX ISA).
// - Warpgroup 0, the producer, gives registers back (setmaxnreg.dec); one thread picks the tiles
//   and issues the TMA copies: per tile Q once, then K and V blocks through a ring of kStages,
//   K one block ahead of V (the order the consumers use them in). K/V in pages shorter than a
//   key block are copied by all 128 producer threads with cp.async instead (copy_kv, up to d128).
// - Warpgroups 1.. (two or three), the consumers, own 64 query rows each. Per key block j they
//   compute S = Q K^T (wgmma, both operands in shared memory), the online softmax on the
//   accumulator fragment, and O += P V (wgmma, P from registers). Two overlaps keep the tensor
//   cores busy: within a warpgroup, QK^T of block j is issued together with PV of block j - 1 and
//   the softmax of j runs while PV(j - 1) is still in flight; between the warpgroups, the
//   WarpScheduler makes them take turns issuing, so one's softmax runs under the others' GEMMs.
// - Key blocks go from the last to the first: the blocks that need a mask on their high side (the
//   causal diagonal or a window's right edge, the ragged end of the keys) come first, then the
//   mask-free path, then (a sliding window's left edge) masked blocks again.
// - Sequences: dense, varlen (cu_seqlens) or seqused_k (kernel/seqlen.h), K/V dense or paged
//   (a key block as boxes within pages, load_kv); query tiles past a shorter sequence's rows have
//   no work; the visited key blocks follow the mask (kernel/block_mask.h, as the sm80 kernels').
// - Barriers per stage: k_full / v_full (TMA bytes landed), k_empty / v_empty (one arrival per
//   consumer warp once its warpgroup's GEMM that read the buffer has completed): K is released
//   after QK^T, V after PV, so the producer refills K while PV still reads V.
// - Persistent: one CTA per multiprocessor walks its tiles (FwdParams::order, heaviest first in
//   L2-sized sections of heads; a fixed stride, or causal the next free tile from a counter); the
//   producer runs ahead into the next tile (Q is released after a tile's last QK^T, K and V block
//   by block), so its loads overlap this tile's last GEMMs and epilogue.
// - Multicast (TileConfig::kCluster 2, tile_config.h's Multicast): clusters of two CTAs take pairs
//   of adjacent query tiles of one head; each producer loads half of every K/V block into both
//   CTAs (load_kv), and every consumer warp releases a stage on both CTAs' barriers (release_kv).
//
// - Session 18's tile boundary (tile_config.h OverlappedEpilogue, FLASHSERVE_SM90_EPILOGUE): O
//   leaves through shared memory by TMA stores (store_tile), the producer announces each tile's
//   work with its index (TileSlot) and loads a tile's first K block before its Q.
// - Part of the exponentials on the FMA pipe (tile_config.h Exp2Fma, FLASHSERVE_SM90_EXP2_FMA; d64
//   16-bit and fp8 tiles): RowState computes one 8-column chunk in kExp2FmaEvery by exp2_poly.h.
//
// Not yet here (docs/kernel-notes.md, "sm90 next steps"): split-KV.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attention/kernel/block_mask.h"
#include "attention/kernel/seqlen.h"
#include "attention/kernel/tile_order.h"
#include "device_util.h"
#include "exp2_poly.h"
#include "fwd_params.h"
#include "mbarrier.h"
#include "tile_config.h"
#include "tma.h"
#include "trace.h"
#include "warp_scheduler.h"
#include "wgmma.h"

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

// A tile as the producer announces it with kAnnounceWork: its index in the grid's order (past
// the last, num_tiles), its coordinates and its sequence's lengths (q_len 0 where the launch
// does not take the sequence, TileWork), which the consumers would otherwise derive again at the
// tile's start (the order's divisions; with varlen or seqused_k, loads of the lengths).
struct TileSlot {
  int32_t t;
  kernel::TileCoords coords;
  kernel::SeqLens seq;
};

template <class Cfg>
struct SharedStorage : OStaging<Cfg> {
  // Each chunk is a 1024-byte aligned run of 8-row swizzle atoms (wgmma.h).
  alignas(1024) uint8_t q[Cfg::kChunks][Cfg::kQChunkBytes];
  alignas(1024) uint8_t k[Cfg::kStages][Cfg::kChunks][Cfg::kKVChunkBytes];
  // V's blocks as TMA reads them ([keys, d]), or with kFp8 V^T's ([d, keys], fp8_vt.h).
  alignas(1024) uint8_t v[Cfg::kStages][Cfg::kVChunks][Cfg::kVChunkBytes];
  Mbarrier q_full, q_empty;
  // The producer announces each tile it starts (FwdParams::tile_counter) to the consumers
  // through a ring of two slots: tile_full (the producer's arrival) and tile_empty (one arrival
  // per consumer thread once it has read the slot: each thread's own release orders its read
  // before the producer's next write, which racecheck cannot see through a warp's __syncwarp).
  std::conditional_t<Cfg::kAnnounceWork, TileSlot, int32_t> tile[2];
  Mbarrier tile_full[2], tile_empty[2];
  int32_t producer_tile;  // copy_kv's producer threads: the next tile, from thread 0
  // copy_kv's row offsets in the K (0) and V (1) pools (none without kPagedCpAsync: d256's
  // tile has no shared memory to spare).
  int64_t kv_rows[2][Cfg::kPagedCpAsync ? Cfg::kBlockN : 1];
  Mbarrier k_full[Cfg::kStages], v_full[Cfg::kStages];
  Mbarrier k_empty[Cfg::kStages], v_empty[Cfg::kStages];
};

template <class Cfg>
constexpr int smem_bytes() {
  return static_cast<int>(sizeof(SharedStorage<Cfg>)) + 1024;  // + the base's realignment
}

// Whether tile Cfg with session 18's boundary has room for a staging buffer of O's own beside Q
// and the K/V ring: d64 and the 128 x 128 d128 tiles (24 / 16 / 32 KB); d128 x 176 (208 KB) and
// d256 (224 KB) do not.
template <class Cfg>
inline constexpr bool kOwnEpilogueBuffer =
    smem_bytes<OverlappedEpilogue<Cfg, true>>() <= kMaxSmemPerBlock;
static_assert(kOwnEpilogueBuffer<TileConfig<64, 192, 128>> &&
                  kOwnEpilogueBuffer<TileConfig<64, 128, 128, 3>> &&
                  kOwnEpilogueBuffer<TileConfig<128, 128, 128>>,
              "d64 and d128 x 128 have room for O's own staging");
static_assert(!kOwnEpilogueBuffer<TileConfig<128, 128, 176>> &&
                  !kOwnEpilogueBuffer<TileConfig<256, 128, 80, 2, true>>,
              "d128 x 176 and d256 have no room for O's own staging");
// The fp8 tiles' one-byte Q and K/V leave room for the 16-bit O's staging at every head dim
// (d256: Q 32 KB + 2 x (K 32 KB + V^T 32 KB) + O 64 KB = 224 KB).
static_assert(kOwnEpilogueBuffer<Fp8TileConfig<64, 192, 128>> &&
                  kOwnEpilogueBuffer<Fp8TileConfig<128, 128, 128>> &&
                  kOwnEpilogueBuffer<Fp8TileConfig<128, 128, 192, 2, 64>> &&
                  kOwnEpilogueBuffer<Fp8TileConfig<256, 128, 128>>,
              "the fp8 tiles have room for O's own staging");

// Tile Cfg with session 18's boundary (tile_config.h OverlappedEpilogue) where O has a staging
// buffer of its own; elsewhere Cfg as it is. O staged in Q's buffer instead (kOInQ) measured
// slower than the register stores on the H200 (session 19, bench_sm90 --epilogue-ab, 512-2k
// keys: d256 -2..-6%, d128 x 176 -4% at 2k; the next tile's Q waits for this tile's O to leave),
// so those tiles keep the register stores; sm90_trace keeps the staged-in-Q variant to study.
template <class Cfg>
using EpilogueTile =
    std::conditional_t<kOwnEpilogueBuffer<Cfg>, OverlappedEpilogue<Cfg, true>, Cfg>;

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

// The CTA's rank in its cluster: 0 without multicast (TileConfig::kCluster 1).
template <class Cfg>
__device__ __forceinline__ uint32_t cta_rank() {
  if constexpr (Cfg::kCluster == 1)
    return 0;
  else
    return cuda::ptx::get_sreg_cluster_ctarank();
}

// Every thread of every CTA of the cluster: what each did before happens before what any does
// after (the barriers' initialisation before the other CTA's first multicast or arrival; the
// other CTA's last arrivals on this one's barriers before this one exits).
__device__ __forceinline__ void cluster_sync() {
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait();
}

// The sequence a tile's grid coordinate z stands for: the launch's range starts at seq_begin.
__device__ __forceinline__ int seq_of(const FwdParams& p, const kernel::TileCoords& tile) {
  return p.seq_begin + tile.z;
}

__device__ __forceinline__ kernel::SeqLens seq_lens_of(const FwdParams& p, int b) {
  return kernel::seq_lens(p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k, p.seqlen_q, p.seqlen_k, b);
}

// The tile this CTA computes for entry t of the grid's order: with multicast, entries are pairs of
// adjacent query tiles (the order's m_blocks counts pairs) and the CTA of rank r takes tile
// 2 m + r of pair m, so the two CTAs of a cluster share the head, the sequence and the key blocks.
template <class Cfg>
__device__ __forceinline__ kernel::TileCoords cta_tile(const FwdParams& p, int t) {
  kernel::TileCoords tile = kernel::tile_of(p.order, t);
  if constexpr (Cfg::kCluster > 1) tile.m_block = tile.m_block * Cfg::kCluster + cta_rank<Cfg>();
  return tile;
}

// A tile's sequence and the key blocks its rows visit; producer and consumers derive both from
// the same tile index, so they agree on every load. `valid`: the tile has rows (a varlen
// sequence shorter than the longest has fewer query tiles than the grid) and its sequence is of
// the kind the launch takes (FwdParams::only).
template <class Cfg, bool kMasked>
struct TileWork {
  int b;  // the sequence
  kernel::SeqLens seq;
  int m0;  // the tile's first query row within its sequence
  kernel::KeyBlocks<Cfg::kBlockM, Cfg::kBlockN, kMasked> blocks;

  __device__ __forceinline__ TileWork(const FwdParams& p, const kernel::TileCoords& tile)
      : b(seq_of(p, tile)),
        seq(seq_lens_of(p, b)),
        m0(tile.m_block * Cfg::kBlockM),
        blocks(m0, seq.q_len, seq.kv_len, p.window_left, p.window_right) {
    if (!kernel::takes_seq(p.only, seq.q_len)) seq.q_len = 0;
  }
  // From the lengths the producer announced (TileSlot: q_len already 0 where the sequence is not
  // taken, and then the blocks are never used).
  __device__ __forceinline__ TileWork(const FwdParams& p, const kernel::TileCoords& tile,
                                      const kernel::SeqLens& announced)
      : b(seq_of(p, tile)),
        seq(announced),
        m0(tile.m_block * Cfg::kBlockM),
        blocks(m0, seq.q_len, seq.kv_len, p.window_left, p.window_right) {}

  __device__ __forceinline__ bool valid() const { return m0 < seq.q_len; }
  // The TMA coordinates of row 0 of the sequence: dense tensors by sequence, varlen ones by row.
  __device__ __forceinline__ int q_z(const FwdParams& p) const {
    return p.cu_seqlens_q != nullptr ? 0 : b;
  }
  __device__ __forceinline__ int kv_z(const FwdParams& p) const {
    return p.cu_seqlens_k != nullptr ? 0 : b;
  }
};

// ---------------------------------------------------------------------------------------------
// Producer

// Where a tile's key blocks come from: dense or varlen K/V, row `row0` (the sequence's first key
// row: 0 dense, cu_seqlens_k[b] varlen) of map sequence z (b dense, 0 varlen); paged, the pages
// of table row z (b), up to the sequence's last page `row0` (boxes past its last key read that
// page again: those keys are masked and their V rows zeroed, zero_v_tail, so any row serves).
// Two numbers, since the producer holds them through the tile at 32 registers.
struct KvSource {
  int row0, z;
};

template <class Cfg, bool kMasked>
__device__ __forceinline__ KvSource kv_source(const FwdParams& p, const TileWork<Cfg, kMasked>& w) {
  if (p.block_table != nullptr) return {(w.seq.kv_len - 1) / p.page_size, w.b};
  return {w.seq.k_start, w.kv_z(p)};
}

// Key block `block`: one box per column chunk, or, paged, kBlockN / page_rows boxes per chunk,
// each within its page (fwd_params.h). With multicast (dense only: launch_template.h's
// multicast_ok) the CTA of rank `rank` loads the chunks c with c % 2 == rank into both CTAs; each
// CTA's barrier expects the whole block, half of it from the other CTA's copies.
template <class Cfg>
__device__ __forceinline__ void load_kv(const FwdParams& p, const CUtensorMap* map,
                                        uint8_t (&dst)[Cfg::kChunks][Cfg::kKVChunkBytes],
                                        Mbarrier& full, KvSource src, int block, int kv_head,
                                        uint32_t rank) {
  full.arrive_expect_tx(Cfg::kKVBytes);
  const int key0 = block * Cfg::kBlockN;
  if (Cfg::kCluster > 1 || p.block_table == nullptr) {
#pragma unroll
    for (int c = 0; c < Cfg::kChunks; ++c) {
      if constexpr (Cfg::kCluster == 1)
        tma_load_4d(dst[c], map, full, c * Cfg::kChunkCols, src.row0 + key0, kv_head, src.z);
      else if (c % 2 == static_cast<int>(rank))
        tma_load_4d_multicast(dst[c], map, full, 0b11, c * Cfg::kChunkCols, src.row0 + key0,
                              kv_head, src.z);
    }
    return;
  }
  const int32_t* table = p.block_table + src.z * p.block_table_stride;
  for (int r = 0; r < Cfg::kBlockN; r += p.page_rows) {
    const int key = key0 + r;
    const int page = __ldg(table + min(key / p.page_size, src.row0));
#pragma unroll
    for (int c = 0; c < Cfg::kChunks; ++c)
      tma_load_4d(dst[c] + r * 128, map, full, c * Cfg::kChunkCols, key % p.page_size, kv_head,
                  page);
  }
}

// kFp8: block `block` of V^T (fp8_vt.h: sequence b's slab, keys innermost), kVChunks boxes of
// kVtBoxKeys keys x d rows; the bytes are K's block's (kKVBytes).
template <class Cfg>
__device__ __forceinline__ void load_vt(const FwdParams& p,
                                        uint8_t (&dst)[Cfg::kVChunks][Cfg::kVChunkBytes],
                                        Mbarrier& full, int b, int block, int kv_head) {
  full.arrive_expect_tx(Cfg::kKVBytes);
#pragma unroll
  for (int c = 0; c < Cfg::kVChunks; ++c)
    tma_load_4d(dst[c], &p.tma_v, full, block * Cfg::kBlockN + Cfg::kVtBoxKeys * c, 0, kv_head, b);
}

// 16 bytes from global to shared memory, asynchronously; zero-filled (nothing read) where not
// `valid`. No memory clobber: the row offsets' shared-memory reads may move around it (it
// writes only the K/V buffers, which nothing here reads).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}

// The producer warpgroup's 128 threads, with kv_cp_async (named barrier 12: 1..3 are the warp
// scheduler's, 8..10 the consumers' epilogues).
__device__ __forceinline__ void producers_sync() {
  asm volatile("bar.sync 12, 128;\n" ::: "memory");
}

// The table entry of a key: its page's index in the sequence's row of the block table.
__device__ __forceinline__ int page_slot(const FwdParams& p, int key) {
  return p.page_shift >= 0 ? key >> p.page_shift : key / p.page_size;
}

// Paged K/V by cp.async (FwdParams::kv_cp_async): the pages of key block `block`, one table
// entry per lane: lane l holds the block's l-th page (clamped to the sequence's last page). A
// block spans at most kBlockN / 8 + 1 <= 32 pages (pages are multiples of 8 keys). Read one
// block ahead of the copies, so their latency hides behind the previous block's.
template <class Cfg>
__device__ __forceinline__ int block_pages(const FwdParams& p, const int32_t* table, int kv_len,
                                           int block, int lane) {
  static_assert(Cfg::kBlockN / 8 + 1 <= 32, "a block's pages fit a warp");
  const int first = page_slot(p, block * Cfg::kBlockN), last = page_slot(p, kv_len - 1);
  return __ldg(table + min(first + lane, last));
}

// Key block `block` of KV head kv_head from `pool` ([num_pages, page_size, h_kv, d], element
// strides) into `dst` in the layout TMA's 128-byte swizzle gives (wgmma.h): the 16-byte piece u
// of row r of a 64-column chunk at chunk + 128 r + 16 (u ^ r % 8). In two steps, since one
// producer warp per scheduler has no other warps to hide a long chain of address arithmetic per
// copy (a loop that found each row's page and offset itself ran 3x slower than the tensor
// cores; 64 threads 5x, 32 threads 9x: docs/kernel-notes.md, session 14):
// 1. producer thread r computes row r's (and r + 128's) offset in the pool (its page from the lane
//    holding it, `pages`, block_pages), -1 past the sequence's kv_len keys, into `rows`;
// 2. thread tid copies piece tid % kPieces of rows tid / kPieces, + 128 / kPieces, ..., each a
//    shared-memory read and one cp.async, zero-filling the rows past the keys (so no V row there
//    needs zeroing: zero_v_tail is off in this mode).
// Every producer thread runs it (the shuffles, the warpgroup's barriers); the caller arrives on
// the stage's full barrier after it (arrive_on_cp_async).
template <class Cfg>
__device__ __forceinline__ void copy_kv(const FwdParams& p, const void* pool, int64_t page_stride,
                                        int64_t row_stride, int64_t head_stride,
                                        uint8_t (&dst)[Cfg::kChunks][Cfg::kKVChunkBytes],
                                        int64_t* rows, int pages, int kv_len, int block,
                                        int kv_head, int tid) {
  constexpr int kPieces = Cfg::kHeadDim / 8, kRowStep = 128 / kPieces;
  static_assert(128 % kPieces == 0 && Cfg::kBlockN % kRowStep == 0, "whole rows per thread");
  const int key0 = block * Cfg::kBlockN, first = page_slot(p, key0);
  producers_sync();  // every thread has read `rows` of the previous call
#pragma unroll
  for (int r = tid; r < (Cfg::kBlockN + 127) / 128 * 128; r += 128) {  // uniform: the shuffle
    const int key = key0 + r, slot = page_slot(p, key);
    const int64_t page = __shfl_sync(0xffffffffu, pages, (slot - first) & 31);
    if (r < Cfg::kBlockN)
      rows[r] = key < kv_len ? page * page_stride + (key - slot * p.page_size) * row_stride : -1;
  }
  producers_sync();
  const int piece = tid % kPieces;
  const auto* base = static_cast<const uint16_t*>(pool) + kv_head * head_stride + piece * 8;
  const uint32_t chunk = static_cast<uint32_t>(__cvta_generic_to_shared(dst[piece / 8]));
  const uint32_t u = piece % 8;
#pragma unroll 4
  for (int r = tid / kPieces; r < Cfg::kBlockN; r += kRowStep) {
    const int64_t offset = rows[r];
    cp_async_16(chunk + r * 128 + ((u ^ (r & 7)) << 4), base + max(offset, int64_t{0}),
                offset >= 0);
  }
}

// Per tile: Q (once both consumers are done with the previous tile's Q), K of the first block,
// then per step K of the next block and V of the current one. `ring` counts the K/V blocks of
// earlier tiles: block i of this tile (key block n_max - 1 - i) is ring slot ring + i, in stage
// slot % kStages; the producer waits for that stage's buffer to be released (a stage's first
// round passes on the fresh barrier). `q_round` counts the earlier tiles with keys. With kCp
// (kv_cp_async) every producer thread runs it (`tid`; thread 0 loads Q), else thread 0 alone.
template <class Cfg, bool kMasked, bool kCp>
__device__ __forceinline__ void produce_tile(SharedStorage<Cfg>& s, const FwdParams& p,
                                             const kernel::TileCoords& tile,
                                             const TileWork<Cfg, kMasked>& w, int ring, int q_round,
                                             int tid, uint32_t rank, Trace<Cfg::kTrace>& trace) {
  constexpr int kStages = Cfg::kStages;
  const int kv_head = tile.head / p.h_ratio, n_blocks = w.blocks.count(), n_max = w.blocks.n_max;
  const auto load_q = [&] {
    if (tid == 0) {
      s.q_empty.wait((q_round & 1) ^ 1);
      s.q_full.arrive_expect_tx(Cfg::kQBytes);
#pragma unroll
      for (int c = 0; c < Cfg::kChunks; ++c)
        tma_load_4d(s.q[c], &p.tma_q, s.q_full, c * Cfg::kChunkCols, w.seq.q_start + w.m0,
                    tile.head, w.q_z(p));
    }
    trace(kProducerQ);
  };
  // kFirstKBeforeQ: the first K block goes first, since its stage frees one QK^T before Q does
  // (after the previous tile's second-to-last QK^T; Q after its last, or with kOInQ after its
  // O stores), and the consumers need both for the first QK^T. Not with kCp: there the copies
  // bound the time, and Q's coordinates live into the copy loop spilled 8-16 more bytes of the
  // 32-register producer (ptxas).
  constexpr bool kFirstKBeforeQ = Cfg::kFirstKBeforeQ && !kCp;
  if constexpr (!kFirstKBeforeQ) load_q();
  const KvSource src = kv_source(p, w);
  // kv_cp_async: this lane's page of the K block, of the V block (the K block one step earlier)
  // and of the next K block, read ahead.
  const int32_t* table = p.block_table + w.b * p.block_table_stride;
  const int lane = tid % 32;
  int pages_k = 0, pages_v = 0;
  int pages_next = kCp ? block_pages<Cfg>(p, table, w.seq.kv_len, n_max - 1, lane) : 0;
  for (int i = 0; i <= n_blocks; ++i) {
    pages_v = pages_k;
    pages_k = pages_next;
    if (kCp && i + 1 < n_blocks)
      pages_next = block_pages<Cfg>(p, table, w.seq.kv_len, n_max - 2 - i, lane);
    if (i < n_blocks) {
      const int slot = ring + i, st = slot % kStages, block = n_max - 1 - i;
      s.k_empty[st].wait(((slot / kStages) & 1) ^ 1);
      if constexpr (kCp) {
        copy_kv<Cfg>(p, p.k_pool, p.k_page_stride, p.k_row_stride, p.k_head_stride, s.k[st],
                     s.kv_rows[0], pages_k, w.seq.kv_len, block, kv_head, tid);
        s.k_full[st].arrive_on_cp_async();
      } else {
        load_kv<Cfg>(p, &p.tma_k, s.k[st], s.k_full[st], src, block, kv_head, rank);
      }
      trace(kProducerK);
    }
    if constexpr (kFirstKBeforeQ)
      if (i == 0) load_q();
    if (i > 0) {
      const int slot = ring + i - 1, st = slot % kStages, block = n_max - i;
      s.v_empty[st].wait(((slot / kStages) & 1) ^ 1);
      if constexpr (Cfg::kFp8) {
        load_vt<Cfg>(p, s.v[st], s.v_full[st], w.b, block, kv_head);
      } else if constexpr (kCp) {
        copy_kv<Cfg>(p, p.v_pool, p.v_page_stride, p.v_row_stride, p.v_head_stride, s.v[st],
                     s.kv_rows[1], pages_v, w.seq.kv_len, block, kv_head, tid);
        s.v_full[st].arrive_on_cp_async();
      } else {
        load_kv<Cfg>(p, &p.tma_v, s.v[st], s.v_full[st], src, block, kv_head, rank);
      }
      trace(kProducerV);
    }
  }
}

// The producer's walk over its CTA's tiles: thread 0 announces each (and, past the last one,
// num_tiles) to the consumers and loads Q (and K/V by TMA); with kCp all 128 producer threads
// walk the same tiles, copying K/V, and take the counter's next tile from thread 0 through
// shared memory between two producers_sync. With multicast the grid's entries are the clusters'
// (cta_tile), walked by both CTAs of a cluster in the same order (no counter: unmasked grids).
template <class Cfg, bool kMasked, bool kCp>
__device__ __forceinline__ void produce_tiles(SharedStorage<Cfg>& s, const FwdParams& p, int tid) {
  Trace<Cfg::kTrace> trace(p.trace, 0, tid == 0);
  const uint32_t rank = cta_rank<Cfg>();
  const int stride = gridDim.x / Cfg::kCluster;
  int ring = 0, q_round = 0;
  for (int t = blockIdx.x / Cfg::kCluster, k = 0;; ++k) {
    // (Two copies of the same steps rather than one with lambdas: captured by a lambda, ring and
    // q_round changed the register-store kernels' machine code, scripts/kernel-identity.py.)
    if constexpr (Cfg::kAnnounceWork) {
      // The work first, since the announcement carries it (past the last tile, the last tile's:
      // the consumers stop at num_tiles without reading it).
      const kernel::TileCoords tile = cta_tile<Cfg>(p, min(t, p.num_tiles - 1));
      const TileWork<Cfg, kMasked> w(p, tile);
      if (tid == 0) {
        s.tile_empty[k % 2].wait(((k / 2) & 1) ^ 1);
        s.tile[k % 2] = TileSlot{t, tile, w.seq};
        s.tile_full[k % 2].arrive();
      }
      trace(kProducerTile);
      if (t >= p.num_tiles) break;
      if (w.valid() && w.blocks.count() > 0) {
        produce_tile<Cfg, kMasked, kCp>(s, p, tile, w, ring, q_round, tid, rank, trace);
        ring += w.blocks.count();
        ++q_round;
      }
    } else {
      if (tid == 0) {
        s.tile_empty[k % 2].wait(((k / 2) & 1) ^ 1);
        s.tile[k % 2] = t;
        s.tile_full[k % 2].arrive();
      }
      trace(kProducerTile);
      if (t >= p.num_tiles) break;
      const kernel::TileCoords tile = cta_tile<Cfg>(p, t);
      const TileWork<Cfg, kMasked> w(p, tile);
      if (w.valid() && w.blocks.count() > 0) {
        produce_tile<Cfg, kMasked, kCp>(s, p, tile, w, ring, q_round, tid, rank, trace);
        ring += w.blocks.count();
        ++q_round;
      }
    }
    if (p.tile_counter == nullptr) {
      t += stride;
    } else if constexpr (!kCp) {
      t = gridDim.x + atomicAdd(p.tile_counter, 1);
    } else {
      if (tid == 0) s.producer_tile = gridDim.x + atomicAdd(p.tile_counter, 1);
      producers_sync();
      t = s.producer_tile;
      producers_sync();  // every thread has read it before thread 0 writes the next
    }
  }
  // The copies still in flight land before the thread leaves.
  if constexpr (kCp) asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// ---------------------------------------------------------------------------------------------
// Consumers

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct AddOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// Reduces row kH's share of a score fragment (sc[4i + 2kH + e], elements kLo .. kHi - 1 of the
// row in the order i, e) by a balanced tree: depth log2 of the count instead of a chain as long
// as the row. With ping-pong a consumer warp has its SM sub-partition to itself while it runs
// its softmax (the other warpgroup waits on its GEMM), so nothing hides a chain's latency.
template <int kH, int kLo, int kHi, int kN, class Op>
__device__ __forceinline__ float reduce_row(const float (&sc)[kN], Op op) {
  if constexpr (kHi - kLo == 1) {
    return sc[4 * (kLo / 2) + 2 * kH + kLo % 2];
  } else {
    constexpr int kMid = (kLo + kHi) / 2;
    return op(reduce_row<kH, kLo, kMid>(sc, op), reduce_row<kH, kMid, kHi>(sc, op));
  }
}

// The online softmax of this thread's two rows (h = 0: row lane/4 of the warp's 16, h = 1: row
// lane/4 + 8). The max is the quad's (the four threads of a row); the sum is this thread's share,
// added over the quad at the end.
//
// kLazy (TileConfig::kLazyRescale), FlashAttention-4's lazy rescaling: a row keeps its running
// max until a block's max exceeds it by more than kRescaleLog2 in exp2's argument. Past the first
// blocks a row's max rarely grows that much, so most steps leave O alone. P is then at most 2^8,
// as exact in bf16/fp16 as any other value and far from their ranges; the sum and O accumulate in
// fp32, and the LSE uses the max the row kept.
//
// kPOffset (the fp8 tiles: 8): P = 2^kPOffset exp2(scale_log2 (s - max)), FlashAttention-3's
// fixed scale of P into e4m3's range (the row's largest P is 256, e4m3's largest value 448); the
// sum carries the same factor, and the epilogue takes kPOffset ln 2 off the LSE.
//
// kExp2FmaEvery (TileConfig's; 0: none): the exponentials of every kExp2FmaEvery-th 8-column
// chunk of the block (elements 4c .. 4c + 3 of sc: both rows' two columns of chunk c) are
// computed by exp2_poly on the FMA pipe, the others by MUFU.EX2 (tile_config.h Exp2Fma).
template <bool kLazy, int kPOffset = 0, int kExp2FmaEvery = 0>
struct RowState {
  static constexpr float kRescaleLog2 = 8.0f;
  float max[2] = {-INFINITY, -INFINITY};
  float sum[2] = {0.0f, 0.0f};

  // Folds a block of scores into the state: sc becomes exp2(scale_log2 (s - max)); sets, per row,
  // the factor by which O accumulated so far must be rescaled (1 where a lazy row kept its max)
  // and returns whether O must be rescaled: always when eager; lazy, whether any row of the warp
  // took a new max (a vote, so a branch on it is warp-uniform).
  template <int kN>
  __device__ __forceinline__ bool update(float (&sc)[kN], float scale_log2, float (&rescale)[2]) {
    float mx[2] = {reduce_row<0, 0, kN / 2>(sc, MaxOp{}), reduce_row<1, 0, kN / 2>(sc, MaxOp{})};
    float mx_scaled[2];
    bool grew = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      const float m_new = fmaxf(mx[h], max[h]);
      // Lazy: a row without a max (-inf) takes any finite one (inf > threshold); -inf against
      // -inf is NaN, not greater: the row keeps -inf.
      const bool grow = !kLazy || (m_new - max[h]) * scale_log2 > kRescaleLog2;
      const float m = grow ? m_new : max[h];
      // A row that has seen no key yet keeps max -inf: subtract 0 so exp2 gives 0, not NaN.
      mx_scaled[h] = m == -INFINITY ? 0.0f : m * scale_log2;
      rescale[h] = grow ? exp2_approx(max[h] * scale_log2 - mx_scaled[h]) : 1.0f;
      if constexpr (kPOffset != 0) mx_scaled[h] -= static_cast<float>(kPOffset);
      max[h] = m;
      grew |= grow;
    }
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const float x = fmaf(sc[i], scale_log2, -mx_scaled[(i / 2) % 2]);
      if constexpr (kExp2FmaEvery > 0)
        sc[i] = i / 4 % kExp2FmaEvery == kExp2FmaEvery - 1 ? exp2_poly(x) : exp2_approx(x);
      else
        sc[i] = exp2_approx(x);
    }
    sum[0] = sum[0] * rescale[0] + reduce_row<0, 0, kN / 2>(sc, AddOp{});
    sum[1] = sum[1] * rescale[1] + reduce_row<1, 0, kN / 2>(sc, AddOp{});
    if constexpr (kLazy)
      return __any_sync(0xffffffffu, grew);
    else
      return true;
  }
};

// The row state of tile Cfg: P scaled by 2^8 with kFp8; part of the exponentials on the FMA pipe
// with Exp2Fma.
template <class Cfg>
using RowsOf = RowState<Cfg::kLazyRescale, Cfg::kFp8 ? 8 : 0, Cfg::kExp2FmaEvery>;

// The descale factor of sequence b, KV head hk in `d` (null: 1).
__device__ __forceinline__ float descale_of(const float* d, int64_t batch_stride,
                                            int64_t head_stride, int b, int hk) {
  return d == nullptr ? 1.0f : d[b * batch_stride + hk * head_stride];
}

// The factor of a tile's scores beyond the softmax scale: q_descale k_descale of its sequence
// and KV head with kFp8 (the kernel multiplies the codes), else 1.
template <class Cfg>
__device__ __forceinline__ float score_descale(const FwdParams& p, int b, int hk) {
  if constexpr (Cfg::kFp8)
    return descale_of(p.q_descale, p.q_descale_batch_stride, p.q_descale_head_stride, b, hk) *
           descale_of(p.k_descale, p.k_descale_batch_stride, p.k_descale_head_stride, b, hk);
  else
    return 1.0f;
}

// The keys this thread's two rows see (h = 0: the fragment's row row0, h = 1: row0 + 8), [lo[h],
// hi[h]]: before kv_len and, masked, inside the window (mask.h). Computed once per tile, so that
// the key loop holds four numbers instead of the lengths, the row and the window.
template <bool kMasked>
struct RowKeys {
  int lo[2], hi[2];

  __device__ __forceinline__ RowKeys(int row0, int q_len, int kv_len, int left, int right) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int pos = kv_len - q_len + row0 + 8 * h;  // the row's key position
      lo[h] = 0;
      hi[h] = kv_len - 1;
      if constexpr (kMasked) {
        if (right >= 0) hi[h] = min(hi[h], pos + right);
        if (left >= 0) lo[h] = pos - left;
      }
    }
  }
};

// Scores of the keys a row does not see (RowKeys) become -inf; key0 is the block's first key.
template <bool kMasked, int kN>
__device__ __forceinline__ void mask_scores(float (&sc)[kN], int key0, const RowKeys<kMasked>& rk) {
  const int col0 = key0 + 2 * (threadIdx.x % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < kN / 4; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = col0 + 8 * i + e;
        if ((kMasked && col < rk.lo[h]) || col > rk.hi[h]) sc[4 * i + 2 * h + e] = -INFINITY;
      }
}

// Rows `from` .. kBlockN - 1 of a V block become zeros (p.zero_v_tail): whole 128-byte rows, so
// the swizzle (which permutes 16-byte units within a row) needs no care. Every consumer
// warpgroup zeroes the rows before its own P V reads them (the warpgroups write the same zeros,
// so no order between them matters), then fences its writes to the async proxy that wgmma reads
// through, and syncs its 128 threads.
template <class Cfg>
__device__ __forceinline__ void zero_v_rows(uint8_t (&v)[Cfg::kChunks][Cfg::kKVChunkBytes],
                                            int from, int tid) {
  const int units = (Cfg::kBlockN - from) * 8;  // 16-byte units per chunk
#pragma unroll
  for (int c = 0; c < Cfg::kChunks; ++c)
    for (int u = tid; u < units; u += 128)
      *reinterpret_cast<uint4*>(v[c] + from * 128 + u * 16) = make_uint4(0, 0, 0, 0);
}

template <int kD>
__device__ __forceinline__ void rescale_o(float (&o)[kD / 2], const float (&rescale)[2]) {
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) {
    o[4 * i + 0] *= rescale[0];
    o[4 * i + 1] *= rescale[0];
    o[4 * i + 2] *= rescale[1];
    o[4 * i + 3] *= rescale[1];
  }
}

// The K-major descriptor of a Q or K tile: 128-byte swizzled rows, or 64-byte ones (kRowBytes;
// the fp8 tiles at d64).
template <class Cfg>
__device__ __forceinline__ uint64_t qk_desc(const void* tile) {
  if constexpr (Cfg::kRowBytes == 128)
    return smem_desc_sw128(tile, 16, 1024);
  else
    return smem_desc_sw64(tile, 16, 512);
}

// S = Q K^T over kQkSteps k-steps (d/16 16-bit, d/32 fp8 columns: 32 bytes of a row either
// way); step k reads column chunk k / kRow at byte 32 (k % kRow) of each row, kRow the k-steps
// per row (4; 2 for 64-byte rows).
template <class Cfg, bool kBf16>
__device__ __forceinline__ void issue_qk(float (&sc)[Cfg::kBlockN / 2], uint64_t q_desc,
                                         const uint8_t* k_tile) {
  constexpr int kRow = Cfg::kRowBytes / 32;
  const uint64_t k_desc = qk_desc<Cfg>(k_tile);
#pragma unroll
  for (int k = 0; k < Cfg::kQkSteps; ++k) {
    const uint32_t off = (k % kRow) * 32;
    const uint64_t a = desc_advance(q_desc, (k / kRow) * Cfg::kQChunkBytes + off);
    const uint64_t b = desc_advance(k_desc, (k / kRow) * Cfg::kKVChunkBytes + off);
    if constexpr (Cfg::kFp8)
      mma_ss_e4m3<Cfg::kBlockN>(sc, a, b, k > 0);
    else
      mma_ss<Cfg::kBlockN, kBf16>(sc, a, b, k > 0);
  }
  wgmma_commit();
}

// O += P V: V is [keys, d] row-major, MN-major for this B; 16 keys (2 atoms, 2048 bytes) per
// k-step; LBO steps from one 64-column chunk of V to the next.
// kFp8: V^T [d, keys] is K-major; 32 keys (32 bytes of each row) per k-step, 4 steps per box of
// 128 keys (SBO: 8 rows, head-dim indices, of 128 bytes) or 2 per box of 64 (8 rows of 64 bytes,
// 64-byte swizzle).
template <class Cfg, bool kBf16>
__device__ __forceinline__ void issue_pv(float (&o)[Cfg::kHeadDim / 2],
                                         const uint32_t (&pa)[Cfg::kPSteps][4],
                                         const uint8_t* v_tile) {
  if constexpr (Cfg::kFp8) {
    constexpr int kBox = Cfg::kVtBoxKeys / 32;  // k-steps per box
    const uint64_t v_desc = Cfg::kVtBoxKeys == 128 ? smem_desc_sw128(v_tile, 16, 1024)
                                                   : smem_desc_sw64(v_tile, 16, 512);
#pragma unroll
    for (int kk = 0; kk < Cfg::kPSteps; ++kk)
      mma_rs_e4m3<Cfg::kHeadDim>(
          o, pa[kk], desc_advance(v_desc, (kk / kBox) * Cfg::kVChunkBytes + (kk % kBox) * 32), 1);
  } else {
    const uint64_t v_desc = smem_desc_sw128(v_tile, Cfg::kKVChunkBytes, 1024);
#pragma unroll
    for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk)
      mma_rs<Cfg::kHeadDim, kBf16>(o, pa[kk], desc_advance(v_desc, kk * 16 * 128), 1);
  }
  wgmma_commit();
}

// Four floats as e4m3 bytes (round to nearest even, saturating at 448), x0 in the lowest.
__device__ __forceinline__ uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  uint16_t lo, hi;  // cvt puts its first source in the upper byte
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// P as the A operand of the fp8 RS wgmma, straight from the accumulator: k-step j (32 keys) is
// accumulator columns 32 j .. 32 j + 31, of which this thread holds, per row, columns
// 8 g + 2 q + {0, 1} of the groups g = 4 j .. 4 j + 3 (sc[4 g + 2 h + e], h the row half).
// Register v1 + 2 v2 takes row half v1's pairs of groups 4 j + 2 v2 and 4 j + 2 v2 + 1, in order
// (tile_config.h fp8_p_element); the A fragment reads them as columns 16 v2 + 4 q ..
// 16 v2 + 4 q + 3, and V^T's keys are permuted to match (fp8_vt_key).
template <int kN>
__device__ __forceinline__ void to_e4m3_operand(const float (&sc)[kN], uint32_t (&pa)[kN / 16][4]) {
#pragma unroll
  for (int j = 0; j < kN / 16; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float* c = sc + 16 * j;
      pa[j][r] = pack_e4m3x4(c[fp8_p_element(4 * r)], c[fp8_p_element(4 * r + 1)],
                             c[fp8_p_element(4 * r + 2)], c[fp8_p_element(4 * r + 3)]);
    }
}

// P from the softmax's scores to the A operand of P V: 16-bit pairs, or e4m3 with kFp8.
template <class Cfg, bool kBf16>
__device__ __forceinline__ void p_operand(const float (&sc)[Cfg::kBlockN / 2],
                                          uint32_t (&pa)[Cfg::kPSteps][4]) {
  if constexpr (Cfg::kFp8)
    to_e4m3_operand(sc, pa);
  else
    to_operand<kBf16>(sc, pa);
}

// One arrival per consumer warp: its warpgroup's GEMM that read the buffer has completed.
// `when` (warp-uniform) is folded into the arrival's predicate rather than branched on, so that it
// can sit between a wgmma's issue and its wait.
__device__ __forceinline__ void release(Mbarrier& empty, bool when = true) {
  __syncwarp();
  empty.arrive_if(when && threadIdx.x % 32 == 0);
}

// The release of a K or V stage: with multicast, on both CTAs' twins of the barrier (either CTA's
// producer writes both copies of the stage).
template <class Cfg>
__device__ __forceinline__ void release_kv(Mbarrier& empty) {
  if constexpr (Cfg::kCluster == 1) {
    release(empty);
  } else {
    __syncwarp();
#pragma unroll
    for (uint32_t r = 0; r < Cfg::kCluster; ++r) empty.arrive_cluster_if(threadIdx.x % 32 == 0, r);
  }
}

// The 128 threads of consumer warpgroup cw (named barriers 1 .. kConsumers are the warp
// scheduler's; these are 8 + cw).
__device__ __forceinline__ void epilogue_sync(int cw) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(8 + cw) : "memory");
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

// The epilogue of one consumer warpgroup's 64 rows of `tile` (cw c: tile rows 64c .. 64c + 63,
// tid its thread 0..127): O / sum and LSE; rows past q_len are not stored. With kTmaStoreO, O
// goes to the warpgroup's staging (o_chunk) and thread 0 stores it with TMA (tma_box_in_sequence;
// the rows past q_len fall outside the tensor map and are not written), so the warpgroup moves
// on to its next tile while the store drains. A staging buffer of its own is written again only
// once the previous tile's stores have read it. Staged in Q (kOInQ), `keyed` says whether the
// tile had key blocks and so a Q load of its own: only then may O go there (the producer loads
// no Q for a tile without keys, and may already have loaded the next tile's), and only then does
// the warpgroup release Q (q_empty, 4 arrivals: its warps'), once its O has left it.
template <class Cfg, bool kBf16>
__device__ __forceinline__ void store_tile(SharedStorage<Cfg>& s, const FwdParams& p,
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
        if (t < seq.q_len) *reinterpret_cast<uint4*>(reinterpret_cast<uint8_t*>(out) + 16 * g) = v;
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

// One consumer warpgroup (cw c of the tile's 64-row slices, tid its thread 0..127) over all of
// its CTA's tiles, as the producer announces them; `ring` and `q_round` count as in
// produce_tile. Per tile with keys: the first block's QK^T alone, then steps of QK^T(i) with
// PV(i - 1), then the last PV and the epilogue. (Carrying the last PV into the next tile's first
// step, beside its first QK^T, with Q double-buffered, measured no faster: docs/kernel-notes.md,
// run 40.)
template <class Cfg, bool kBf16, bool kMasked>
__device__ __forceinline__ void consume_tiles(SharedStorage<Cfg>& s, const FwdParams& p, int cw,
                                              int tid) {
  constexpr int kBlockN = Cfg::kBlockN, kD = Cfg::kHeadDim;
  constexpr int kStages = Cfg::kStages;
  const int warp = tid / 32, lane = tid % 32;
  // The turns of the warp scheduler run on from one tile to the next (a warpgroup may start
  // the next tile while the others finish this one).
  WarpScheduler<Cfg::kConsumers> sched(cw);
  Trace<Cfg::kTrace> trace(p.trace, 1 + cw, tid == 0);

  float o[kD / 2];
  RowsOf<Cfg> rows;
  float sc[kBlockN / 2];
  uint32_t pa[Cfg::kPSteps][4];
  float rescale[2];
  int ring = 0, q_round = 0;
  for (int k = 0;; ++k) {
    s.tile_full[k % 2].wait((k / 2) & 1);
    // Every thread reads the slot before its own arrival; lane 0's value, broadcast, lets ptxas
    // see that what follows from it is warp-uniform (a branch it cannot prove uniform between a
    // wgmma's issue and its wait serializes the wgmmas: C7520).
    const auto uniform = [](int v) { return __shfl_sync(0xffffffffu, v, 0); };
    int t;
    kernel::TileCoords tile{};
    kernel::SeqLens announced{};
    if constexpr (Cfg::kAnnounceWork) {
      const TileSlot& slot = s.tile[k % 2];
      t = uniform(slot.t);
      tile = {uniform(slot.coords.m_block), uniform(slot.coords.head), uniform(slot.coords.z)};
      announced = {uniform(slot.seq.q_start), uniform(slot.seq.q_len), uniform(slot.seq.k_start),
                   uniform(slot.seq.kv_len)};
    } else {
      t = uniform(s.tile[k % 2]);
    }
    s.tile_empty[k % 2].arrive();
    trace(kTileRead);
    if (t >= p.num_tiles) break;
    if constexpr (!Cfg::kAnnounceWork) tile = cta_tile<Cfg>(p, t);
    const TileWork<Cfg, kMasked> w = [&] {
      if constexpr (Cfg::kAnnounceWork)
        return TileWork<Cfg, kMasked>(p, tile, announced);
      else
        return TileWork<Cfg, kMasked>(p, tile);
    }();
    if (!w.valid()) continue;  // no rows: nothing to load or store
    const int q_len = w.seq.q_len, kv_len = w.seq.kv_len;
    const int n_min = w.blocks.n_min, n_max = w.blocks.n_max, n_blocks = w.blocks.count();
    // The epilogue reads the sequence's first row and length again rather than holding them
    // through the key loop (registers are what the consumers lack; the reads are a few loads).
    const auto seq_again = [&] { return seq_lens_of(p, seq_of(p, tile)); };
    if (n_blocks == 0) {  // no row sees a key: O = 0, LSE = -inf
#pragma unroll
      for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
      rows = RowsOf<Cfg>{};
      store_tile<Cfg, kBf16>(s, p, tile, w.seq, cw, tid, o, rows, /*keyed=*/false, trace);
      continue;
    }
    // The two rows of this thread in the accumulator fragment (wgmma.h), as query indices.
    const int row0 = w.m0 + cw * 64 + warp * 16 + lane / 4;
    // The blocks whose every key this warpgroup's rows see, [lo, hi), run without a mask; step i
    // works on block n_max - 1 - i, so steps 1 .. hi_steps - 1 and lo_steps .. n_blocks - 1 are
    // masked. (Only the rows before q_len count: the others are never stored.)
    const kernel::KeyBlocks<64, kBlockN, kMasked> mine(w.m0 + cw * 64, q_len, kv_len, p.window_left,
                                                       p.window_right);
    const int hi = min(max(mine.full_hi, n_min), n_max), lo = min(max(mine.full_lo, n_min), hi);
    const int hi_steps = n_max - hi, lo_steps = n_max - lo;
    const RowKeys<kMasked> row_keys(row0, q_len, kv_len, p.window_left, p.window_right);
    const auto mask = [&](int j) { mask_scores<kMasked>(sc, j * kBlockN, row_keys); };
    // Q's descriptor for this warpgroup's 64 rows (8 atoms of 8 rows, 1024 bytes apart).
    const uint64_t q_desc = qk_desc<Cfg>(s.q[0] + cw * 64 * Cfg::kRowBytes);
    // The scores' scale in exp2's units; kFp8 with the tile's q and k descale factors. The 16-bit
    // tiles read p.scale_log2 where they use it, as before the fp8 tiles (a copy held through
    // the key loop changed d256's register allocation; scripts/kernel-identity.py --family sm90).
    [[maybe_unused]] const float fp8_scale_log2 =
        Cfg::kFp8 ? p.scale_log2 * score_descale<Cfg>(p, w.b, tile.head / p.h_ratio) : 0.0f;
    const auto scale_log2 = [&] {
      if constexpr (Cfg::kFp8)
        return fp8_scale_log2;
      else
        return p.scale_log2;
    };

    {
      // The first block (the last keys): S only; O is still zero.
      const int st = ring % kStages;
      s.q_full.wait(q_round & 1);
      trace(kQReady);
      sched.wait_turn();
      trace(kTurn);
      s.k_full[st].wait((ring / kStages) & 1);
      trace(kKReady);
      wgmma_fence();
      issue_qk<Cfg, kBf16>(sc, q_desc, s.k[st][0]);
      sched.pass_turn();
      trace(kIssued);
      wgmma_wait<0>();
      fence_regs(sc);
      trace(kSReady);
      release_kv<Cfg>(s.k_empty[st]);
      // The tile's last QK^T is done (kOInQ: Q is released after O has left it, store_tile).
      release(s.q_empty, !Cfg::kOInQ && n_blocks == 1);
      if (n_max - 1 >= hi || n_max - 1 < lo) mask(n_max - 1);
      rows = RowsOf<Cfg>{};
      rows.update(sc, scale_log2(), rescale);
      trace(kSoftmaxDone);
#pragma unroll
      for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
      fence_regs(o);  // the zeros stay here, before the next step's wgmma fence
      p_operand<Cfg, kBf16>(sc, pa);
      // The first block's V rows past the last key, where they are not TMA's zero fill
      // (FwdParams::zero_v_tail), are zeroed before any P V reads them. No wgmma is in flight.
      // (kFp8: V^T's pre-pass wrote zeros there, fp8_vt.h.)
      if constexpr (!Cfg::kFp8) {
        const int tail_from = kv_len - (n_max - 1) * kBlockN;
        if (p.zero_v_tail && tail_from < kBlockN) {
          s.v_full[st].wait((ring / kStages) & 1);
          zero_v_rows<Cfg>(s.v[st], tail_from, tid);
          fence_shared_to_async();
          epilogue_sync(cw);
        }
      }
      trace(kStepEnd);
    }
    // Step i: S of block i (keys n_max - 1 - i) with P V of block i - 1 in flight. Between the
    // two waits nothing branches: at a join with P V in flight ptxas places the wait for it
    // (run 44's SASS: every kernel waited for P V before the softmax's exponentials, so the
    // softmax never ran under its own warpgroup's P V). The steps whose blocks need a mask run
    // as loops of their own, with the mask compiled in.
    const auto step = [&](int i, auto masked) {
      const int slot = ring + i, st = slot % kStages, prev = (slot - 1) % kStages;
      sched.wait_turn();
      trace(kTurn);
      s.k_full[st].wait((slot / kStages) & 1);
      trace(kKReady);
      wgmma_fence();
      issue_qk<Cfg, kBf16>(sc, q_desc, s.k[st][0]);
      s.v_full[prev].wait(((slot - 1) / kStages) & 1);
      wgmma_fence();  // after the wait's branch, ptxas wants the fence again before P V
      issue_pv<Cfg, kBf16>(o, pa, s.v[prev][0]);
      sched.pass_turn();
      trace(kIssued);
      wgmma_wait<1>();  // S is ready; P V still runs
      fence_regs(sc);
      trace(kSReady);
      release_kv<Cfg>(s.k_empty[st]);
      release(s.q_empty, !Cfg::kOInQ && i == n_blocks - 1);  // the tile's last QK^T is done
      if constexpr (decltype(masked)::value) mask(n_max - 1 - i);
      const bool rescale_warp = rows.update(sc, scale_log2(), rescale);
      // The fences keep the exponentials above the wait for P V in the PTX. ptxas still schedules
      // the wait after only some of them (run 45: 7-37 of 40-88); an arrival that depends on all
      // of them keeps it below, but measured slower (run 46: K released later).
      fence_regs(sc);
      fence_regs(rows.sum);
      trace(kSoftmaxDone);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      trace(kPvDone);
      release_kv<Cfg>(s.v_empty[prev]);
      if (rescale_warp) rescale_o<kD>(o, rescale);  // after the wait: no wgmma in flight
      p_operand<Cfg, kBf16>(sc, pa);
      trace(kStepEnd);
    };
    int i = 1;
    for (; i < hi_steps; ++i) step(i, std::true_type{});
    for (; i < lo_steps; ++i) step(i, std::false_type{});
    if constexpr (kMasked)  // a window's left edge: masked blocks again
      for (; i < n_blocks; ++i) step(i, std::true_type{});
    {
      // The last P V (block n_min), then the epilogue.
      const int slot = ring + n_blocks - 1, last = slot % kStages;
      s.v_full[last].wait((slot / kStages) & 1);
      wgmma_fence();
      issue_pv<Cfg, kBf16>(o, pa, s.v[last][0]);
      wgmma_wait<0>();
      fence_regs(o);
      trace(kEpilogueStart);
      release_kv<Cfg>(s.v_empty[last]);
      store_tile<Cfg, kBf16>(s, p, tile, seq_again(), cw, tid, o, rows, /*keyed=*/true, trace);
      trace(kEpilogueEnd);
    }
    ring += n_blocks;
    ++q_round;
  }
  sched.finish();
  if constexpr (Cfg::kTmaStoreO)
    if (tid == 0) tma_store_wait_all();  // the staging buffer lives as long as the CTA
}

template <class Cfg, bool kBf16, bool kMasked>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_kernel(const __grid_constant__ FwdParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStages = Cfg::kStages;
  extern __shared__ uint8_t smem_raw[];
  // Realigned by pointer arithmetic on the __shared__ array, not through an integer, so that the
  // compiler still knows every access through `s` is to shared memory (32-bit ld/st.shared, not
  // generic ones with 64-bit addresses; the backward's kernel, session 26).
  const uint32_t misalign = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) % 1024;
  auto& s = *reinterpret_cast<SharedStorage<Cfg>*>(smem_raw + (1024 - misalign) % 1024);

  // Broadcast from lane 0, so that ptxas knows the role is warp-uniform: a branch on a value it
  // cannot prove uniform between a wgmma's issue and its wait serializes the wgmmas (C7520).
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  const int tid = threadIdx.x % 128;

  if (threadIdx.x == 0) {
    s.q_full.init(1);
    s.q_empty.init(Cfg::kConsumerWarps);
    for (int i = 0; i < 2; ++i) {
      s.tile_full[i].init(1);
      s.tile_empty[i].init(Cfg::kConsumerWarps * 32);
    }
    // A full barrier completes on thread 0's TMA arrival and bytes, or with kv_cp_async on the
    // 128 producer threads' cp.async arrivals.
    const uint32_t fill_arrivals = Cfg::kPagedCpAsync && p.kv_cp_async ? 128 : 1;
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      s.k_full[st].init(fill_arrivals);
      s.v_full[st].init(fill_arrivals);
      // With multicast the consumer warps of both CTAs release each stage.
      s.k_empty[st].init(Cfg::kConsumerWarps * Cfg::kCluster);
      s.v_empty[st].init(Cfg::kConsumerWarps * Cfg::kCluster);
    }
    Mbarrier::fence_init();
  }
  if constexpr (Cfg::kCluster == 1)
    __syncthreads();
  else
    cluster_sync();  // the other CTA's barriers are ready before this one multicasts or arrives

  // The producer picks the tiles (the next one once it has issued a tile's loads) and announces
  // each, and past the last one num_tiles, to the consumers; both count the same ring slots and
  // Q rounds. Tiles without rows (varlen) or without keys (causal rows before the first key, a
  // window that misses every key) load nothing; those with rows store O = 0, LSE = -inf. The two
  // roles are the two branches of one if/else: ptxas applies each branch's setmaxnreg budget to
  // its register allocation only in that shape.
  if (warpgroup == 0) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    // Thread 0 alone with TMA; with kv_cp_async all 128 threads (a separate instantiation, so
    // that the TMA producer's registers are not the copy loop's: sharing one loop cost dense
    // d64/d128 tiles 2-4% at 512 keys, session 14).
    if constexpr (Cfg::kPagedCpAsync && Cfg::kCluster == 1) {
      if (p.kv_cp_async)
        produce_tiles<Cfg, kMasked, true>(s, p, tid);
      else if (tid == 0)
        produce_tiles<Cfg, kMasked, false>(s, p, tid);
    } else if (tid == 0) {
      produce_tiles<Cfg, kMasked, false>(s, p, tid);
    }
  } else {
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    consume_tiles<Cfg, kBf16, kMasked>(s, p, warpgroup - 1, tid);
  }
  // The other CTA's last arrivals on this one's barriers land before its shared memory goes.
  if constexpr (Cfg::kCluster > 1) cluster_sync();
#endif
}

}  // namespace flashserve::attention::sm90
