// The mainloop of the sm90 forward kernel (fwd_kernel.h): what the producer loads per tile and
// what a consumer warpgroup computes per tile, FwdMainloop.
// - load (the producer, per tile): Q once, then K and V blocks through a ring of kStages, K one
//   block ahead of V (the order the consumers use them in), by TMA (load_kv: boxes within pages
//   when paged, multicast to both CTAs of a cluster) or, for K/V in pages shorter than a key
//   block, by all 128 producer threads with cp.async (copy_kv, up to d128).
// - mma (a consumer warpgroup, per tile): per key block j, S = Q K^T (wgmma, both operands in
//   shared memory), the online softmax on the accumulator fragment (fwd_softmax.h), and
//   O += P V (wgmma, P from registers); QK^T of block j is issued together with PV of block
//   j - 1 and the softmax of j runs while PV(j - 1) is still in flight, and the WarpScheduler
//   makes the warpgroups take turns issuing. Key blocks go from the last to the first: the
//   masked blocks on the high side first, then the mask-free ones, then (a window's left edge)
//   masked again. Each stage is released as soon as its GEMM has read it (K after QK^T, V after
//   PV).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attention/kernel/block_mask.h"
#include "attention/kernel/seqlen.h"
#include "attention/kernel/tile_order.h"
#include "device_util.h"
#include "fwd_params.h"
#include "fwd_softmax.h"
#include "fwd_sync.h"
#include "fwd_tile_scheduler.h"
#include "mbarrier.h"
#include "tile_config.h"
#include "tma.h"
#include "trace.h"
#include "warp_scheduler.h"
#include "wgmma.h"

namespace flashserve::attention::sm90 {

// The kernel's shared memory (fwd_kernel.h): Q, the K/V ring and their barriers.
template <class Cfg>
struct SharedStorage;

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

// ---------------------------------------------------------------------------------------------
// Consumers

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

template <class Cfg_, bool kBf16_, bool kMasked_>
class FwdMainloop {
 public:
  using Cfg = Cfg_;
  static constexpr bool kBf16 = kBf16_, kMasked = kMasked_;
  using Work = TileWork<Cfg, kMasked>;

  // The producer, per tile: Q (once both consumers are done with the previous tile's Q), K of the
  // first block, then per step K of the next block and V of the current one. `ring` counts the K/V
  // blocks of earlier tiles: block i of this tile (key block n_max - 1 - i) is ring slot ring + i,
  // in stage slot % kStages; the producer waits for that stage's buffer to be released (a stage's
  // first round passes on the fresh barrier). `q_round` counts the earlier tiles with keys. With
  // kCp (kv_cp_async) every producer thread runs it (`tid`; thread 0 loads Q), else thread 0 alone.
  template <bool kCp>
  static __device__ __forceinline__ void load(SharedStorage<Cfg>& s, const FwdParams& p,
                                              const kernel::TileCoords& tile, const Work& w,
                                              int ring, int q_round, int tid, uint32_t rank,
                                              Trace<Cfg::kTrace>& trace) {
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

  // After the producer's last tile: the copies still in flight land before the thread leaves.
  template <bool kCp>
  static __device__ __forceinline__ void load_tail() {
    if constexpr (kCp) asm volatile("cp.async.wait_all;\n" ::: "memory");
  }

  // The registers a consumer warpgroup's key loop works in besides O and the row state: the
  // scores, P as the A operand of P V, the rows' rescale factors. Declared once for all of the
  // warpgroup's tiles (FwdKernel::consume).
  struct Scratch {
    float sc[Cfg::kBlockN / 2];
    uint32_t pa[Cfg::kPSteps][4];
    float rescale[2];
  };

  // One consumer warpgroup (cw c of the tile's 64-row slices, tid its thread 0..127) over tile
  // `tile` with key blocks (w): the first block's QK^T alone, then steps of QK^T(i) with
  // PV(i - 1), then the last PV; O (unnormalised) and the rows' softmax state are left in `o`
  // and `rows` for the epilogue. `ring` and `q_round` count as in load. (Carrying the last PV
  // into the next tile's first step, beside its first QK^T, with Q double-buffered, measured no
  // faster: docs/kernel-notes.md, run 40.)
  static __device__ __forceinline__ void mma(SharedStorage<Cfg>& s, const FwdParams& p,
                                             const kernel::TileCoords& tile, const Work& w, int cw,
                                             int tid, int ring, int q_round,
                                             WarpScheduler<Cfg::kConsumers>& sched,
                                             float (&o)[Cfg::kHeadDim / 2], RowsOf<Cfg>& rows,
                                             Scratch& scratch, Trace<Cfg::kTrace>& trace) {
    auto& sc = scratch.sc;
    auto& pa = scratch.pa;
    auto& rescale = scratch.rescale;
    constexpr int kBlockN = Cfg::kBlockN, kD = Cfg::kHeadDim;
    constexpr int kStages = Cfg::kStages;
    const int warp = tid / 32, lane = tid % 32;
    const int q_len = w.seq.q_len, kv_len = w.seq.kv_len;
    const int n_min = w.blocks.n_min, n_max = w.blocks.n_max, n_blocks = w.blocks.count();
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
      // The tile's last QK^T is done (kOInQ: Q is released after O has left it,
      // FwdEpilogue::store).
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
      // The last P V (block n_min); the epilogue follows (FwdKernel::consume).
      const int slot = ring + n_blocks - 1, last = slot % kStages;
      s.v_full[last].wait((slot / kStages) & 1);
      wgmma_fence();
      issue_pv<Cfg, kBf16>(o, pa, s.v[last][0]);
      wgmma_wait<0>();
      fence_regs(o);
      trace(kEpilogueStart);
      release_kv<Cfg>(s.v_empty[last]);
    }
  }
};

}  // namespace flashserve::attention::sm90
