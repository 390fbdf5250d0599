// The sm90 backward kernel at head dim 256 (BwdSwappedTileConfig in tile_config.h): dV, dK
// computed transposed, FlashAttention-3's "swapped" products (hopper/mainloop_bwd_sm90_tma_gmma_
// ws.hpp, dKV_swapAB; read, not copied), because bwd_kernel.h's dK and dV of 64 keys a warpgroup
// in registers would be 256 registers a thread at d256. Written without a GPU (docs/
// kernel-notes.md, session 29).
//
// One CTA per (block of kBlockN = 64 keys, KV head, sequence); the GQA group's query heads loop
// inside it, as in bwd_kernel.h. Per step (one query head, one block of kBlockM = 64 queries that
// sees some of the block's keys), with Q, dO, LSE and D in a 2-stage ring (bwd_produce):
//   S^T  = K Q^T, dP^T = V dO^T   (SS, m64n32: warpgroup w the 64 keys x queries 32 w .. 32 w + 31)
//   P^T, dS^T as in bwd_kernel.h  (exp2 against LSE, the mask, P^T o (dP^T - D))
//   P^T, dS^T -> shared memory    ([key][query], one 64 x 64 chunk each; both warpgroups' halves)
//   dV^T += dO^T P                (SS, A transposed: warpgroup w head-dim rows 128 w .. + 127)
//   dK^T += Q^T dS                (the same rows)
//   dQ    = dS K                  (SS, both transposed: warpgroup w columns 128 w .. + 127)
// - Warpgroup 0 gives registers back; its warp 0 is bwd_kernel.h's producer (bwd_produce), its
//   warp 1 the dQ writer (bwd_write_dq_swapped).
// - The dQ tile (64 queries x 256 columns fp32, 64 KB) has no shared memory of its own (the
//   budget in tile_config.h): once both warpgroups have waited for the step's GEMMs (the second
//   consumers' barrier of the step), the step's stage is read by nothing else, and warpgroup w
//   stores its 64 x 128 share there (w 0 over Q, w 1 over dO; bwd_kernel.h's store_dq_tile, boxes
//   of 32 fp32 columns) and arrives at a named barrier. The writer adds the boxes into the fp32
//   accumulator (cp.reduce.async.bulk.tensor), waits until they have read the stage and then
//   arrives on the stage's empty barrier, which every consumer thread has also arrived on after
//   its last access to the stage: the producer reloads it once both are done. So the stage ring,
//   not a dq_empty hand-off, keeps the consumers from writing a tile the writer still reads.
// - The named barriers of the hand-off alternate with the stage (dq_full_barrier): a warpgroup's
//   arrival for step i + 2 needs stage i % 2 loaded again, which needs the writer's release of
//   step i, which follows the writer's sync on step i's barrier; with one barrier for every step,
//   the arrivals of steps i and i + 1 could meet on it before the writer's sync of step i.
// - dK^T and dV^T leave transposed through K's and V's shared memory (stmatrix .trans), free
//   after the last step, as 16-byte rows of dk and dv.
// - Head dims 136-248 run padded to 256 (bwd_hdim256.cu: TMA's zero fill past the call's head
//   dim makes the extra columns zeros; write_grad_rows stops at it).
// - deterministic = true is not here (backward_cuda.cu runs sm80's fixed-order dq kernel).
// Not yet: the overlapped step, the heaviest-first order and the persistent grid of bwd_kernel.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "bwd_kernel.h"

namespace flashserve::attention::sm90 {

template <class Cfg>
struct BwdSwappedSharedStorage {
  // Every chunk is a 1024-byte aligned run of 8-row 128-byte swizzle atoms (wgmma.h).
  alignas(1024) uint8_t k[Cfg::kChunks][Cfg::kKVChunkBytes];
  alignas(1024) uint8_t v[Cfg::kChunks][Cfg::kKVChunkBytes];
  // Also each warpgroup's dQ tile of the stage's step, after its GEMMs (the header comment).
  alignas(1024) uint8_t q[Cfg::kStages][Cfg::kChunks][Cfg::kQChunkBytes];
  alignas(1024) uint8_t dout[Cfg::kStages][Cfg::kChunks][Cfg::kQChunkBytes];
  alignas(1024) uint8_t pt[Cfg::kKQBytes];   // P^T of the step, [key][query]
  alignas(1024) uint8_t dst[Cfg::kKQBytes];  // dS^T of the step, [key][query]
  float lse2[Cfg::kStages][Cfg::kBlockM];    // LSE log2(e) of the step's queries (+inf: P = 0)
  float delta[Cfg::kStages][Cfg::kBlockM];   // D of the step's queries
  Mbarrier kv_full;                          // K and V landed (TMA bytes)
  // full: a stage's Q, dO (TMA bytes), LSE and D landed (the producer warp's 32 arrivals);
  // empty: every consumer thread is done with it (LSE, D, its dQ tile's stores; 256 arrivals) and
  // the dQ writer's reduce-adds have read the dQ tiles from it (its lane 0's arrival).
  Mbarrier full[Cfg::kStages], empty[Cfg::kStages];
  int mask_free[2];  // as BwdDqStage's: the query blocks that need no mask
};

template <class Cfg>
constexpr int bwd_swapped_smem_bytes() {
  return static_cast<int>(sizeof(BwdSwappedSharedStorage<Cfg>)) + 1024;  // + the realignment
}

// The dQ tile's hand-off of consumer warpgroup cw at a step of parity `parity` (named barriers
// 2 + 2 parity + cw, 160 threads: the warpgroup arrives, the writer warp syncs). Immediates: an id
// in a register makes ptxas reserve all 16.
template <bool kSync>
__device__ __forceinline__ void dq_full_barrier(int parity, int cw) {
  const int which = 2 * parity + cw;
  if (which == 0)
    dq_barrier_id<2, kSync>();
  else if (which == 1)
    dq_barrier_id<3, kSync>();
  else if (which == 2)
    dq_barrier_id<4, kSync>();
  else
    dq_barrier_id<5, kSync>();
}

// acc[t] (64 head-dim rows x 64 keys, tile t of the warpgroup's kGradTiles) += A B over the
// step's queries: A = dO^T or Q^T, the stage's chunk (2 w + t) read transposed (MN-major: the
// head dim contiguous; 16 queries, 2048 bytes, a k-step), B = P or dS from the [key][query] tile
// (K-major: 16 queries, 32 bytes, a k-step).
template <class Cfg, bool kBf16>
__device__ __forceinline__ void issue_grad_t(float (&acc)[Cfg::kGradTiles][Cfg::kBlockN / 2],
                                             const uint8_t* a_chunks, const uint8_t* kq_tile) {
  const uint64_t b_desc = smem_desc_sw128(kq_tile, 16, 1024);
#pragma unroll
  for (int t = 0; t < Cfg::kGradTiles; ++t) {
    const uint64_t a_desc =
        smem_desc_sw128(a_chunks + t * Cfg::kQChunkBytes, Cfg::kQChunkBytes, 1024);
#pragma unroll
    for (int kk = 0; kk < Cfg::kBlockM / 16; ++kk)
      mma_ss_tn<Cfg::kBlockN, kBf16>(acc[t], desc_advance(a_desc, kk * 16 * 128),
                                     desc_advance(b_desc, kk * 32), 1);
  }
}

// dq (64 queries x 128 columns) = dS K over the block's keys: A = dS, stored as dS^T [key][query]
// (MN-major for A), B = K's chunks 2 w and 2 w + 1, [key, d] (MN-major, LBO one chunk to the
// next). 16 keys (2048 bytes) a k-step in both (bwd_kernel.h's issue_dq, twice as wide).
template <class Cfg, bool kBf16>
__device__ __forceinline__ void issue_dq_swapped(float (&dq)[Cfg::kDqCols / 2],
                                                 const uint8_t* ds_tile, const uint8_t* k_chunks) {
  const uint64_t a_desc = smem_desc_sw128(ds_tile, Cfg::kKQBytes, 1024);
  const uint64_t b_desc = opaque(smem_desc_sw128(k_chunks, Cfg::kKVChunkBytes, 1024));
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk)
    mma_ss_tt<Cfg::kDqCols, kBf16>(dq, desc_advance(a_desc, kk * 16 * 128),
                                   desc_advance(b_desc, kk * 16 * 128), kk > 0);
}

// This warpgroup's half of P^T or dS^T (packed pairs, to_operand's layout: a[kk][r] = key
// key_row0 + 8 (r % 2), queries 32 cw + 16 kk + 8 (r / 2) + 2 (lane % 4) + {0, 1}) into the
// [key][query] tile: row `key` of 128 bytes, 16-byte unit query / 8 swizzled by key % 8. One
// stmatrix x4 per 16 queries, as bwd_kernel.h's store_ds: lane L addresses row L % 8 of matrix
// L / 8 (key (L % 8) + 8 ((L / 8) % 2) of the warp's 16, unit 4 cw + 2 kk + L / 16). The three
// terms of the unit occupy bits of their own, so the unit is their XOR and each store XORs its
// compile-time part into an address computed once.
template <class Cfg>
__device__ __forceinline__ void store_kq_half(uint8_t* tile,
                                              const uint32_t (&a)[Cfg::kSQueries / 16][4],
                                              int key_row0, int cw, int lane) {
  const int key = key_row0 - lane / 4 + lane % 8 + 8 * ((lane / 8) % 2);  // key % 8 = lane % 8
  const uint32_t base =
      static_cast<uint32_t>(opaque(static_cast<uint32_t>(__cvta_generic_to_shared(tile)) +
                                   key * 128 + (((lane / 16) ^ (lane % 8) ^ (4 * cw)) << 4)));
#pragma unroll
  for (int kk = 0; kk < Cfg::kSQueries / 16; ++kk) {
    const uint32_t addr = base ^ ((2 * kk) << 4);
    stmatrix_x4(addr, a[kk][0], a[kk][1], a[kk][2], a[kk][3]);
  }
}

// dK^T or dV^T's tiles (head-dim row kGradRows cw + 64 t + 16 warp + lane / 4 + 8 r, key 8 j +
// 2 (lane % 4) + e at acc[t][4 j + 2 r + e]), scaled and rounded, into `tile` as the gradient's
// rows: [key][d], 512 bytes a key, 16-byte unit d / 8 swizzled by key % 8 (so that the 8 keys of
// one stmatrix matrix, a column of 8 head-dim rows each, land on distinct banks). One stmatrix
// x4 .trans per 16 keys and tile: matrix m is (j = 2 jj + m / 2, r = m % 2), 8 head-dim rows x 8
// keys in the registers' layout, stored transposed: memory row = key; lane L addresses key row
// L % 8 of matrix L / 8.
template <class Cfg, bool kBf16>
__device__ __forceinline__ void stage_grad_t(uint8_t* tile,
                                             const float (&acc)[Cfg::kGradTiles][Cfg::kBlockN / 2],
                                             float scale, int cw, int warp, int lane) {
  const int m = lane / 8, key_lo = lane % 8;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
#pragma unroll
  for (int t = 0; t < Cfg::kGradTiles; ++t)
#pragma unroll
    for (int jj = 0; jj < Cfg::kBlockN / 16; ++jj) {
      uint32_t x[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int j = 2 * jj + q / 2, r = q % 2;
        x[q] = pack2<kBf16>(acc[t][4 * j + 2 * r] * scale, acc[t][4 * j + 2 * r + 1] * scale);
      }
      const int key = 16 * jj + 8 * (m / 2) + key_lo;
      const int unit = (Cfg::kGradRows * cw + 64 * t + 16 * warp + 8 * (m % 2)) / 8;
      const uint32_t addr = base + key * (Cfg::kHeadDim * 2) + ((unit ^ key_lo) << 4);
      asm volatile(
          "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
          "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3])
          : "memory");
    }
}

// This warpgroup's head-dim half of the staged gradient rows (stage_grad_t) into global memory,
// 16 bytes a thread and store, the keys past kv_len and the columns past the call's head dim
// (`units`: its 16-byte units, head_dim / 8; padded head dims) skipped.
template <class Cfg>
__device__ __forceinline__ void write_grad_rows(const uint8_t* tile, uint8_t* grad,
                                                int64_t row_bytes, int key0, int kv_len, int units,
                                                int cw, int tid) {
  constexpr int kUnits = Cfg::kGradRows / 8;  // 16-byte units of a row's half
#pragma unroll
  for (int n = 0; n < Cfg::kBlockN * kUnits / 128; ++n) {
    const int idx = tid + 128 * n, key = idx / kUnits, unit = kUnits * cw + idx % kUnits;
    if (key0 + key >= kv_len || unit >= units) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(tile + key * (Cfg::kHeadDim * 2) +
                                                    ((unit ^ (key % 8)) << 4));
    *reinterpret_cast<uint4*>(grad + (key0 + key) * row_bytes + unit * 16) = v;
  }
}

// ---------------------------------------------------------------------------------------------
// Consumers (warpgroups 1 and 2; `cw` 0 or 1, `tid` 0..127)
template <class Cfg, bool kBf16, bool kMasked>
__device__ __forceinline__ void bwd_consume_swapped(
    BwdSwappedSharedStorage<Cfg>& s, const BwdParams& bp, const BwdSeq& seq,
    const kernel::QueryBlocks<Cfg::kBlockM, Cfg::kBlockN, kMasked>& steps, int n_block, int kv_head,
    int cw, int tid) {
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kSQ = Cfg::kSQueries;
  constexpr int kStages = Cfg::kStages, kTiles = Cfg::kGradTiles;
  const sm80::BwdParams& p = bp.p;
  const sm80::FwdParams& f = p.fwd;
  const int warp = tid / 32, lane = tid % 32;
  const int q_len = seq.lens.q_len, kv_len = seq.lens.kv_len;
  // This thread's rows of S^T: keys key_row0 and key_row0 + 8 of the block (both warpgroups
  // compute all 64 keys, each for its half of the queries).
  const int key_row0 = warp * 16 + lane / 4;

  float dkt[kTiles][kBN / 2], dvt[kTiles][kBN / 2];
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int x = 0; x < kBN / 2; ++x) dkt[t][x] = dvt[t][x] = 0.0f;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    fence_regs(dkt[t]);
    fence_regs(dvt[t]);
  }

  s.kv_full.wait(0);
  // K rows past the sequence's keys that are not TMA's zero fill become zeros (bwd_consume says
  // why: dQ = dS K reads every row, and 0 x NaN is not 0).
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
  // One step: query block m, the CTA's i-th (stage i % kStages, the dQ barriers' parity i % 2).
  const auto step = [&](int m, int i, auto mask_step) {
    constexpr bool kMaskStep = decltype(mask_step)::value;
    const int st = i % kStages, m0 = m * kBM;
    s.full[st].wait((i / kStages) & 1);
    float sc[kSQ / 2], dp[kSQ / 2];
    wgmma_fence();
    // The warpgroup's 32 queries of Q or dO start 4 swizzle atoms in (rows 32 cw), so the
    // swizzle's phase is the tile's.
    issue_over_d<Cfg, kBf16, kSQ>(sc, s.k[0], s.q[st][0] + cw * kSQ * 128);     // S^T = K Q^T
    issue_over_d<Cfg, kBf16, kSQ>(dp, s.v[0], s.dout[st][0] + cw * kSQ * 128);  // dP^T = V dO^T
    wgmma_wait<1>();
    fence_regs(sc);
    // P^T = exp2(S^T scale log2(e) - LSE log2(e)); accumulator column 8 j + 2 (lane % 4) + e is
    // query m0 + kSQ cw + that column.
    const int col0 = kSQ * cw + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < kSQ / 8; ++j) {
      const float2 l2 = *reinterpret_cast<const float2*>(&s.lse2[st][col0 + 8 * j]);
#pragma unroll
      for (int x = 0; x < 4; ++x)
        sc[4 * j + x] = exp2_approx(fmaf(sc[4 * j + x], f.scale_log2, x % 2 ? -l2.y : -l2.x));
    }
    // 0 where the mask hides the pair (bwd_kernel.h's loop; the rows' query bounds recomputed per
    // step, opaque, so that they are not held through the step).
    if constexpr (kMaskStep) {
      const KeyRows<kMasked> mask_rows(n_block * kBN + static_cast<int>(opaque(key_row0)), q_len,
                                       kv_len, f.window_left, f.window_right);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int lo = mask_rows.t_min[r] - (m0 + col0);
        const int hi = mask_rows.t_max[r] - (m0 + col0);
#pragma unroll
        for (int c = 0; c < kSQ; c = c % 2 ? c + 7 : c + 1)
          if (c < lo || c > hi) sc[4 * (c / 8) + 2 * r + c % 2] = 0.0f;
      }
    }
    wgmma_wait<0>();
    fence_regs(dp);
    // dS^T = P^T o (dP^T - D), 0 where P is.
#pragma unroll
    for (int j = 0; j < kSQ / 8; ++j) {
      const float2 d2 = *reinterpret_cast<const float2*>(&s.delta[st][col0 + 8 * j]);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        dp[4 * j + 2 * r] = ds_of(sc[4 * j + 2 * r], dp[4 * j + 2 * r], d2.x);
        dp[4 * j + 2 * r + 1] = ds_of(sc[4 * j + 2 * r + 1], dp[4 * j + 2 * r + 1], d2.y);
      }
    }
    {
      uint32_t pa[kSQ / 16][4], dsa[kSQ / 16][4];
      to_operand<kBf16>(sc, pa);
      to_operand<kBf16>(dp, dsa);
      store_kq_half<Cfg>(s.pt, pa, key_row0, cw, lane);
      store_kq_half<Cfg>(s.dst, dsa, key_row0, cw, lane);
    }
    fence_shared_to_async();  // P^T and dS^T are read by the wgmmas (the async proxy) below
    consumers_sync();         // both warpgroups' halves are in s.pt and s.dst
    float dq[Cfg::kDqCols / 2];
    wgmma_fence();
    issue_grad_t<Cfg, kBf16>(dvt, s.dout[st][2 * cw], s.pt);  // dV^T += dO^T P
    issue_grad_t<Cfg, kBf16>(dkt, s.q[st][2 * cw], s.dst);    // dK^T += Q^T dS
    issue_dq_swapped<Cfg, kBf16>(dq, s.dst, s.k[2 * cw]);     // dQ = dS K
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      fence_regs(dvt[t]);
      fence_regs(dkt[t]);
    }
    fence_regs(dq);
    // Both warpgroups are done with the stage's Q and dO and with P^T and dS^T: this warpgroup's
    // dQ share goes over its half of the stage (Q or dO), and the next step may write P^T, dS^T.
    consumers_sync();
    uint8_t* tile = cw == 0 ? s.q[st][0] : s.dout[st][0];
    store_dq_tile<Cfg>(*reinterpret_cast<uint8_t(*)[Cfg::kDqBoxes][Cfg::kDqBoxBytes]>(tile), dq,
                       warp, lane);
    fence_shared_to_async();  // this thread's tile stores, to the reduce-add (async proxy)
    dq_full_barrier<false>(i % 2, cw);
    // This thread is done with the stage (its LSE and D reads above): an arrival of its own, so
    // that the producer's next writes of them are ordered after these reads by the barrier
    // itself, not only through the writer's bar.sync on the named barrier (which racecheck did
    // not follow: session 29's WAR hazards on D). The stage frees once the writer arrives too.
    s.empty[st].arrive();
  };
  int i = 0;
  for (int h = kv_head * f.h_ratio; h < (kv_head + 1) * f.h_ratio; ++h) {
    // Masks only on the steps that need them (bwd_kernel.h's three loops; mask_free from shared
    // memory at each test).
    int m = steps.m_min;
    if constexpr (kMasked)
      for (; m < s.mask_free[0]; ++m, ++i) step(m, i, std::true_type{});
    for (; m < s.mask_free[1]; ++m, ++i) step(m, i, std::false_type{});
    for (; m < steps.m_max; ++m, ++i) step(m, i, std::true_type{});
  }

  // dK^T (times the softmax scale: S = scale Q K^T) and dV^T, transposed through K's and V's
  // shared memory (every GEMM that reads them was waited for before the last step's second
  // barrier; a CTA without steps read them with no wgmma, and its K tail's stores are before a
  // barrier), then 16-byte rows into dk and dv.
  stage_grad_t<Cfg, kBf16>(s.k[0], dkt, f.scale, cw, warp, lane);
  stage_grad_t<Cfg, kBf16>(s.v[0], dvt, 1.0f, cw, warp, lane);
  consumers_sync();
  const bool varlen_k = f.cu_seqlens_k != nullptr;
  const int64_t k_off = varlen_k ? int64_t{seq.lens.k_start} : 0;
  auto* dkg = static_cast<uint8_t*>(p.dk) +
              2 * ((varlen_k ? k_off * p.dk_row_stride : seq.b * p.dk_batch_stride) +
                   kv_head * p.dk_head_stride);
  auto* dvg = static_cast<uint8_t*>(p.dv) +
              2 * ((varlen_k ? k_off * p.dv_row_stride : seq.b * p.dv_batch_stride) +
                   kv_head * p.dv_head_stride);
  const int key0 = n_block * kBN;
  write_grad_rows<Cfg>(s.k[0], dkg, 2 * p.dk_row_stride, key0, kv_len, p.head_dim / 8, cw, tid);
  write_grad_rows<Cfg>(s.v[0], dvg, 2 * p.dv_row_stride, key0, kv_len, p.head_dim / 8, cw, tid);
}

// ---------------------------------------------------------------------------------------------
// The dQ writer (warp 1 of warpgroup 0; `lane` 0..31): per step, in the consumers' order, waits
// for each warpgroup's dQ tile (dq_full_barrier), adds its kDqBoxes boxes into the accumulator at
// the step's query rows and the warpgroup's columns (one lane issues), waits until the adds have
// read the stage and releases it to the producer (empty[st]). The boxes cover rows past the
// sequence's queries, where the tiles hold exact zeros (bwd_consume says why).
template <class Cfg, bool kMasked>
__device__ __forceinline__ void bwd_write_dq_swapped(
    BwdSwappedSharedStorage<Cfg>& s, const BwdParams& bp, const BwdSeq& seq,
    const kernel::QueryBlocks<Cfg::kBlockM, Cfg::kBlockN, kMasked>& steps, int kv_head, int lane) {
  const sm80::FwdParams& f = bp.p.fwd;
  const int q_row = static_cast<int>(seq.q_row0(f));
  const int per_head = steps.m_max - steps.m_min;
  const int n = f.h_ratio * per_head;
  for (int i = 0; i < n; ++i) {
    const int st = i % Cfg::kStages;
    const int h = kv_head * f.h_ratio + i / per_head;
    const int m0 = (steps.m_min + i % per_head) * Cfg::kBlockM;
#pragma unroll
    for (int cw = 0; cw < Cfg::kConsumers; ++cw) {
      dq_full_barrier<true>(i % 2, cw);
      const uint8_t* tile = cw == 0 ? s.q[st][0] : s.dout[st][0];
      if (lane == 0)
#pragma unroll
        for (int c = 0; c < Cfg::kDqBoxes; ++c)
          tma_reduce_add_4d(&bp.tma_dq_accum, tile + c * Cfg::kDqBoxBytes,
                            Cfg::dq_col0(cw) + c * Cfg::kDqBoxCols, q_row + m0, h, 0);
    }
    if (lane == 0) {
      tma_store_commit();
      tma_store_wait_read();
      s.empty[st].arrive();
    }
    __syncwarp();
  }
  // The last reduce-adds complete before the CTA (and its shared memory) goes.
  if (lane == 0) tma_store_wait_all();
}

template <class Cfg, bool kBf16, bool kMasked>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_swapped_kernel(const __grid_constant__ BwdParams bp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // Realigned by pointer arithmetic, so that the accesses through `s` stay shared (bwd_kernel).
  const uint32_t misalign = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) % 1024;
  auto& s = *reinterpret_cast<BwdSwappedSharedStorage<Cfg>*>(smem_raw + (1024 - misalign) % 1024);
  const sm80::FwdParams& f = bp.p.fwd;
  const int n_block = blockIdx.x, kv_head = blockIdx.y;
  const BwdSeq seq(f, blockIdx.z);
  // Key blocks past the sequence's keys have nothing to compute (their dK, dV rows were zeroed
  // by the caller); the whole CTA leaves before any barrier.
  if (n_block * Cfg::kBlockN >= seq.lens.kv_len) return;
  const kernel::QueryBlocks<Cfg::kBlockM, Cfg::kBlockN, kMasked> steps(
      n_block, seq.lens.q_len, seq.lens.kv_len, f.window_left, f.window_right);
  // Broadcast so that ptxas knows the roles are warp-uniform (C7520: bwd_kernel.h).
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  const int tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    s.kv_full.init(1);
#pragma unroll
    for (int st = 0; st < Cfg::kStages; ++st) {
      s.full[st].init(32);                          // the producer warp's lanes
      s.empty[st].init(1 + Cfg::kConsumers * 128);  // the dQ writer's lane 0, every consumer
    }
    s.mask_free[0] = min(max(steps.full_lo, steps.m_min), steps.m_max);
    s.mask_free[1] = min(max(steps.full_hi, s.mask_free[0]), steps.m_max);
    Mbarrier::fence_init();
  }
  __syncthreads();
  if (warpgroup == 0) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    const int warp = __shfl_sync(0xffffffffu, tid / 32, 0);
    if (warp == 0) {
      int i = 0;
      bwd_produce<Cfg, kMasked, true>(s, bp, seq, steps, n_block, kv_head, tid, i, 0, 0);
    } else if (warp == 1) {
      bwd_write_dq_swapped<Cfg, kMasked>(s, bp, seq, steps, kv_head, tid - 32);
    }
  } else {
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    bwd_consume_swapped<Cfg, kBf16, kMasked>(s, bp, seq, steps, n_block, kv_head, warpgroup - 1,
                                             tid);
  }
#endif
}

}  // namespace flashserve::attention::sm90
