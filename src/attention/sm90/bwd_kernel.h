// The sm90 (Hopper, sm_90a) backward kernel: FlashAttention-3's partitioning (hopper/
// mainloop_bwd_sm90_tma_gmma_ws.hpp, read, not copied), written from the PTX ISA with the
// forward's pieces (mbarrier.h, tma.h, wgmma.h, device_util.h).
//
// One CTA per (block of kBlockN = 128 keys, KV head, sequence) (a tile; persistent: tiles one after
// another); the GQA group's query heads loop inside it, so dK and dV are sums in registers (no
// atomics, no postprocess sum). Per step (one query head, one block of kBlockM queries that sees
// some of the block's keys: kernel::QueryBlocks), with Q, dO, LSE and D of the step in a 2-stage
// ring:
//   S^T  = K Q^T                     (SS wgmma, 64 keys x kBlockM queries per consumer)
//   P^T  = exp2(S^T scale log2(e) - LSE log2(e))   (0 where the mask hides the pair)
//   dP^T = V dO^T                    (SS)
//   dS^T = P^T o (dP^T - D)          (D = rowsum(dO o O) - dLSE: the shared preprocess)
//   dV  += P^T dO,  dK += dS^T Q     (RS: P^T and dS^T straight from the accumulators)
//   dQ   = dS K                      (SS, both operands transposed: dS^T through shared memory,
//                                     64 x 64 per consumer) added to the fp32 accumulator
//                                     in the workspace (kDqBulk: a shared-memory tile and a
//                                     TMA bulk reduce-add; else float2 atomics); the shared
//                                     postprocess scales and rounds it into dq (or, with
//                                     BwdParams::dq_counters, each unit's last CTA:
//                                     convert_dq_if_last).
// - Warpgroup 0, the producer, gives registers back; its warp 0 loads K and V once (TMA) and
//   per step Q and dO (TMA) and LSE and D (its 32 lanes, from global memory) into stage
//   i % kStages, after every consumer thread released that stage. LSE is stored as LSE log2(e),
//   +inf for rows past the sequence or without keys (lse -inf), so that P is exactly 0 there
//   without a mask.
// - Warpgroups 1 and 2, the consumers, own keys 64 w .. 64 w + 63 of the block (the M of S^T,
//   dP^T, dV, dK). dQ needs every key: both write their dS^T into a shared [key][query] tile
//   (double-buffered, so one named barrier per step suffices: a warpgroup reaches step i + 1's
//   barrier only after its dQ of step i has read the other buffer), sync, and each computes its
//   64 x 64 share of dQ (rows 64 w at d64 with kBlockM = 128, columns 64 w at d128).
// - dQ, two paths (FLASHSERVE_SM90_BWD_DQ_BULK, the template's kDqBulk). Atomics: each thread
//   adds its 32 values with float2 atomics, and the warps wait on the L1TEX round trips before
//   they reuse the registers (session 17's profile: 32% of the stall cycles). Bulk: each
//   warpgroup stores its 64 x 64 share into a 16 KB shared tile (TMA's 128-byte swizzle, as
//   boxes of 32 fp32 columns), arrives at a named barrier and goes on; the dQ writer, warp 1 of
//   warpgroup 0 (bwd_write_dq), issues two cp.reduce.async.bulk.tensor adds per tile into the
//   accumulator through a 4-D fp32 map of it (the same [q_rows][h_q][d] layout, so the shared
//   postprocess and the sm80 family are untouched) and frees the tile once they have read it;
//   the warpgroup writes it again a step later. kDqBulk also masks only the steps that need it
//   (QueryBlocks::needs_mask); the atomics' kernel is the session 16 kernel unchanged.
// - deterministic = true is not here: backward_cuda.cu runs sm80's fixed-order dq kernel
//   (sm80/bwd_kernel.h, bwd_dq_kernel) for it.
//
// - The step's order: each GEMM waited for before the next is issued (dV and dK together after
//   dS^T is stored, dQ after both), or, with Cfg::kOverlap (BwdOverlapTile,
//   FLASHSERVE_SM90_BWD_OVERLAP; the bulk kernel only), FlashAttention-3's: dV issued as soon as
//   P^T is packed (it runs under dS^T's packing, stores and the consumers' barrier), dK issued
//   right behind dQ (it runs under the dQ tile's stores), the stage released after dK. The same
//   products on the same operands in the same accumulation order: dK and dV keep their bits.
// - Launch order: the grid (key block, KV head, sequence) starts the key blocks of one (KV head,
//   sequence) after another; with Cfg::kHeavyFirst (BwdHeavyFirstTile,
//   FLASHSERVE_SM90_BWD_HEAVY_FIRST; masked calls of the bulk kernel) a 1-D grid in
//   tile_order.h's heaviest-first order, so that under a causal mask the long CTAs (key block 0
//   sees every query) do not start in the last wave.
// - Persistent grid (Cfg::kPersistent, BwdPersistentTile, FLASHSERVE_SM90_BWD_PERSISTENT; the bulk
//   kernel, off by default, written without a GPU: kernel-notes "Session 28"): one CTA per
//   multiprocessor taking tiles of one 1-D order (heaviest first when masked, else the 3-D grid's)
//   from a counter (bwd_persistent). The ring and the dQ hand-off continue across tiles; a
//   kv_empty barrier lets the next tile's K and V load under this tile's dK/dV stores.
// Still without (docs/kernel-notes.md, "sm90 backward", sessions 19-20): the next step's S^T and
// dP^T under this step's dQ (their accumulators do not fit beside dK, dV and dQ's).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "attention/kernel/block_mask.h"
#include "attention/kernel/dq_round.h"
#include "attention/kernel/seqlen.h"
#include "attention/kernel/tile_order.h"
#include "bwd_params.h"
#include "device_util.h"
#include "mbarrier.h"
#include "tile_config.h"
#include "tma.h"
#include "wgmma.h"

namespace flashserve::attention::sm90 {

// A descriptor the compiler must compute where it is used: the K and V descriptors of a step
// are the same in every step, and hoisted out of the query loop their k-step copies held ~40
// registers for the whole loop (d128 spilled 70-90 bytes, d64 170-240).
__device__ __forceinline__ uint64_t opaque(uint64_t desc) {
  asm volatile("" : "+l"(desc));
  return desc;
}

// What only the kDqBulk kernel keeps in shared memory (an empty base in the atomics' kernel):
// the consumers' dQ shares staged for the bulk reduce-add, per warpgroup kDqBoxes boxes of 64
// rows x 32 fp32 columns, each 1024-byte aligned for TMA's 128-byte swizzle; and the CTA's query
// blocks that need no mask, [mask_free[0], mask_free[1]) (QueryBlocks::needs_mask), read at the
// consumers' loop boundaries: held in registers through the steps, the extra bound made the
// masked kernels spill (ptxas, d128: 4 bytes).
template <class Cfg, bool kDqBulk>
struct BwdDqStage {
  alignas(1024) uint8_t dq[Cfg::kConsumers][Cfg::kDqBoxes][Cfg::kDqBoxBytes];
  int mask_free[2];
  int dq_last;  // the fused dQ conversion: this CTA counted its unit's last (count_dq_done)
};
template <class Cfg>
struct BwdDqStage<Cfg, false> {};

template <class Cfg, bool kDqBulk>
struct BwdSharedStorage : BwdDqStage<Cfg, kDqBulk> {
  // Every chunk is a 1024-byte aligned run of 8-row 128-byte swizzle atoms (wgmma.h).
  alignas(1024) uint8_t k[Cfg::kChunks][Cfg::kKVChunkBytes];
  alignas(1024) uint8_t v[Cfg::kChunks][Cfg::kKVChunkBytes];
  alignas(1024) uint8_t q[Cfg::kStages][Cfg::kChunks][Cfg::kQChunkBytes];
  alignas(1024) uint8_t dout[Cfg::kStages][Cfg::kChunks][Cfg::kQChunkBytes];
  // dS^T of a step as [key][query], written by the consumers, read by both for dQ.
  alignas(1024) uint8_t ds[2][Cfg::kDsChunks][Cfg::kDsChunkBytes];
  float lse2[Cfg::kStages][Cfg::kBlockM];   // LSE log2(e) of the step's queries (+inf: P = 0)
  float delta[Cfg::kStages][Cfg::kBlockM];  // D of the step's queries
  Mbarrier kv_full;                         // K and V landed (TMA bytes)
  // A stage's Q, dO (TMA bytes), LSE and D (the producer warp's 32 arrivals) landed / every
  // consumer thread is done with it.
  Mbarrier full[Cfg::kStages], empty[Cfg::kStages];
  // Cfg::kPersistent (last, so that the other members keep their offsets in every kernel):
  // kv_empty: every consumer thread is done with the tile's K and V (its last dQ, the last GEMM
  // that reads K, waited for), so the producer may load the next tile's while the consumers store
  // dK and dV. tile: the order's entry whose K and V kv_full's phase announces (-1: none left),
  // written by the producer before that arrival. writer_tile: the same entries for the dQ writer,
  // which may lag the consumers by a step: a ring of two (writer_full: written, the producer's
  // arrival; writer_empty: read, the writer warp's 32).
  Mbarrier kv_empty;
  Mbarrier writer_full[2], writer_empty[2];
  int tile;
  int writer_tile[2];
};

template <class Cfg, bool kDqBulk>
constexpr int bwd_smem_bytes() {
  return static_cast<int>(sizeof(BwdSharedStorage<Cfg, kDqBulk>)) + 1024;  // + the realignment
}

// The CTA's sequence and where its tensors' rows start: dense tensors by sequence (the maps'
// coordinate 3), varlen ones by row (one sequence of all rows).
struct BwdSeq {
  kernel::SeqLens lens;
  int b;
  __device__ __forceinline__ BwdSeq(const sm80::FwdParams& f, int batch)
      : lens(kernel::seq_lens(f.cu_seqlens_q, f.cu_seqlens_k, f.seqused_k, f.seqlen_q, f.seqlen_k,
                              batch)),
        b(batch) {}
  // Row of the sequence's query 0 among all rows of q (the workspace's row index, as
  // sm80::SeqInfo::q_row0).
  __device__ __forceinline__ int64_t q_row0(const sm80::FwdParams& f) const {
    return f.cu_seqlens_q ? int64_t{lens.q_start} : int64_t{b} * f.seqlen_q;
  }
};

// ---------------------------------------------------------------------------------------------
// Producer (warp 0 of warpgroup 0; `lane` 0..31)

// The ring's step counter `i` (stage i % kStages, round i / kStages) continues from one tile of a
// persistent CTA to the next; kv_phase is the parity of the CTA's tile (with keys) for kv_full and
// kv_empty, `tile` its entry in the order (0 and unused without Cfg::kPersistent: one tile).
// `s` is a BwdSharedStorage or the d256 kernel's (bwd_swapped_kernel.h): the same ring members.
template <class Cfg, bool kMasked, bool kDqBulk, class Smem>
__device__ __forceinline__ void bwd_produce(
    Smem& s, const BwdParams& bp, const BwdSeq& seq,
    const kernel::QueryBlocks<Cfg::kBlockM, Cfg::kBlockN, kMasked>& steps, int n_block, int kv_head,
    int lane, int& i, int kv_phase, int tile) {
  constexpr int kBM = Cfg::kBlockM, kStages = Cfg::kStages;
  const sm80::BwdParams& p = bp.p;
  const sm80::FwdParams& f = p.fwd;
  const bool varlen_q = f.cu_seqlens_q != nullptr, varlen_k = f.cu_seqlens_k != nullptr;
  const int q_row = varlen_q ? seq.lens.q_start : 0, q_z = varlen_q ? 0 : seq.b;
  const int k_row = varlen_k ? seq.lens.k_start : 0, kv_z = varlen_k ? 0 : seq.b;
  // K and V of the tile (lane 0). Persistent: once the consumers are done with the previous
  // tile's (kv_empty), and with its entry and mask-free query blocks, which the consumers read
  // until then (at their loop boundaries); kv_full's arrival releases this tile's with the bytes.
  const auto load_kv = [&] {
    if constexpr (Cfg::kPersistent) {
      s.kv_empty.wait(kv_phase ^ 1);
      if (lane == 0) {
        s.tile = tile;
        s.mask_free[0] = min(max(steps.full_lo, steps.m_min), steps.m_max);
        s.mask_free[1] = min(max(steps.full_hi, s.mask_free[0]), steps.m_max);
      }
    }
    if (lane == 0) {
      s.kv_full.arrive_expect_tx(2 * Cfg::kKVBytes);
#pragma unroll
      for (int c = 0; c < Cfg::kChunks; ++c) {
        tma_load_4d(s.k[c], &bp.tma_k, s.kv_full, c * Cfg::kChunkCols,
                    k_row + n_block * Cfg::kBlockN, kv_head, kv_z);
        tma_load_4d(s.v[c], &bp.tma_v, s.kv_full, c * Cfg::kChunkCols,
                    k_row + n_block * Cfg::kBlockN, kv_head, kv_z);
      }
    }
  };
  // Persistent: after the tile's first step is issued (its stage frees while the consumers are
  // still on the previous tile's second-to-last step; kv_empty only after its last), or, for a
  // tile without steps, after the (empty) loop.
  if constexpr (!Cfg::kPersistent) load_kv();
  [[maybe_unused]] const int first = i;
  const float log2e = 1.4426950408889634f;
  const int q_len = seq.lens.q_len;
  const int64_t lse_base =
      varlen_q ? int64_t{seq.lens.q_start} * f.lse_row_stride : int64_t{seq.b} * f.lse_batch_stride;
  const int64_t row0 = seq.q_row0(f);
  for (int h = kv_head * f.h_ratio; h < (kv_head + 1) * f.h_ratio; ++h) {
    const float* lse = f.lse + lse_base + h * f.lse_head_stride;
    for (int m = steps.m_min; m < steps.m_max; ++m, ++i) {
      const int st = i % kStages, m0 = m * kBM;
      s.empty[st].wait(((i / kStages) & 1) ^ 1);
#pragma unroll
      for (int r = lane; r < kBM; r += 32) {
        const int t = m0 + r;
        float l2 = INFINITY, d = 0.0f;
        if (t < q_len) {
          const float l = lse[t * f.lse_row_stride];
          l2 = l == -INFINITY ? INFINITY : l * log2e;
          d = p.delta[(row0 + t) * f.h_q + h];
        }
        s.lse2[st][r] = l2;
        s.delta[st][r] = d;
      }
      // Lane 0's arrival also announces the TMA bytes; the other lanes' release their stores.
      if (lane == 0) {
        s.full[st].arrive_expect_tx(2 * Cfg::kQBytes);
#pragma unroll
        for (int c = 0; c < Cfg::kChunks; ++c) {
          tma_load_4d(s.q[st][c], &bp.tma_q, s.full[st], c * Cfg::kChunkCols, q_row + m0, h, q_z);
          tma_load_4d(s.dout[st][c], &bp.tma_do, s.full[st], c * Cfg::kChunkCols, q_row + m0, h,
                      q_z);
        }
      } else {
        s.full[st].arrive();
      }
      if constexpr (Cfg::kPersistent)
        if (i == first) load_kv();
    }
  }
  if constexpr (Cfg::kPersistent)
    if (i == first) load_kv();
}

// ---------------------------------------------------------------------------------------------
// Consumers (warpgroups 1 and 2; `cw` 0 or 1, `tid` 0..127)

// acc (64 rows x kN) = A B^T over the head dim, both K-major: A = 64 rows of K or V (the
// warpgroup's keys), B = kN rows of the step's Q or dO (all kBlockM here; bwd_swapped_kernel.h's
// warpgroup its half). k-step k reads column chunk k / 4 at byte 32 (k % 4) of each row (as the
// forward's issue_qk).
template <class Cfg, bool kBf16, int kN = Cfg::kBlockM>
__device__ __forceinline__ void issue_over_d(float (&acc)[kN / 2], const uint8_t* a_tile,
                                             const uint8_t* b_tile) {
  const uint64_t a_desc = opaque(smem_desc_sw128(a_tile, 16, 1024));
  const uint64_t b_desc = smem_desc_sw128(b_tile, 16, 1024);
#pragma unroll
  for (int k = 0; k < Cfg::kHeadDim / 16; ++k) {
    const uint32_t off = (k % 4) * 32;
    mma_ss<kN, kBf16>(acc, desc_advance(a_desc, (k / 4) * Cfg::kKVChunkBytes + off),
                      desc_advance(b_desc, (k / 4) * Cfg::kQChunkBytes + off), k > 0);
  }
  wgmma_commit();
}

// acc (64 keys x d) += A B over the step's queries: A = P^T or dS^T from registers (the S^T /
// dP^T accumulators packed, device_util.h to_operand), B = dO or Q, [query, d] row-major: MN-major
// for this B (as V in the forward's P V), 16 queries (2048 bytes) per k-step, LBO one 64-column
// chunk to the next.
template <class Cfg, bool kBf16>
__device__ __forceinline__ void issue_over_queries(float (&acc)[Cfg::kHeadDim / 2],
                                                   const uint32_t (&a)[Cfg::kBlockM / 16][4],
                                                   const uint8_t* b_tile) {
  const uint64_t b_desc = smem_desc_sw128(b_tile, Cfg::kQChunkBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk)
    mma_rs<Cfg::kHeadDim, kBf16>(acc, a[kk], desc_advance(b_desc, kk * 16 * 128), 1);
}

// dq (64 queries x 64 columns) = dS K over the block's keys: A = dS, stored as dS^T [key][query]
// (MN-major for A: the queries contiguous), starting at the warpgroup's 64 queries; B = K,
// [key, d] (MN-major), starting at its 64 columns. 16 keys (2048 bytes) per k-step in both.
template <class Cfg, bool kBf16>
__device__ __forceinline__ void issue_dq(float (&dq)[Cfg::kDqCols / 2], const uint8_t* ds_tile,
                                         const uint8_t* k_tile) {
  const uint64_t a_desc = smem_desc_sw128(ds_tile, Cfg::kDsChunkBytes, 1024);
  const uint64_t b_desc = opaque(smem_desc_sw128(k_tile, Cfg::kKVChunkBytes, 1024));
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk)
    mma_ss_tt<Cfg::kDqCols, kBf16>(dq, desc_advance(a_desc, kk * 16 * 128),
                                   desc_advance(b_desc, kk * 16 * 128), kk > 0);
  wgmma_commit();
}

// One element of dS = P (dP - D); exactly 0 where P is.
__device__ __forceinline__ float ds_of(float p, float dp, float d) {
  return p != 0.0f ? p * (dp - d) : 0.0f;
}

// The consumer warpgroups' 256 threads (named barrier 1; 0 is __syncthreads).
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
}

// The dQ tile's hand-off between consumer warpgroup cw (128 threads) and the dQ writer warp (32;
// bwd_write_dq): named barriers of 160 threads, kDqFull + cw when the warpgroup's tile is
// written, kDqEmpty + cw when the writer's reduce-adds have read it. The consumers arrive at
// dq_full and go on (session 26's profile: with a 128-thread barrier there and one consumer
// thread issuing the reduce-adds, the barrier took 3.7% of the step's stall samples; cuDNN's
// backward hands its tile to another warp the same way) and sync on dq_empty before writing the
// tile again, a step later.
inline constexpr int kDqFull = 2, kDqEmpty = 4;  // 0: __syncthreads, 1: consumers_sync

// Named barrier kId of kThreads threads (immediates: an id in a register makes ptxas reserve all
// 16): wait for the others (kSync) or only arrive.
template <int kId, int kThreads, bool kSync>
__device__ __forceinline__ void named_barrier() {
  if constexpr (kSync)
    asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
  else
    asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
// Barrier kId of the dQ hand-off, 160 threads.
template <int kId, bool kSync>
__device__ __forceinline__ void dq_barrier_id() {
  named_barrier<kId, 160, kSync>();
}
// Barrier kFirst + cw: wait for the other side (kSync) or only arrive.
template <int kFirst, bool kSync>
__device__ __forceinline__ void dq_barrier(int cw) {
  if (cw == 0)
    dq_barrier_id<kFirst, kSync>();
  else
    dq_barrier_id<kFirst + 1, kSync>();
}

// A warpgroup's dQ share (64 queries x kDqCols columns in the accumulator's layout: rows
// 16 warp + lane / 4 + 8 r, columns 8 j + 2 (lane % 4) + {0, 1} at dq[4 j + 2 r + {0, 1}]) into
// its staging tile for the reduce-add: box j / 4 (32 columns each), row of 128 bytes, 16-byte
// unit (column % 32) / 4 swizzled by row % 8 (TMA's 128-byte pattern, which the dq_accum map's
// boxes expect). The swizzle keeps a warp's float2 stores of one (r, j), 8 rows x 32 bytes, on
// distinct banks: 2 wavefronts, the minimum for 256 bytes (unswizzled 256-byte rows: 8). As in
// store_ds, the row address with the thread's swizzle folded in is computed once (opaque) and
// each store XORs its compile-time unit in.
template <class Cfg>
__device__ __forceinline__ void store_dq_tile(uint8_t (&tile)[Cfg::kDqBoxes][Cfg::kDqBoxBytes],
                                              const float (&dq)[Cfg::kDqCols / 2], int warp,
                                              int lane) {
  const int row = warp * 16 + lane / 4;  // row % 8 = lane / 4
  const uint32_t base = static_cast<uint32_t>(
      opaque(static_cast<uint32_t>(__cvta_generic_to_shared(tile[0])) + row * 128 +
             ((((lane % 4) / 2) ^ (lane / 4)) << 4) + 8 * (lane % 2)));
#pragma unroll
  for (int j = 0; j < Cfg::kDqCols / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t addr =
          (base ^ ((2 * (j % 4)) << 4)) + (j / 4) * Cfg::kDqBoxBytes + r * 8 * 128;
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(dq[4 * j + 2 * r]),
                   "f"(dq[4 * j + 2 * r + 1])
                   : "memory");
    }
}

// The 64 keys of one consumer warpgroup (rows of S^T, dV, dK): this thread's two, and the queries
// each is seen by, [t_min, t_max]: the sequence's queries, within the bottom-right window
// (mask.h) when masked; empty (t_min = kNone) for a row past kv_len. Lengths are below 2^30
// (backward_cuda.cu), so t - m0 stays inside int32 for kNone too.
template <bool kMasked>
struct KeyRows {
  static constexpr int kNone = 1 << 30;
  int key[2];  // within the sequence
  int t_min[2], t_max[2];
  __device__ __forceinline__ KeyRows(int key0, int q_len, int kv_len, int left, int right) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      key[h] = key0 + 8 * h;
      const int pos = key[h] - (kv_len - q_len);  // the query at the key's position
      t_min[h] = kMasked && right >= 0 ? max(pos - right, 0) : 0;
      t_max[h] = kMasked && left >= 0 ? min(pos + left, q_len - 1) : q_len - 1;
      if (key[h] >= kv_len) t_min[h] = kNone;  // not a key: no query sees it
    }
  }
};

// dS^T (this thread's packed pairs, to_operand's layout: a[kk][r] = row r % 2 (key key_row0 +
// 8 (r % 2)), queries 16 kk + 8 (r / 2) + 2 (lane % 4) + {0, 1}) into the [key][query] tile:
// chunk query / 64, row `key` of 128 bytes, 16-byte unit (query % 64) / 8 swizzled by key % 8
// (TMA's 128-byte swizzle, which issue_dq's descriptor expects). One stmatrix x4 per 16 queries
// (cuDNN's backward stores its dS so; session 26's profile: our 16 st.shared.b32 a step at d128,
// beside the dQ tile's 16, kept the MIO queue full, 1.49 stall cycles an instruction against
// cuDNN's 0.07): matrix i of the four is a[kk][i], 8 keys (8 (i % 2) of the warp's 16) x 8
// queries (16 kk + 8 (i / 2)), exactly the registers' layout (row lane / 4, columns 2 (lane % 4)
// and + 1), and lane L gives the address of row L % 8 of matrix L / 8. Each matrix's 8 rows are 8
// keys in 8 distinct swizzled units: no bank conflict. The address with the lane's swizzle folded
// in is computed once per call (opaque: hoisted out of the query loop, swizzled offsets held
// registers for the whole loop and made d128 spill); each store XORs its compile-time unit in
// (2 kk % 8 is even and the lane's L / 16 is 0 or 1, so their sum is their XOR).
template <class Cfg>
__device__ __forceinline__ void store_ds(uint8_t (&ds)[Cfg::kDsChunks][Cfg::kDsChunkBytes],
                                         const uint32_t (&a)[Cfg::kBlockM / 16][4], int key_row0,
                                         int lane) {
  const int key = key_row0 - lane / 4 + lane % 8 + 8 * ((lane / 8) % 2);  // key % 8 = lane % 8
  const uint32_t base =
      static_cast<uint32_t>(opaque(static_cast<uint32_t>(__cvta_generic_to_shared(ds[0])) +
                                   key * 128 + (((lane / 16) ^ (lane % 8)) << 4)));
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk) {
    const uint32_t addr = (base ^ (((2 * kk) % 8) << 4)) + (kk / 4) * Cfg::kDsChunkBytes;
    stmatrix_x4(addr, a[kk][0], a[kk][1], a[kk][2], a[kk][3]);
  }
}

// One row of dK or dV (this thread's share: fragment row h) into global memory, 16 bytes at a
// time (store_row_vec16), scaled by `scale`.
template <int kD, bool kBf16>
__device__ __forceinline__ void store_grad_row(const float (&acc)[kD / 2], int h, float scale,
                                               uint8_t* row, bool valid, int lane) {
  uint32_t packed[kD / 8];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i)
    packed[i] = pack2<kBf16>(acc[4 * i + 2 * h] * scale, acc[4 * i + 2 * h + 1] * scale);
  store_row_vec16<kD>(packed, lane % 4, [&](int g, uint4 v) {
    if (valid) *reinterpret_cast<uint4*>(row + 16 * g) = v;
  });
}

// One tile; `i` and kv_phase as bwd_produce's.
template <class Cfg, bool kBf16, bool kMasked, bool kDqBulk>
__device__ __forceinline__ void bwd_consume(
    BwdSharedStorage<Cfg, kDqBulk>& s, const BwdParams& bp, const BwdSeq& seq,
    const kernel::QueryBlocks<Cfg::kBlockM, Cfg::kBlockN, kMasked>& steps, int n_block, int kv_head,
    int cw, int tid, int& i, int kv_phase) {
  constexpr int kD = Cfg::kHeadDim, kBM = Cfg::kBlockM, kBN = Cfg::kBlockN;
  constexpr int kStages = Cfg::kStages;
  constexpr bool kOverlap = Cfg::kOverlap;
  static_assert(kDqBulk || !kOverlap, "the overlapped step is the bulk-dQ kernel's");
  const sm80::BwdParams& p = bp.p;
  const sm80::FwdParams& f = p.fwd;
  const int warp = tid / 32, lane = tid % 32;
  const int q_len = seq.lens.q_len, kv_len = seq.lens.kv_len;
  // This thread's rows of S^T, dV, dK: keys key_row0 and key_row0 + 8 of the block.
  const int key_row0 = cw * 64 + warp * 16 + lane / 4;
  const KeyRows<kMasked> rows(n_block * kBN + key_row0, q_len, kv_len, f.window_left,
                              f.window_right);
  // This warpgroup's share of dQ: 64 queries from dq_row0, 64 columns from dq_col0.
  const int dq_row0 = Cfg::dq_row0(cw), dq_col0 = Cfg::dq_col0(cw);

  float dk[kD / 2], dv[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dk[i] = dv[i] = 0.0f;
  fence_regs(dk);
  fence_regs(dv);

  s.kv_full.wait(kv_phase);
  // K rows past the sequence's keys that are not TMA's zero fill (varlen keys: the next
  // sequence's rows; seqused_k: unused rows, NaN included) become zeros: dQ = dS K reads every
  // row, and dS = 0 there does not cancel a NaN (0 x NaN). Whole 128-byte rows, so the swizzle
  // needs no care; S^T of those rows is masked anyway. Uniform per tile; no wgmma in flight (a
  // persistent CTA's previous tile waited for all of its own, and both warpgroups were done with
  // its K, kv_empty, before this tile's K landed); the fence orders these stores before the next
  // tile's TMA writes too.
  const int tail_from = kv_len - n_block * kBN;
  if ((f.cu_seqlens_k != nullptr || f.seqused_k != nullptr) && tail_from < kBN) {
    const int units = (kBN - tail_from) * 8;  // 16-byte units per chunk
#pragma unroll
    for (int c = 0; c < Cfg::kChunks; ++c)
      for (int u = cw * 128 + tid; u < units; u += 256)
        *reinterpret_cast<uint4*>(s.k[c] + tail_from * 128 + u * 16) = make_uint4(0, 0, 0, 0);
    fence_shared_to_async();
    consumers_sync();
  }
  const uint8_t* k_rows = s.k[0] + cw * 64 * 128;  // the warpgroup's 64 keys (8 atoms)
  const uint8_t* v_rows = s.v[0] + cw * 64 * 128;
  const int64_t row0 = seq.q_row0(f);
  // One step: query block m of head h, the i-th of the CTA (stage i % kStages, dS buffer i % 2).
  // kMaskStep: whether the step masks element-wise (QueryBlocks::needs_mask); a compile-time
  // constant so that the mask-free steps run as loops of their own, without the mask's
  // compares.
  const auto step = [&](int h, int m, int i, auto mask_step) {
    constexpr bool kMaskStep = decltype(mask_step)::value;
    const int st = i % kStages, buf = i % 2, m0 = m * kBM;
    s.full[st].wait((i / kStages) & 1);
    float sc[kBM / 2], dp[kBM / 2];
    wgmma_fence();
    issue_over_d<Cfg, kBf16>(sc, k_rows, s.q[st][0]);     // S^T = K Q^T
    issue_over_d<Cfg, kBf16>(dp, v_rows, s.dout[st][0]);  // dP^T = V dO^T
    wgmma_wait<1>();
    fence_regs(sc);
    // P^T = exp2(S^T scale log2(e) - LSE log2(e)); accumulator column 8 j + 2 (lane % 4) + e
    // is query m0 + that column.
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
      const float2 l2 = *reinterpret_cast<const float2*>(&s.lse2[st][8 * j + 2 * (lane % 4)]);
#pragma unroll
      for (int x = 0; x < 4; ++x)
        sc[4 * j + x] = exp2_approx(fmaf(sc[4 * j + x], f.scale_log2, x % 2 ? -l2.y : -l2.x));
    }
    // The rows' query bounds: kDqBulk recomputes them per step (opaque: not hoisted), so that
    // they are not held through the step's register peak (held, d64's masked kernels spilled
    // 8-12 bytes beside the dQ tile's code); a few integer operations a step.
    const KeyRows<kMasked> mask_rows = [&] {
      if constexpr (kDqBulk)
        return KeyRows<kMasked>(n_block * kBN + static_cast<int>(opaque(key_row0)), q_len, kv_len,
                                f.window_left, f.window_right);
      else
        return rows;
    }();
    // P^T is 0 where the mask hides the pair, whatever the scores there were: row r sees
    // columns c = 8 j + e in [lo, hi] (the thread's offset folded into the bounds, so each
    // element compares a constant). A loop of its own, not a select in the exponent's: d64's
    // 64 predicates there spilled 72 bytes. Steps without kMaskStep skip it: every query before
    // q_len sees every key of the block (those past q_len have P = 0 from their LSE of +inf).
#pragma unroll
    for (int r = 0; r < 2 && kMaskStep; ++r) {
      const int lo = mask_rows.t_min[r] - (m0 + 2 * (lane % 4));
      const int hi = mask_rows.t_max[r] - (m0 + 2 * (lane % 4));
#pragma unroll
      for (int c = 0; c < kBM; c = c % 2 ? c + 7 : c + 1)
        if (c < lo || c > hi) sc[4 * (c / 8) + 2 * r + c % 2] = 0.0f;
    }
    wgmma_wait<0>();
    fence_regs(dp);
    // dS^T = P^T o (dP^T - D), 0 where P is (hidden pairs: dP^T of keys past kv_len may be
    // NaN, from another sequence's or unused V rows, and 0 x NaN is not 0).
#pragma unroll
    for (int j = 0; j < kBM / 8; ++j) {
      const int col = 8 * j + 2 * (lane % 4);
      const float2 d2 = *reinterpret_cast<const float2*>(&s.delta[st][col]);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        dp[4 * j + 2 * r] = ds_of(sc[4 * j + 2 * r], dp[4 * j + 2 * r], d2.x);
        dp[4 * j + 2 * r + 1] = ds_of(sc[4 * j + 2 * r + 1], dp[4 * j + 2 * r + 1], d2.y);
      }
    }
    uint32_t pa[kBM / 16][4], dsa[kBM / 16][4];
    to_operand<kBf16>(sc, pa);
    if constexpr (kOverlap) {
      // dV += P^T dO now: it runs under dS^T's packing and stores and the consumers' barrier.
      wgmma_fence();
      issue_over_queries<Cfg, kBf16>(dv, pa, s.dout[st][0]);
      wgmma_commit();
    }
    to_operand<kBf16>(dp, dsa);
    store_ds<Cfg>(s.ds[buf], dsa, key_row0, lane);
    fence_shared_to_async();  // dS^T is read by the wgmma (the async proxy) below
    if constexpr (!kOverlap) {
      wgmma_fence();
      issue_over_queries<Cfg, kBf16>(dv, pa, s.dout[st][0]);  // dV += P^T dO
      issue_over_queries<Cfg, kBf16>(dk, dsa, s.q[st][0]);    // dK += dS^T Q
      wgmma_commit();
    }
    // kDqBulk: the writer's previous reduce-adds have read this warpgroup's dQ tile (issued most
    // of a step ago, so this rarely waits; the writer frees it once ahead for the first step);
    // the tile is written again below. Here rather than beside the tile's stores, where dQ's
    // accumulator is live and dK in flight: there the consumers spilled 36-140 bytes (ptxas).
    if constexpr (kDqBulk) dq_barrier<kDqEmpty, true>(cw);
    consumers_sync();  // both warpgroups' dS^T are in s.ds[buf]
    // dV and dK (kOverlap: dV alone) ran under the barrier; waiting for them here frees P^T's
    // (and dS^T's) registers before dQ's accumulator is live (with all three live, d128 spilled
    // ~90 bytes).
    wgmma_wait<0>();
    fence_regs(dv);
    fence_regs(pa);
    if constexpr (!kOverlap) {
      fence_regs(dk);
      fence_regs(dsa);
    }
    float dq[Cfg::kDqCols / 2];
    wgmma_fence();
    issue_dq<Cfg, kBf16>(dq, s.ds[buf][dq_row0 / 64], s.k[dq_col0 / 64]);
    if constexpr (kOverlap) {
      // dK += dS^T Q behind dQ: the wait below lets dQ's accumulator out and leaves dK running
      // under the dQ tile's stores and the reduce-add's issue.
      issue_over_queries<Cfg, kBf16>(dk, dsa, s.q[st][0]);
      wgmma_commit();
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
      s.empty[st].arrive();  // this thread is done with the stage's Q, dO, LSE, D
    }
    fence_regs(dq);
    if constexpr (kDqBulk) {
      // dQ's share through shared memory: the warpgroup writes its tile (free: dq_empty above)
      // and hands it to the writer warp (dq_full), which adds it into the accumulator with
      // kDqBoxes bulk reduce-adds (bwd_write_dq); the warpgroup goes on to the next step without
      // waiting for them. Rows past the sequence's queries are the next sequence's rows (dense or
      // varlen; past the last row, the map's bound drops them), and the tile holds exact zeros
      // there (P = 0 for those queries: LSE +inf and their Q rows finite, TMA's zeros or another
      // sequence's; dS = 0; K's rows finite, those past the keys zeroed above), so adding them
      // changes no bit.
      store_dq_tile<Cfg>(s.dq[cw], dq, warp, lane);
      fence_shared_to_async();  // this thread's tile stores, to the reduce-add (async proxy)
      dq_barrier<kDqFull, false>(cw);
    } else {
      // dQ's share into the accumulator [q_rows][h_q][d]: rows past the sequence are skipped.
      float* dq_accum = p.dq_accum + int64_t{h} * kD;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int t = m0 + dq_row0 + warp * 16 + lane / 4 + 8 * r;
        if (t >= q_len) continue;
        float* acc = dq_accum + (row0 + t) * f.h_q * kD + dq_col0 + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < Cfg::kDqCols / 8; ++j)
          atomicAdd(reinterpret_cast<float2*>(acc + 8 * j),
                    make_float2(dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]));
      }
    }
    if constexpr (kOverlap) {
      wgmma_wait<0>();  // dK has read Q and dS^T's registers
      fence_regs(dk);
      fence_regs(dsa);
      s.empty[st].arrive();  // this thread is done with the stage's Q, dO, LSE, D
    }
  };
  for (int h = kv_head * f.h_ratio; h < (kv_head + 1) * f.h_ratio; ++h) {
    if constexpr (kDqBulk) {
      // Masks only on the steps that need them (the causal diagonal, a window's edges, a key
      // block that ends past kv_len), as the forward's key loop. The bounds come from shared
      // memory at each test (the step's asm clobbers memory, so they are not held in registers).
      // Unmasked, only a block that ends past kv_len needs its mask, and on every step: the
      // first loop is empty there (mask_free[0] = m_min), and not compiled.
      int m = steps.m_min;
      if constexpr (kMasked)
        for (; m < s.mask_free[0]; ++m, ++i) step(h, m, i, std::true_type{});
      for (; m < s.mask_free[1]; ++m, ++i) step(h, m, i, std::false_type{});
      for (; m < steps.m_max; ++m, ++i) step(h, m, i, std::true_type{});
    } else {
      for (int m = steps.m_min; m < steps.m_max; ++m, ++i) step(h, m, i, std::true_type{});
    }
  }
  // Persistent: this thread is done with K and V (every step's dQ, the last GEMM that reads K, and
  // dP^T, V's, waited for) and with mask_free: the producer loads the next tile's while dK and dV
  // are stored below.
  if constexpr (Cfg::kPersistent) s.kv_empty.arrive();

  // dK (times the softmax scale: S = scale Q K^T) and dV of the block's keys.
  const bool varlen_k = f.cu_seqlens_k != nullptr;
  using Elem = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  auto* dkg = static_cast<Elem*>(p.dk) +
              (varlen_k ? int64_t{seq.lens.k_start} * p.dk_row_stride : seq.b * p.dk_batch_stride) +
              kv_head * p.dk_head_stride;
  auto* dvg = static_cast<Elem*>(p.dv) +
              (varlen_k ? int64_t{seq.lens.k_start} * p.dv_row_stride : seq.b * p.dv_batch_stride) +
              kv_head * p.dv_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = rows.key[r];
    const bool valid = key < kv_len;
    store_grad_row<kD, kBf16>(dk, r, f.scale,
                              reinterpret_cast<uint8_t*>(dkg + int64_t{key} * p.dk_row_stride),
                              valid, lane);
    store_grad_row<kD, kBf16>(
        dv, r, 1.0f, reinterpret_cast<uint8_t*>(dvg + int64_t{key} * p.dv_row_stride), valid, lane);
  }
}

// ---------------------------------------------------------------------------------------------
// One step's dQ into the accumulator (the dQ writer's lanes): each consumer warpgroup's tile once
// it has stored it (dq_full), as kDqBoxes bulk reduce-adds at query row `row` of head `h` of the
// dq_accum map, one lane issuing, one commit group per warpgroup.
template <class Cfg>
__device__ __forceinline__ void reduce_add_dq_step(BwdSharedStorage<Cfg, true>& s,
                                                   const BwdParams& bp, int row, int h, int lane) {
#pragma unroll
  for (int cw = 0; cw < Cfg::kConsumers; ++cw) {
    dq_barrier<kDqFull, true>(cw);
    const int dq_row0 = Cfg::dq_row0(cw), dq_col0 = Cfg::dq_col0(cw);
    if (lane == 0) {
#pragma unroll
      for (int c = 0; c < Cfg::kDqBoxes; ++c)
        tma_reduce_add_4d(&bp.tma_dq_accum, s.dq[cw][c], dq_col0 + c * Cfg::kDqBoxCols,
                          row + dq_row0, h, 0);
      tma_store_commit();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The dQ writer (warp 1 of warpgroup 0, kDqBulk; `lane` 0..31): per step, in the consumers' order
// (every query head of the GQA group, every query block that sees the key block), waits for each
// consumer warpgroup's dQ tile (dq_full), adds it into the fp32 accumulator with kDqBoxes bulk
// reduce-adds through the dq_accum map (one lane issues), waits until they have read the tiles
// and frees them (dq_empty). It frees them once ahead, before the first step, and not after the
// last, so that arrivals and syncs pair up. The boxes cover rows past the sequence's queries,
// where the tiles hold exact zeros (bwd_consume says why).
template <class Cfg, bool kMasked>
__device__ __forceinline__ void bwd_write_dq(
    BwdSharedStorage<Cfg, true>& s, const BwdParams& bp, const BwdSeq& seq,
    const kernel::QueryBlocks<Cfg::kBlockM, Cfg::kBlockN, kMasked>& steps, int kv_head, int lane) {
  const sm80::FwdParams& f = bp.p.fwd;
  // The dq_accum map's row of the sequence's query 0: the map is one sequence of all q_rows rows,
  // dense batches included.
  const int q_row = static_cast<int>(seq.q_row0(f));
  const int n = f.h_ratio * (steps.m_max - steps.m_min);
  if (n == 0) return;  // no step: no consumer syncs on dq_empty, so no arrival either
#pragma unroll
  for (int cw = 0; cw < Cfg::kConsumers; ++cw) dq_barrier<kDqEmpty, false>(cw);
  for (int i = 0; i < n; ++i) {
    const int h = kv_head * f.h_ratio + i / (steps.m_max - steps.m_min);
    const int m0 = (steps.m_min + i % (steps.m_max - steps.m_min)) * Cfg::kBlockM;
    reduce_add_dq_step<Cfg>(s, bp, q_row + m0, h, lane);
    if (i + 1 == n) break;
    if (lane == 0) tma_store_wait_read();
    __syncwarp();
#pragma unroll
    for (int cw = 0; cw < Cfg::kConsumers; ++cw) dq_barrier<kDqEmpty, false>(cw);
  }
  // The last reduce-adds complete before the CTA (and its shared memory) goes.
  if (lane == 0) tma_store_wait_all();
}

// The dQ writer of a persistent CTA (Cfg::kPersistent), one tile: as bwd_write_dq, with `g`
// counting the steps of the CTA's whole tile loop. The consumers sync on dq_empty once before each
// of their steps, so the writer arrives there once before each step it takes (the first: at once;
// the others: once the previous step's reduce-adds have read the tiles), and not after the CTA's
// last, which it cannot know when a later tile has no step (a window no query of its keys sees):
// arrivals and syncs pair up over the CTA, steps of tiles without steps being none. The caller
// waits for the last reduce-adds before the CTA ends.
template <class Cfg, bool kMasked>
__device__ __forceinline__ void bwd_write_dq_tile(
    BwdSharedStorage<Cfg, true>& s, const BwdParams& bp, const BwdSeq& seq,
    const kernel::QueryBlocks<Cfg::kBlockM, Cfg::kBlockN, kMasked>& steps, int kv_head, int lane,
    int& g) {
  const sm80::FwdParams& f = bp.p.fwd;
  const int q_row = static_cast<int>(seq.q_row0(f));
  const int per_head = steps.m_max - steps.m_min;
  const int n = f.h_ratio * per_head;
  for (int i = 0; i < n; ++i, ++g) {
    if (g > 0) {
      if (lane == 0) tma_store_wait_read();
      __syncwarp();
    }
#pragma unroll
    for (int cw = 0; cw < Cfg::kConsumers; ++cw) dq_barrier<kDqEmpty, false>(cw);
    const int h = kv_head * f.h_ratio + i / per_head;
    const int m0 = (steps.m_min + i % per_head) * Cfg::kBlockM;
    reduce_add_dq_step<Cfg>(s, bp, q_row + m0, h, lane);
  }
}

// The CTA's tile (key block, KV head, sequence) at entry t of the 1-D order in f.order: with
// Cfg::kHeavyFirst tile_order.h's heaviest-first order (sections of (KV head, sequence) units, in
// each the units' heaviest key blocks first, units fastest); tile_of counts its m_block down from
// the heaviest, the forward's last query tile; the backward's heaviest key block is the first
// where the mask has a right side (bottom-right causal: key block 0 is seen by every query) and
// the last where it has only a left one. Otherwise (the persistent grid's unmasked order) the 3-D
// grid's: key block fastest, then KV head, then sequence.
template <class Cfg>
__device__ __forceinline__ void bwd_tile_coords(const sm80::FwdParams& f, int t, int& n_block,
                                                int& kv_head, int& z) {
  if constexpr (Cfg::kHeavyFirst) {
    const kernel::TileCoords c = kernel::tile_of(f.order, t);
    n_block = f.window_right >= 0 ? f.order.m_blocks - 1 - c.m_block : c.m_block;
    kv_head = c.head;
    z = c.z;
  } else {
    n_block = t % f.order.m_blocks;
    const int unit = t / f.order.m_blocks;
    kv_head = unit % f.order.heads;
    z = unit / f.order.heads;
  }
}

// The persistent CTA (Cfg::kPersistent): the barriers once, then tiles until the counter has none
// left. The producer takes entry t = atomicAdd(counter, 1) of the order (f.order; tiles without
// keys, key blocks past a shorter sequence's keys, it skips), passes it to the dQ writer
// (writer_tile, a ring of two: the writer may lag the consumers by a step), issues the tile's
// first Q/dO stage, then, once the consumers have released the previous tile's K and V
// (kv_empty: their last dQ waited for, before their dK/dV stores), the tile's K and V with t in
// s.tile, so that those land while the stores run; with no tile left, -1 to both (kv_full: a
// phase without bytes). The consumers take each tile from s.tile after kv_full; the
// Q/dO/LSE/D ring, its phases and the dS^T buffers go on from step to step across tiles as
// within one, and the writer counts its hand-offs over the CTA (bwd_write_dq_tile). A counter
// rather than a fixed stride: the tiles of a masked grid differ in cost by up to the number of
// query blocks, and a stride over the heaviest-first list gives some CTAs only heavy ones (a
// list-scheduling model at causal 2k: 1.2-1.7x the ideal per-CTA work; the forward's run 32
// measured the same).
template <class Cfg, bool kBf16, bool kMasked>
__device__ __forceinline__ void bwd_persistent(BwdSharedStorage<Cfg, true>& s,
                                               const BwdParams& bp) {
  const sm80::FwdParams& f = bp.p.fwd;
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  const int tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    s.kv_full.init(1);
    s.kv_empty.init(Cfg::kConsumers * 128);  // every consumer thread
#pragma unroll
    for (int st = 0; st < Cfg::kStages; ++st) {
      s.full[st].init(32);
      s.empty[st].init(Cfg::kConsumers * 128);
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      s.writer_full[k].init(1);    // the producer's lane 0
      s.writer_empty[k].init(32);  // the writer warp's lanes
    }
    Mbarrier::fence_init();
  }
  __syncthreads();
  using Steps = kernel::QueryBlocks<Cfg::kBlockM, Cfg::kBlockN, kMasked>;
  if (warpgroup == 0) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    const int warp = __shfl_sync(0xffffffffu, tid / 32, 0);
    if (warp == 0) {
      const int tiles = f.order.units * f.order.m_blocks;
      // Entry t (-1: none left) of the CTA's j-th tile with keys to the writer's ring.
      const auto to_writer = [&](int j, int t) {
        s.writer_empty[j % 2].wait(((j / 2) & 1) ^ 1);
        if (tid == 0) {
          s.writer_tile[j % 2] = t;
          s.writer_full[j % 2].arrive();
        }
      };
      int i = 0;  // the ring's step, over the CTA's tiles
      int j = 0;  // the CTA's tiles with keys so far
      for (;;) {
        int t = 0;
        if (tid == 0) t = atomicAdd(bp.tile_counter, 1);
        t = __shfl_sync(0xffffffffu, t, 0);
        if (t >= tiles) break;
        int n_block, kv_head, z;
        bwd_tile_coords<Cfg>(f, t, n_block, kv_head, z);
        const BwdSeq seq(f, z);
        if (n_block * Cfg::kBlockN >= seq.lens.kv_len) continue;
        const Steps steps(n_block, seq.lens.q_len, seq.lens.kv_len, f.window_left, f.window_right);
        to_writer(j, t);
        bwd_produce<Cfg, kMasked, true>(s, bp, seq, steps, n_block, kv_head, tid, i, j & 1, t);
        ++j;
      }
      // None left: -1 to the writer and, once the consumers are done with the last tile's entry,
      // to the consumers by a phase of kv_full without bytes.
      to_writer(j, -1);
      s.kv_empty.wait((j & 1) ^ 1);
      if (tid == 0) {
        s.tile = -1;
        s.kv_full.arrive();
      }
    } else if (warp == 1) {
      const int lane = tid - 32;
      int g = 0;  // the writer's hand-offs, over the CTA's tiles
      for (int j = 0;; ++j) {
        s.writer_full[j % 2].wait((j / 2) & 1);
        const int t = s.writer_tile[j % 2];
        s.writer_empty[j % 2].arrive();  // this lane has read the entry
        if (t < 0) break;
        int n_block, kv_head, z;
        bwd_tile_coords<Cfg>(f, t, n_block, kv_head, z);
        const BwdSeq seq(f, z);
        const Steps steps(n_block, seq.lens.q_len, seq.lens.kv_len, f.window_left, f.window_right);
        bwd_write_dq_tile<Cfg, kMasked>(s, bp, seq, steps, kv_head, lane, g);
      }
      // The last reduce-adds complete before the CTA (and its shared memory) goes.
      if (lane == 0) tma_store_wait_all();
    }
  } else {
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    int i = 0;  // the ring's step, over the CTA's tiles
    for (int j = 0;; ++j) {
      s.kv_full.wait(j & 1);
      // Broadcast, so that ptxas knows the loop's exit is warp-uniform.
      const int t = __shfl_sync(0xffffffffu, s.tile, 0);
      if (t < 0) break;
      int n_block, kv_head, z;
      bwd_tile_coords<Cfg>(f, t, n_block, kv_head, z);
      const BwdSeq seq(f, z);
      const Steps steps(n_block, seq.lens.q_len, seq.lens.kv_len, f.window_left, f.window_right);
      bwd_consume<Cfg, kBf16, kMasked, true>(s, bp, seq, steps, n_block, kv_head, warpgroup - 1,
                                             tid, i, j & 1);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The fused dQ conversion (BwdParams::dq_counters, FLASHSERVE_SM90_BWD_FUSED_DQ: dense batches on
// the 3-D one-tile grid, the bulk-dQ kernel). Every CTA of a unit (sequence, KV head) adds its dQ
// shares into the unit's rows of the fp32 accumulator; the dQ writer counts the CTA done once its
// reduce-adds are complete, and the CTA that counts last (the count reaches gridDim.x: in a dense
// batch every key block has keys) scales the unit's rows into dq as the postprocess would, while
// they are still in L2, so that no postprocess reads the whole accumulator back from memory.
inline constexpr int kDqDone = 6;  // the writer warp arrives, the consumer warpgroups sync

template <class Cfg>
inline constexpr int kDqDoneThreads = 32 + Cfg::kConsumers * 128;

// The tiles that may convert dQ themselves: the 3-D grid's, whose gridDim.x counts a unit's CTAs
// (not the heaviest-first order's 1-D grid; the persistent CTAs never get here).
template <class Cfg>
inline constexpr bool kFusedDqTile = !Cfg::kHeavyFirst && !Cfg::kPersistent;

// The dQ writer warp (`lane` 0..31), after bwd_write_dq: lane 0 counts the CTA on its unit's
// counter and leaves whether it was the last in shared memory, then the warp tells the consumers.
template <class Cfg>
__device__ __forceinline__ void count_dq_done(BwdSharedStorage<Cfg, true>& s, const BwdParams& bp,
                                              int z, int kv_head, int lane) {
  if (lane == 0) {
    // bwd_write_dq waited for this thread's reduce-adds to complete. The proxy fence orders them
    // (the async proxy) before the thread's generic accesses; the fence releases them at gpu
    // scope before the count, which the last CTA acquires before it reads the accumulator.
    cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
    __threadfence();
    int* counter = bp.dq_counters + int64_t{z} * gridDim.y + kv_head;
    const bool last = atomicAdd(counter, 1) == static_cast<int>(gridDim.x) - 1;
    if (last) __threadfence();  // acquire the other CTAs' sums, before the consumers hear of it
    s.dq_last = last;
  }
  __syncwarp();
  named_barrier<kDqDone, kDqDoneThreads<Cfg>, false>();
}

// The consumer warpgroups' threads (`ct` 0 .. 128 kConsumers - 1), after their steps: in the
// unit's last CTA, dq = scale x the accumulator for every row of the unit's query heads, 8
// columns a thread, rounded as the postprocess rounds (kernel::scale_round8). The
// loads go through L2 (ld.global.cg): the reduce-adds went there, this SM's L1 never held them.
template <class Cfg, bool kBf16>
__device__ __forceinline__ void convert_dq_if_last(BwdSharedStorage<Cfg, true>& s,
                                                   const BwdParams& bp, const BwdSeq& seq,
                                                   int kv_head, int ct) {
  named_barrier<kDqDone, kDqDoneThreads<Cfg>, true>();
  if (!s.dq_last) return;
  __threadfence();  // acquire: every CTA of the unit released its sums before its count
  const sm80::BwdParams& p = bp.p;
  const sm80::FwdParams& f = p.fwd;
  constexpr int kD = Cfg::kHeadDim, kPieces = kD / 8, kRowStep = Cfg::kConsumers * 128 / kPieces;
  static_assert(Cfg::kConsumers * 128 % kPieces == 0, "whole rows per pass");
  using Elem = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  const int piece = ct % kPieces;
  const int64_t row0 = seq.q_row0(f);
  Elem* dq = static_cast<Elem*>(p.dq) + int64_t{seq.b} * p.dq_batch_stride + 8 * piece;
  // kBatch rows' loads are issued before any of their stores: the compiler may not move a load
  // above a store to dq (it cannot rule out that they alias), and one row at a time paid an L2
  // round trip per row (session 40's first device run: 2k keys 5-10% slower than the postprocess).
  constexpr int kBatch = 8;
  const int q_len = seq.lens.q_len;
  for (int i = 0; i < f.h_ratio; ++i) {
    const int h = kv_head * f.h_ratio + i;
    for (int t0 = ct / kPieces; t0 < q_len; t0 += kBatch * kRowStep) {
      float4 a[kBatch][2];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int t = t0 + j * kRowStep;
        if (t < q_len) {
          const float4* acc = reinterpret_cast<const float4*>(
              p.dq_accum + ((row0 + t) * f.h_q + h) * kD + 8 * piece);
          a[j][0] = __ldcg(acc);
          a[j][1] = __ldcg(acc + 1);
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int t = t0 + j * kRowStep;
        if (t >= q_len) break;
        *reinterpret_cast<uint4*>(dq + t * p.dq_row_stride + h * p.dq_head_stride) =
            kernel::scale_round8<Elem>(a[j][0], a[j][1], f.scale);
      }
    }
  }
}

// A CTA of the one-tile grid (3-D, or 1-D heaviest first).
template <class Cfg, bool kBf16, bool kMasked, bool kDqBulk>
__device__ __forceinline__ void bwd_one_tile(BwdSharedStorage<Cfg, kDqBulk>& s,
                                             const BwdParams& bp) {
  const sm80::FwdParams& f = bp.p.fwd;
  // The CTA's key block, KV head and sequence: the 3-D grid's coordinates, or (kHeavyFirst) entry
  // blockIdx.x of the heaviest-first order the host put in f.order (bwd_tile_coords), so that the
  // longest CTAs start first and the last wave holds the shortest ones; the grid is the hardware's
  // queue, no counter.
  int n_block = blockIdx.x, kv_head = blockIdx.y, z = blockIdx.z;
  if constexpr (Cfg::kHeavyFirst) bwd_tile_coords<Cfg>(f, blockIdx.x, n_block, kv_head, z);
  const BwdSeq seq(f, z);
  // Key blocks past the sequence's keys have nothing to compute (their dK, dV rows were zeroed
  // by the caller); the whole CTA leaves before any barrier.
  if (n_block * Cfg::kBlockN >= seq.lens.kv_len) return;
  const kernel::QueryBlocks<Cfg::kBlockM, Cfg::kBlockN, kMasked> steps(
      n_block, seq.lens.q_len, seq.lens.kv_len, f.window_left, f.window_right);

  // Broadcast from lane 0 so that ptxas knows the role is warp-uniform (a branch it cannot prove
  // uniform between a wgmma's issue and its wait serializes the wgmmas: C7520).
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  const int tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    s.kv_full.init(1);
#pragma unroll
    for (int st = 0; st < Cfg::kStages; ++st) {
      s.full[st].init(32);                      // the producer warp's lanes
      s.empty[st].init(Cfg::kConsumers * 128);  // every consumer thread
    }
    if constexpr (kDqBulk) {
      s.mask_free[0] = min(max(steps.full_lo, steps.m_min), steps.m_max);
      s.mask_free[1] = min(max(steps.full_hi, s.mask_free[0]), steps.m_max);
    }
    Mbarrier::fence_init();
  }
  __syncthreads();

  int i = 0;  // the step (one tile: from 0)
  if (warpgroup == 0) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    // The warp's role from a broadcast too, so that ptxas sees each branch taken by whole warps.
    const int warp = __shfl_sync(0xffffffffu, tid / 32, 0);
    if (warp == 0) {
      bwd_produce<Cfg, kMasked, kDqBulk>(s, bp, seq, steps, n_block, kv_head, tid, i, 0, 0);
    } else if (warp == 1) {
      if constexpr (kDqBulk) {
        bwd_write_dq<Cfg, kMasked>(s, bp, seq, steps, kv_head, tid - 32);
        if constexpr (kFusedDqTile<Cfg>)
          if (bp.dq_counters != nullptr) count_dq_done<Cfg>(s, bp, z, kv_head, tid - 32);
      }
    }
  } else {
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    bwd_consume<Cfg, kBf16, kMasked, kDqBulk>(s, bp, seq, steps, n_block, kv_head, warpgroup - 1,
                                              tid, i, 0);
    if constexpr (kDqBulk && kFusedDqTile<Cfg>)
      if (bp.dq_counters != nullptr)
        convert_dq_if_last<Cfg, kBf16>(s, bp, seq, kv_head, (warpgroup - 1) * 128 + tid);
  }
}

template <class Cfg, bool kBf16, bool kMasked, bool kDqBulk>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_kernel(const __grid_constant__ BwdParams bp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!Cfg::kHeavyFirst || (kMasked && kDqBulk),
                "the heaviest-first order is the masked bulk-dQ kernel's");
  static_assert(!Cfg::kPersistent || (kDqBulk && Cfg::kHeavyFirst == kMasked),
                "the persistent grid is the bulk-dQ kernel's, masked in the heaviest-first order");
  extern __shared__ uint8_t smem_raw[];
  // Realigned by pointer arithmetic on the __shared__ array rather than through an integer, so
  // that the compiler still knows every access through `s` is to shared memory: through the
  // integer it emitted generic loads and stores (session 26's SASS: 17 generic LD of LSE and D
  // per step in the consumers, ST.E in the producer).
  const uint32_t misalign = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) % 1024;
  auto& s = *reinterpret_cast<BwdSharedStorage<Cfg, kDqBulk>*>(smem_raw + (1024 - misalign) % 1024);
  if constexpr (Cfg::kPersistent)
    bwd_persistent<Cfg, kBf16, kMasked>(s, bp);
  else
    bwd_one_tile<Cfg, kBf16, kMasked, kDqBulk>(s, bp);
#endif
}

}  // namespace flashserve::attention::sm90
