// The sm90 (Hopper, sm_90a) forward kernel, v1: one 128-row query tile per CTA, three
// warpgroups. Warpgroup 0 is the producer: one thread issues the TMA copies of Q and of the K/V
// blocks into a two-stage shared-memory ring, the others idle, and all give registers back
// (setmaxnreg.dec). Warpgroups 1 and 2 are the consumers, 64 query rows each: S = Q K^T by wgmma
// from shared memory, the online softmax on the accumulator fragment in registers, P converted to
// 16-bit in registers and O += P V by wgmma with A from registers. Barriers per stage: k_full and
// v_full (TMA bytes landed) and empty (both consumers done with K and V of that stage).
//
// Not yet here (docs/kernel-notes.md, "sm90 next steps"): ping-pong between the consumers,
// softmax overlapped with the next QK^T, a persistent scheduler, TMA stores, varlen, paged K/V,
// windows, split-KV.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "fwd_params.h"
#include "mbarrier.h"
#include "tile_config.h"
#include "tma.h"
#include "wgmma.h"

namespace flashserve::attention::sm90 {

template <class Cfg>
struct SharedStorage {
  // Each chunk is a 1024-byte aligned run of 8-row swizzle atoms (wgmma.h).
  alignas(1024) uint8_t q[Cfg::kChunks][Cfg::kQChunkBytes];
  alignas(1024) uint8_t k[Cfg::kStages][Cfg::kChunks][Cfg::kKVChunkBytes];
  alignas(1024) uint8_t v[Cfg::kStages][Cfg::kChunks][Cfg::kKVChunkBytes];
  Mbarrier q_full;
  Mbarrier k_full[Cfg::kStages];
  Mbarrier v_full[Cfg::kStages];
  Mbarrier empty[Cfg::kStages];
};

template <class Cfg>
constexpr int smem_bytes() {
  return static_cast<int>(sizeof(SharedStorage<Cfg>)) + 1024;  // + the base's realignment
}

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Key blocks that query tile m_block needs: up to the last key any of its rows sees (bottom-right
// causal: row t sees keys <= kv_len - q_len + t). 0 when no row sees a key.
template <class Cfg, bool kCausal>
__device__ __forceinline__ int key_blocks(int m_block, int q_len, int kv_len) {
  int n = (kv_len + Cfg::kBlockN - 1) / Cfg::kBlockN;
  if (kCausal) {
    const int last_row = min((m_block + 1) * Cfg::kBlockM, q_len) - 1;
    const int last_key = kv_len - q_len + last_row;
    n = last_key < 0 ? 0 : min(n, last_key / Cfg::kBlockN + 1);
  }
  return n;
}

template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kBf16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

template <class Cfg, bool kBf16, bool kCausal>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_kernel(const __grid_constant__ FwdParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kD = Cfg::kHeadDim;
  constexpr int kStages = Cfg::kStages, kChunks = Cfg::kChunks;
  extern __shared__ uint8_t smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage<Cfg>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                                   ~uintptr_t{1023});

  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int q_len = p.seqlen_q, kv_len = p.seqlen_k;
  const int warpgroup = threadIdx.x / 128, tid = threadIdx.x % 128;
  const int n_blocks = key_blocks<Cfg, kCausal>(m_block, q_len, kv_len);

  if (threadIdx.x == 0) {
    s.q_full.init(1);
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      s.k_full[st].init(1);
      s.v_full[st].init(1);
      s.empty[st].init(2 * 128);  // every consumer thread arrives
    }
    Mbarrier::fence_init();
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ---- Producer: one thread streams Q once and K/V blocks through the ring. ----
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (tid == 0 && n_blocks > 0) {
      const int kv_head = head / p.h_ratio;
      s.q_full.arrive_expect_tx(Cfg::kQBytes);
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        tma_load_4d(s.q[c], &p.tma_q, s.q_full, c * Cfg::kChunkCols, m_block * kBlockM, head,
                    batch);
      for (int j = 0; j < n_blocks; ++j) {
        const int st = j % kStages, round = j / kStages;
        s.empty[st].wait((round & 1) ^ 1);  // round 0 passes on the fresh barrier
        s.k_full[st].arrive_expect_tx(Cfg::kKVBytes);
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          tma_load_4d(s.k[st][c], &p.tma_k, s.k_full[st], c * Cfg::kChunkCols, j * kBlockN, kv_head,
                      batch);
        s.v_full[st].arrive_expect_tx(Cfg::kKVBytes);
#pragma unroll
        for (int c = 0; c < kChunks; ++c)
          tma_load_4d(s.v[st][c], &p.tma_v, s.v_full[st], c * Cfg::kChunkCols, j * kBlockN, kv_head,
                      batch);
      }
    }
    return;
  }

  // ---- Consumers: warpgroup 1 takes tile rows 0..63, warpgroup 2 rows 64..127. ----
  setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int cw = warpgroup - 1;
  const int warp = tid / 32, lane = tid % 32;
  // The two rows of this thread in the accumulator fragment (wgmma.h), as query indices.
  const int row0 = m_block * kBlockM + cw * 64 + warp * 16 + lane / 4;
  const int col0 = 2 * (lane % 4);

  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's share; the quad's shares are added at the end

  if (n_blocks > 0) s.q_full.wait(0);
  // Q's descriptor for this warpgroup's 64 rows (8 atoms of 8 rows, 1024 bytes apart).
  const uint64_t q_desc = smem_desc_sw128(s.q[0] + cw * 64 * 128, 16, 1024);

  for (int j = 0; j < n_blocks; ++j) {
    const int st = j % kStages;
    const uint32_t phase = (j / kStages) & 1;

    // S = Q K^T: d/16 k-steps; step k reads column chunk k/4 at byte 32 (k%4) of each row.
    float sc[kBlockN / 2];
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) sc[i] = 0.0f;
    const uint64_t k_desc = smem_desc_sw128(s.k[st][0], 16, 1024);
    s.k_full[st].wait(phase);
    fence_regs(sc);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kD / 16; ++k) {
      const uint32_t off = (k % 4) * 32;
      mma_ss<kBlockN, kBf16>(sc, desc_advance(q_desc, (k / 4) * Cfg::kQChunkBytes + off),
                             desc_advance(k_desc, (k / 4) * Cfg::kKVChunkBytes + off), k > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(sc);

    // Mask keys past kv_len and, causal, past each row's diagonal (only blocks that reach them).
    const int key0 = j * kBlockN;
    const bool ragged = key0 + kBlockN > kv_len;
    const bool diagonal =
        kCausal && key0 + kBlockN - 1 > kv_len - q_len + m_block * kBlockM + cw * 64;
    if (ragged || diagonal) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int limit = kCausal ? min(kv_len - 1, kv_len - q_len + row0 + 8 * h) : kv_len - 1;
#pragma unroll
        for (int i = 0; i < kBlockN / 8; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (key0 + 8 * i + col0 + e > limit) sc[4 * i + 2 * h + e] = -INFINITY;
      }
    }

    // Online softmax per row: new max over the quad, rescale of O and of the running sum.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = row_max[h];
#pragma unroll
      for (int i = 0; i < kBlockN / 8; ++i)
        mx = fmaxf(mx, fmaxf(sc[4 * i + 2 * h], sc[4 * i + 2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row that has seen no key yet keeps max -inf: subtract 0 so exp2 gives 0, not NaN.
      const float mx_scaled = mx == -INFINITY ? 0.0f : mx * p.scale_log2;
      const float correction = exp2f(row_max[h] * p.scale_log2 - mx_scaled);
      row_max[h] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kBlockN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = sc[4 * i + 2 * h + e];
          x = exp2f(fmaf(x, p.scale_log2, -mx_scaled));
          sum += x;
        }
      row_sum[h] = row_sum[h] * correction + sum;
#pragma unroll
      for (int i = 0; i < kD / 8; ++i) {
        o[4 * i + 2 * h] *= correction;
        o[4 * i + 2 * h + 1] *= correction;
      }
    }

    // P as the A operand of the RS wgmma: k-step kk is accumulator columns 16kk .. 16kk + 15.
    uint32_t pa[kBlockN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        pa[kk][r] = pack2<kBf16>(sc[8 * kk + 2 * r], sc[8 * kk + 2 * r + 1]);

    // O += P V: V is [keys, d] row-major, MN-major for this B; 16 keys (2 atoms, 2048 bytes) per
    // k-step; LBO steps from one 64-column chunk of V to the next.
    const uint64_t v_desc = smem_desc_sw128(s.v[st][0], Cfg::kKVChunkBytes, 1024);
    s.v_full[st].wait(phase);
    fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      mma_rs<kD, kBf16>(o, pa[kk], desc_advance(v_desc, kk * 16 * 128), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    s.empty[st].arrive();
  }

  // ---- Epilogue: O / sum, LSE; rows past q_len are not stored. ----
  using Elem = std::conditional_t<kBf16, __nv_bfloat16, __half>;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = row_sum[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int t = row0 + 8 * h;
    if (t >= q_len) continue;
    // No key seen (fully masked row or no keys): O = 0 and LSE = -inf. A NaN score (NaN input;
    // fmaxf skips it in the max but its exp2 is NaN) or a +inf one (inf - inf) leaves sum NaN,
    // so the row's O and LSE come out NaN, as in PyTorch and the sm80 kernels.
    const bool seen = sum != 0.0f;
    const float inv = seen ? 1.0f / sum : 0.0f;
    Elem* out = static_cast<Elem*>(p.out) + batch * p.o_batch_stride + t * p.o_row_stride +
                head * p.o_head_stride;
#pragma unroll
    for (int i = 0; i < kD / 8; ++i)
      *reinterpret_cast<uint32_t*>(out + 8 * i + col0) =
          pack2<kBf16>(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
    if (p.lse != nullptr && lane % 4 == 0)
      p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + t * p.lse_row_stride] =
          seen ? row_max[h] * p.scale + logf(sum) : -INFINITY;
  }
#endif
}

}  // namespace flashserve::attention::sm90
