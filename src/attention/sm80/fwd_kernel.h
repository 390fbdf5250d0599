// The sm80 forward kernel (FlashAttention-2 partitioning): one thread block per (query tile,
// query head, sequence); its warps split the tile's query rows, so the key loop needs no
// cross-warp reduction. K/V tiles stream through a `kStages`-deep cp.async ring with one
// __syncthreads per key block, or (kStages == 1) through single K and V buffers with two. The body
// only wires the parts together.
#pragma once

#include <cstdint>
#include <type_traits>

#include "block_mask.h"
#include "epilogue.h"
#include "fwd_params.h"
#include "ptx.h"
#include "smem_tile.h"
#include "softmax.h"
#include "tile_config.h"
#include "warp_gemm.h"

namespace flashserve::attention::sm80 {

template <class Cfg, class Elem, bool kHasMask, bool kPaged, bool kSplit>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    fwd_kernel(const __grid_constant__ FwdParams p) {
  constexpr int D = Cfg::kHeadDim, kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kS = Cfg::kStages;
  constexpr int kMT = Cfg::kMTiles, kNT = Cfg::kNTiles, kDT = Cfg::kDTiles;
  extern __shared__ __align__(128) unsigned char smem[];
  Elem* sq = reinterpret_cast<Elem*>(smem);
  Elem* sk = sq + kBM * D;       // kS tiles of [kBN, D]
  Elem* sv = sk + kS * kBN * D;  // kS tiles of [kBN, D]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Masked (causal / window) tiles differ in cost; launching the heaviest (last) ones first
  // shortens the tail of the grid.
  const int m_block = kHasMask ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int head = blockIdx.y;
  // Split-KV is its own instantiation so that the unsplit kernels carry none of its registers.
  const int batch = kSplit ? blockIdx.z / p.num_splits : blockIdx.z;
  const SeqInfo seq(p, batch);
  const int m0 = m_block * kBM;
  if (m0 >= seq.q_len) return;  // varlen: this sequence is shorter than the grid's longest
  const int kv_head = head / p.h_ratio;
  KeyBlocks<kBM, kBN, kHasMask> blocks(m0, seq.q_len, seq.kv_len, p.window_left, p.window_right);
  if constexpr (kSplit) blocks.keep_split(blockIdx.z % p.num_splits, p.num_splits);

  const Elem* q =
      static_cast<const Elem*>(p.q) + seq.q_off(p) + m0 * p.q_row_stride + head * p.q_head_stride;
  const Elem* k = static_cast<const Elem*>(p.k) + seq.k_off(p) + kv_head * p.k_head_stride;
  const Elem* v = static_cast<const Elem*>(p.v) + seq.v_off(p) + kv_head * p.v_head_stride;
  auto load_k = [&](int n, int buf) {
    if constexpr (kPaged) {
      load_tile_paged_async<kBN, D, Cfg::kThreads>(
          sk + buf * kBN * D, k, p.block_table + batch * p.block_table_stride, p.page_size,
          p.k_page_stride, p.k_row_stride, n * kBN, seq.kv_len - n * kBN, tid);
    } else {
      load_tile_async<kBN, D, Cfg::kThreads>(sk + buf * kBN * D, k + n * kBN * p.k_row_stride,
                                             p.k_row_stride, seq.kv_len - n * kBN, tid);
    }
  };
  auto load_v = [&](int n, int buf) {
    if constexpr (kPaged) {
      load_tile_paged_async<kBN, D, Cfg::kThreads>(
          sv + buf * kBN * D, v, p.block_table + batch * p.block_table_stride, p.page_size,
          p.v_page_stride, p.v_row_stride, n * kBN, seq.kv_len - n * kBN, tid);
    } else {
      load_tile_async<kBN, D, Cfg::kThreads>(sv + buf * kBN * D, v + n * kBN * p.v_row_stride,
                                             p.v_row_stride, seq.kv_len - n * kBN, tid);
    }
  };

  float acc_o[kMT][kDT][4];
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mi][dt][e] = 0.0f;
  OnlineSoftmax<kMT, Cfg::kSkipUnchangedRescale> softmax;

  const int warp_row = warp * Cfg::kWarpRows;  // the warp's first row within the tile
  Elem* sq_warp = sq + warp_row * D;

  if (blocks.n_max > blocks.n_min) {
    // Prologue: Q and the first key block (from the right). With kS >= 2: Q, then the first
    // kS - 1 key blocks, one commit group each. With kS == 1 (FlashAttention-2's own schedule):
    // Q and K only; V of a block loads during its QK^T, K of the next during softmax and PV.
    load_tile_async<kBM, D, Cfg::kThreads>(sq, q, p.q_row_stride, seq.q_len - m0, tid);
    if constexpr (kS == 1) {
      load_k(blocks.n_max - 1, 0);
      cp_async_commit();
    } else {
#pragma unroll
      for (int s = 0; s < kS - 1; ++s) {
        if (blocks.n_max - 1 - s >= blocks.n_min) {
          load_k(blocks.n_max - 1 - s, s);
          load_v(blocks.n_max - 1 - s, s);
        }
        cp_async_commit();
      }
    }

    const int offset = seq.kv_len - seq.q_len;
    const int row0 = m0 + warp_row + (lane >> 2);
    int buf = 0;
    // One key block: wait for its tile; the barrier also retires the previous block's buffer,
    // which the load kS - 1 blocks ahead then refills.
    auto step = [&](int n, auto masked) {
      float s[kMT][kNT][4];
      if constexpr (kS == 1) {
        cp_async_wait<0>();  // K(n)
        __syncthreads();     // ... for every thread; and every warp is done with V(n + 1)
        load_v(n, 0);
        cp_async_commit();
        gemm_qk<D, kMT, kNT>(s, sq_warp, sk, lane);
      } else {
        cp_async_wait<kS - 2>();
        __syncthreads();
        const int ahead = n - (kS - 1);
        if (ahead >= blocks.n_min) {
          load_k(ahead, buf == 0 ? kS - 1 : buf - 1);
          load_v(ahead, buf == 0 ? kS - 1 : buf - 1);
        }
        cp_async_commit();
        gemm_qk<D, kMT, kNT>(s, sq_warp, sk + buf * kBN * D, lane);
      }
      if constexpr (decltype(masked)::value)
        mask_scores<kMT, kNT, kHasMask>(s, row0, n * kBN + 2 * (lane & 3), seq.kv_len, offset,
                                        p.window_left, p.window_right);
      if constexpr (kS == 1) {
        cp_async_wait<0>();  // V(n)
        __syncthreads();     // ... for every thread; and every warp is done reading K(n)
        if (n - 1 >= blocks.n_min) load_k(n - 1, 0);
        cp_async_commit();
      }
      softmax.update(s, acc_o, p.scale_log2);
      gemm_pv<D, kMT, kNT, kDT>(acc_o, s, sv + buf * kBN * D, lane);
      buf = buf == kS - 1 ? 0 : buf + 1;
    };
    // Right to left: the boundary blocks of the diagonal / kv_len first, then the fast path, then
    // the left edge of a sliding window.
    for (int n = blocks.n_max - 1; n >= blocks.n_min; --n) {
      if (blocks.needs_mask(n)) {
        step(n, std::true_type{});
      } else {
        step(n, std::false_type{});
      }
    }
  }

  float lse[kMT][2];
  softmax.finish(acc_o, p.scale, lse);
  const int rows_valid = seq.q_len - m0 - warp_row;
  if constexpr (kSplit) {
    const int64_t row = seq.q_row0(p) + m0 + warp_row;  // among all q rows
    const int64_t slot = (blockIdx.z % p.num_splits * p.q_rows + row) * p.h_q + head;
    store_partial<kMT, kDT>(acc_o, lse, p.o_partial + slot * D, int64_t{p.h_q} * D,
                            p.lse_partial + slot, p.h_q, rows_valid, lane);
  } else {
    Elem* out = static_cast<Elem*>(p.out) + seq.o_off(p) + (m0 + warp_row) * p.o_row_stride +
                head * p.o_head_stride;
    float* lse_out = p.lse == nullptr ? nullptr
                                      : p.lse + seq.lse_off(p) + head * p.lse_head_stride +
                                            (m0 + warp_row) * p.lse_row_stride;
    store_output<D, kMT, kDT>(acc_o, lse, sq_warp, out, p.o_row_stride, lse_out, p.lse_row_stride,
                              rows_valid, lane);
  }
}

}  // namespace flashserve::attention::sm80
