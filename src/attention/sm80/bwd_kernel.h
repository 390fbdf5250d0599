// The sm80 backward kernels (FlashAttention-2's algorithm, mma.sync), in three launches:
//   bwd_preprocess: D = rowsum(dout o out) - dlse per (query row, head), into the workspace.
//   bwd_kernel:     one thread block per (block of kBlockN keys, KV head, sequence). K and V stay
//                   in shared memory; the block walks every query head of the GQA group and every
//                   block of kBlockM queries that sees its keys, recomputing per step
//                     S^T = K Q^T,  P^T = exp2(S^T scale log2(e) - lse log2(e))  (0 where masked),
//                     dP^T = V dO^T,  dS^T = P^T o (dP^T - D),
//                     dV += P^T dO,  dK += dS^T Q  (in registers: the group's sum, no atomics),
//                     dQ += dS K  (dS through shared memory; fp32 atomics into the workspace).
//   bwd_postprocess: dq = scale x the accumulated dQ, rounded to the dtype.
// Each warp owns 16 keys of the block (the rows of its S^T, dV and dK tiles), so the GEMMs are
// the forward's (warp_gemm.h): gemm_qk for S^T and dP^T (A = the warp's K or V rows, B = the
// query tile's Q or dO rows), gemm_pv for dV, dK (A = P^T, dS^T packed from the accumulators,
// B = dO or Q through ldmatrix.trans) and for dQ (A = dS from shared memory, B = K).
// Correctness first: one buffer per tile and two barriers per step (no cp.async ring, no
// copy-ahead); the tuning belongs to docs/kernel-notes.md once it is measured.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention/kernel/dq_round.h"
#include "bwd_params.h"
#include "ptx.h"
#include "smem_tile.h"
#include "warp_gemm.h"

namespace flashserve::attention::sm80 {

template <int kHeadDim_>
struct BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = 64;  // keys per block: 4 warps x 16
  static constexpr int kBlockM = 64;  // queries per step
  static constexpr int kWarps = kBlockN / 16;
  static constexpr int kThreads = 32 * kWarps;
  // Shared memory: K, V, Q, dO tiles [64, D], dS [kBlockM, kBlockN], then lse and D of the step.
  static constexpr int kTileElems = kBlockN * kHeadDim;
  static constexpr int kSmemBytes =
      2 * (4 * kTileElems + kBlockM * kBlockN) + 2 * kBlockM * int(sizeof(float));
  // Every column of kHeadDim is real and one launch computes all of dQ's, dK's and dV's.
  static constexpr bool kPadded = false;
  static constexpr int kOutDim = kHeadDim;
};

// The kernels of BwdConfig<kHeadDim> for a call whose head dim (BwdParams::head_dim, a multiple of
// 8) is at most kHeadDim (issue 22; the forward's PaddedConfig, tile_config.h): q, k, v and dout
// rows are zero-filled past it on load, so S and dP are exact, and the products skip the k16 steps
// and 16-column groups that hold only zeros; dq, dk, dv and the accumulator are never touched past
// it. Past 128 columns a launch computes kOutDim = kHeadDim / 2 columns of dQ, dK and dV
// (BwdParams::col0) and the host launches the kernel twice: the whole width's dK and dV in
// registers (128 accumulators a thread each at d256) spilled; halving them costs S and dP once
// more per launch (7 products where one launch does 5: 1.4x the FLOPs).
template <int kHeadDim_>
struct BwdPaddedConfig : BwdConfig<kHeadDim_> {
  static constexpr bool kPadded = true;
  static constexpr int kOutDim = kHeadDim_ <= 128 ? kHeadDim_ : kHeadDim_ / 2;
};

// The columns a backward kernel reads and writes: for BwdConfig every one of kHeadDim (AllChunks,
// compile-time facts), for BwdPaddedConfig the call's (ChunkBound, run-time counts).
template <class Cfg>
struct BwdColumns {
  using Bound = std::conditional_t<Cfg::kPadded, ChunkBound, AllChunks>;
  Bound chunks;  // 16-byte chunks of a q, k, v or dout row that hold real columns (the loads)
  Bound steps;   // k16 steps of S = Q K^T and dP = dO V^T over real columns
  Bound pairs;   // pairs of d-tiles (16 columns) of the launch's dQ, dK, dV with a real column
  int col0;      // the launch's first column of dQ, dK and dV
  int live;      // of its kOutDim columns, those before the call's head dim
  int pitch;     // floats per (row, head) of the dq accumulator: the call's head dim
  __device__ __forceinline__ explicit BwdColumns(const BwdParams& p) {
    if constexpr (Cfg::kPadded) {
      chunks.n = p.head_dim / 8;
      steps.n = (p.head_dim + 15) / 16;
      col0 = p.col0;
      live = min(Cfg::kOutDim, p.head_dim - p.col0);
      pairs.n = (live + 15) / 16;
      pitch = p.head_dim;
    } else {
      col0 = 0, live = Cfg::kOutDim, pitch = Cfg::kHeadDim;
    }
  }
  // Whether column `col` of the launch's kOutDim is one of the call's (a constant for BwdConfig).
  __device__ __forceinline__ bool has(int col) const {
    if constexpr (Cfg::kPadded)
      return col < live;
    else
      return true;
  }
};

template <class Elem>
__device__ __forceinline__ float to_f(Elem x) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>)
    return __bfloat162float(x);
  else
    return __half2float(x);
}
template <class Elem>
__device__ __forceinline__ Elem from_f(float x) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return __float2half_rn(x);
}

// The preprocess and postprocess give each (query row, head) a group of row_lanes(head_dim)
// consecutive lanes, each lane 8 consecutive elements at a time: one 16-byte load of out and of
// dout, two of the fp32 accumulator, one 16-byte store of dq. Grid (rows / rows per block, h_q,
// batch). One warp per row with 2-byte accesses (session 19's version) issued 4-8x the
// instructions for the same bytes and ran at half the copy bandwidth, d64 at half d128's rate
// (kernel-notes, "Session 21 on the device"). Every tensor here is 16-byte aligned with row and
// head strides in multiples of 8 elements (check_aligned), and the accumulator's rows are
// head_dim floats.
inline constexpr int kRowThreads = 256;

// Lanes per row: head_dim / 8 rounded up to a power of two (a group never straddles a warp), at
// most 32; a lane takes the 8-element chunks lane, lane + lanes, ... of its row.
__host__ __device__ constexpr int row_lanes(int head_dim) {
  int lanes = 1;
  while (lanes < 32 && lanes * 8 < head_dim) lanes *= 2;
  return lanes;
}

// The (query row, head) of a lane of a preprocess or postprocess block, its lane within the row's
// group, and the group's lane mask in its warp.
struct RowLane {
  int t, h, lane, lanes;
  unsigned group_mask;
  __device__ __forceinline__ explicit RowLane(int head_dim)
      : t(0), h(blockIdx.y), lane(0), lanes(row_lanes(head_dim)), group_mask(0) {
    const int x = static_cast<int>(threadIdx.x);
    t = static_cast<int>(blockIdx.x) * (kRowThreads / lanes) + x / lanes;
    lane = x % lanes;
    const unsigned ones = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
    group_mask = ones << (x % 32 - lane);
  }
};

// A 16-bit element from its bits (the way back is kernel::scale_round8's).
template <class Elem>
__device__ __forceinline__ Elem elem_of_bits(unsigned short b) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>)
    return __ushort_as_bfloat16(b);
  else
    return __ushort_as_half(b);
}

// Eight 16-bit elements of one 16-byte load, as floats.
template <class Elem>
__device__ __forceinline__ void unpack8(const uint4& v, float (&x)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = to_f(elem_of_bits<Elem>(static_cast<unsigned short>(w[i] & 0xffffu)));
    x[2 * i + 1] = to_f(elem_of_bits<Elem>(static_cast<unsigned short>(w[i] >> 16)));
  }
}

// D = rowsum(dout o out) - dlse for the sequence's query rows.
template <class Elem>
__global__ void bwd_preprocess(const BwdParams p, int head_dim) {
  const FwdParams& f = p.fwd;
  const SeqInfo seq(f, blockIdx.z);
  const RowLane r(head_dim);
  if (r.t >= seq.q_len) return;  // the row's whole group
  const int t = r.t, h = r.h;
  const int64_t row = seq.q_row0(f) + t;
  const int64_t do_off =
      (f.cu_seqlens_q ? seq.q_start * p.do_row_stride : seq.b * p.do_batch_stride) +
      t * p.do_row_stride + h * p.do_head_stride;
  const Elem* o =
      static_cast<const Elem*>(f.out) + seq.o_off(f) + t * f.o_row_stride + h * f.o_head_stride;
  const Elem* g = static_cast<const Elem*>(p.dout) + do_off;
  float d = 0.0f;
  for (int c = r.lane; c * 8 < head_dim; c += r.lanes) {
    float x[8], y[8];
    unpack8<Elem>(*reinterpret_cast<const uint4*>(o + 8 * c), x);
    unpack8<Elem>(*reinterpret_cast<const uint4*>(g + 8 * c), y);
#pragma unroll
    for (int i = 0; i < 8; ++i) d += x[i] * y[i];
  }
  for (int lanes = r.lanes / 2; lanes > 0; lanes /= 2) d += __shfl_xor_sync(r.group_mask, d, lanes);
  if (r.lane != 0) return;
  if (p.dlse != nullptr) {
    const int64_t base =
        f.cu_seqlens_q ? seq.q_start * p.dlse_row_stride : seq.b * p.dlse_batch_stride;
    d -= p.dlse[base + t * p.dlse_row_stride + h * p.dlse_head_stride];
  }
  p.delta[row * f.h_q + h] = d;
}

// dq = scale x dQ accumulated, for the rows of the sequences (grid as bwd_preprocess).
template <class Elem>
__global__ void bwd_postprocess(const BwdParams p, int head_dim) {
  const FwdParams& f = p.fwd;
  const SeqInfo seq(f, blockIdx.z);
  const RowLane r(head_dim);
  if (r.t >= seq.q_len) return;
  const int t = r.t, h = r.h;
  const int64_t row = seq.q_row0(f) + t;
  const float* acc = p.dq_accum + (row * f.h_q + h) * head_dim;
  Elem* dq = static_cast<Elem*>(p.dq) +
             (f.cu_seqlens_q ? seq.q_start * p.dq_row_stride : seq.b * p.dq_batch_stride) +
             t * p.dq_row_stride + h * p.dq_head_stride;
  for (int c = r.lane; c * 8 < head_dim; c += r.lanes) {
    const float4 a = *reinterpret_cast<const float4*>(acc + 8 * c);
    const float4 b = *reinterpret_cast<const float4*>(acc + 8 * c + 4);
    *reinterpret_cast<uint4*>(dq + 8 * c) = kernel::scale_round8<Elem>(a, b, f.scale);
  }
}

// Zeros every element of a [d0, d1, d2, d3] view (rank 3: d0 = 1) with the given strides; the
// gradients of rows and keys no sequence's tile writes (varlen rows of no sequence, keys past
// seqused_k) are 0.
template <class Elem>
__global__ void bwd_zero(Elem* x, int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1,
                         int64_t s2, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % d3, r2 = (i / d3) % d2, r1 = (i / (d3 * d2)) % d1,
                  r0 = i / (d3 * d2 * d1);
    x[r0 * s0 + r1 * s1 + r2 * s2 + c] = from_f<Elem>(0.0f);
  }
}

// dS^T of a warp's 16 keys (accumulators over the step's queries) into shared memory as rows of
// queries: [kBlockM][kBlockN], swizzled like every tile (smem_tile.h).
template <class Cfg, class Elem>
__device__ __forceinline__ void store_ds(const float (&ds)[Cfg::kBlockM / 8][4], Elem* sds,
                                         int warp, int lane) {
  constexpr int kBN = Cfg::kBlockN;
#pragma unroll
  for (int nt = 0; nt < Cfg::kBlockM / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int qi = nt * 8 + 2 * (lane & 3) + (e & 1);
      const int kl = warp * 16 + (lane >> 2) + (e >= 2 ? 8 : 0);
      sds[swizzled<kBN>(qi, kl >> 3) + (kl & 7)] = from_f<Elem>(ds[nt][e]);
    }
}

// The step's dQ rows 16 warp .. 16 warp + 15 over the launch's columns (A = dS rows from shared
// memory, B = the block's K), added into the fp32 accumulator of the workspace.
template <class Cfg, class Elem>
__device__ __forceinline__ void atomic_add_dq(const BwdParams& p, const BwdColumns<Cfg>& cols,
                                              const Elem* sds, const Elem* sk, int m0, int q_len,
                                              int64_t q_row0, int h, int warp, int lane) {
  constexpr int D = Cfg::kHeadDim, kBN = Cfg::kBlockN, kDT = Cfg::kOutDim / 8;
  float dq[1][kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[0][dt][e] = 0.0f;
  const int l7 = lane & 7;
  const uint32_t a_base =
      smem_addr(sds + warp * 16 * kBN) + (l7 + ((lane >> 3) & 1) * 8) * (kBN * 2);
  const int a_chunk = lane >> 4;
  gemm_pv<D, 1, kBN / 16, kDT, false>(
      dq,
      [&](int ks, uint32_t(&a)[1][4]) {
        ldmatrix_x4(a[0], a_base + (((2 * ks + a_chunk) ^ l7) << 4));
      },
      sk + cols.col0, lane, cols.pairs);
  float* acc = p.dq_accum + cols.col0;
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int t = m0 + warp * 16 + (lane >> 2) + (e >= 2 ? 8 : 0);
      const int col = dt * 8 + 2 * (lane & 3) + (e & 1);
      if (t < q_len && cols.has(col))
        atomicAdd(acc + ((q_row0 + t) * p.fwd.h_q + h) * cols.pitch + col, dq[0][dt][e]);
    }
}

// kDq: dQ by atomics here (else bwd_dq_kernel computes it, in a fixed order: deterministic mode).
// Padded (BwdPaddedConfig): dK, dV and dQ of the launch's columns only.
template <class Cfg, class Elem, bool kHasMask, bool kDq>
__global__ void __launch_bounds__(Cfg::kThreads) bwd_kernel(const BwdParams p) {
  constexpr int D = Cfg::kHeadDim, kBN = Cfg::kBlockN, kBM = Cfg::kBlockM;
  constexpr int kThreads = Cfg::kThreads, kDT = Cfg::kOutDim / 8, kQT = kBM / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Elem* sk = reinterpret_cast<Elem*>(smem_raw);
  Elem* sv = sk + Cfg::kTileElems;
  Elem* sq = sv + Cfg::kTileElems;
  Elem* sdo = sq + Cfg::kTileElems;
  Elem* sds = sdo + Cfg::kTileElems;  // [kBM queries][kBN keys], swizzled rows of kBN
  float* s_lse2 = reinterpret_cast<float*>(sds + kBM * kBN);
  float* s_delta = s_lse2 + kBM;

  const FwdParams& f = p.fwd;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n0 = blockIdx.x * kBN, hk = blockIdx.y;
  const SeqInfo seq(f, blockIdx.z);
  if (n0 >= seq.kv_len) return;  // keys past the sequence: zeroed beforehand
  const int q_len = seq.q_len, kv_len = seq.kv_len, offset = kv_len - q_len;
  const int left = kHasMask ? f.window_left : -1, right = kHasMask ? f.window_right : -1;
  const BwdColumns<Cfg> cols(p);

  // K and V of the block, once.
  const Elem* kg = static_cast<const Elem*>(f.k) + seq.k_off(f) + hk * f.k_head_stride;
  const Elem* vg = static_cast<const Elem*>(f.v) + seq.v_off(f) + hk * f.v_head_stride;
  const int valid_keys = min(kBN, kv_len - n0);
  load_tile_async<kBN, D, kThreads>(sk, kg + n0 * f.k_row_stride, f.k_row_stride, valid_keys, tid,
                                    cols.chunks);
  load_tile_async<kBN, D, kThreads>(sv, vg + n0 * f.v_row_stride, f.v_row_stride, valid_keys, tid,
                                    cols.chunks);
  cp_async_commit();

  // The queries that see some key of [n0, n0 + kBN): query t sees key j iff
  // t + offset - left <= j <= t + offset + right.
  int t_lo = 0, t_hi = q_len - 1;
  if (right >= 0) t_lo = max(0, n0 - offset - right);
  if (left >= 0) t_hi = min(q_len - 1, n0 + kBN - 1 - offset + left);
  const int m_begin = t_lo / kBM * kBM;

  float dk[1][kDT][4], dv[1][kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[0][dt][e] = dv[0][dt][e] = 0.0f;

  // This thread's keys in the accumulators: rows g and g + 8 of the warp's 16.
  const int key0 = n0 + warp * 16 + (lane >> 2);
  const float log2e = 1.4426950408889634f;
  for (int h = hk * f.h_ratio; h < (hk + 1) * f.h_ratio; ++h) {
    const Elem* qg = static_cast<const Elem*>(f.q) + seq.q_off(f) + h * f.q_head_stride;
    const Elem* dog = static_cast<const Elem*>(p.dout) +
                      (f.cu_seqlens_q ? seq.q_start * p.do_row_stride : seq.b * p.do_batch_stride) +
                      h * p.do_head_stride;
    const float* lse = f.lse + seq.lse_off(f) + h * f.lse_head_stride;
    const int64_t q_row0 = seq.q_row0(f);
    for (int m0 = m_begin; m0 <= t_hi; m0 += kBM) {
      __syncthreads();  // the previous step is done with Q, dO, dS, lse, D
      const int valid_q = min(kBM, q_len - m0);
      load_tile_async<kBM, D, kThreads>(sq, qg + m0 * f.q_row_stride, f.q_row_stride, valid_q, tid,
                                        cols.chunks);
      load_tile_async<kBM, D, kThreads>(sdo, dog + m0 * p.do_row_stride, p.do_row_stride, valid_q,
                                        tid, cols.chunks);
      cp_async_commit();
      if (tid < kBM) {
        const int t = m0 + tid;
        // lse = -inf (a row that saw no key) is masked below anyway; +inf makes its P exactly 0
        // even where the mask is not applied.
        const float l = t < q_len ? lse[t * f.lse_row_stride] : INFINITY;
        s_lse2[tid] = l == -INFINITY ? INFINITY : l * log2e;
        s_delta[tid] = t < q_len ? p.delta[(q_row0 + t) * f.h_q + h] : 0.0f;
      }
      cp_async_wait<0>();
      __syncthreads();

      float s[1][kQT][4], dp[1][kQT][4];
      gemm_qk<D, 1, kQT, false>(s, sk + warp * 16 * D, sq, lane, cols.steps);
      gemm_qk<D, 1, kQT, false>(dp, sv + warp * 16 * D, sdo, lane, cols.steps);
#pragma unroll
      for (int nt = 0; nt < kQT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + (e >= 2 ? 8 : 0);
          const int qi = nt * 8 + 2 * (lane & 3) + (e & 1), t = m0 + qi;
          bool seen = key < kv_len && t < q_len;
          if constexpr (kHasMask) {
            if (right >= 0) seen = seen && key <= t + offset + right;
            if (left >= 0) seen = seen && key >= t + offset - left;
          }
          const float pr = seen ? fast_exp2(s[0][nt][e] * f.scale_log2 - s_lse2[qi]) : 0.0f;
          s[0][nt][e] = pr;
          dp[0][nt][e] = pr * (dp[0][nt][e] - s_delta[qi]);
        }
      // dV += P^T dO and dK += dS^T Q (the step's queries are the k dimension).
      gemm_pv<D, 1, kBM / 16, kDT, false>(
          dv, [&](int ks, uint32_t(&a)[1][4]) { pack_p<Elem, kQT>(s[0], ks, a[0]); },
          sdo + cols.col0, lane, cols.pairs);
      gemm_pv<D, 1, kBM / 16, kDT, false>(
          dk, [&](int ks, uint32_t(&a)[1][4]) { pack_p<Elem, kQT>(dp[0], ks, a[0]); },
          sq + cols.col0, lane, cols.pairs);
      if constexpr (kDq) {
        // dQ += dS K across the block's warps: dS through shared memory as [query][key].
        store_ds<Cfg, Elem>(dp[0], sds, warp, lane);
        __syncthreads();
        atomic_add_dq<Cfg, Elem>(p, cols, sds, sk, m0, q_len, q_row0, h, warp, lane);
      }
    }
  }

  cp_async_wait<0>();  // K and V, where no query block saw the keys

  // dK (times the softmax scale: S = scale Q K^T) and dV of the block's keys.
  Elem* dkg = static_cast<Elem*>(p.dk) +
              (f.cu_seqlens_k ? seq.k_start * p.dk_row_stride : seq.b * p.dk_batch_stride) +
              hk * p.dk_head_stride + cols.col0;
  Elem* dvg = static_cast<Elem*>(p.dv) +
              (f.cu_seqlens_k ? seq.k_start * p.dv_row_stride : seq.b * p.dv_batch_stride) +
              hk * p.dv_head_stride + cols.col0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + 8 * r;
    if (key >= kv_len) continue;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = dt * 8 + 2 * (lane & 3) + e;
        if (!cols.has(col)) continue;
        dkg[key * p.dk_row_stride + col] = from_f<Elem>(f.scale * dk[0][dt][2 * r + e]);
        dvg[key * p.dv_row_stride + col] = from_f<Elem>(dv[0][dt][2 * r + e]);
      }
  }
}

// Deterministic mode's dQ: one thread block per (block of kBlockM queries, query head,
// sequence), walking the key blocks its queries see in order and recomputing S, P, dP and dS
// there, as the forward's tiles do (each warp owns 16 query rows: no atomics, no cross-warp
// sum), so each dq element is summed in one fixed order. Costs the S and dP products a second
// time; bwd_kernel<..., kDq = false> then computes only dK and dV.
template <class Cfg, class Elem, bool kHasMask>
__global__ void __launch_bounds__(Cfg::kThreads) bwd_dq_kernel(const BwdParams p) {
  constexpr int D = Cfg::kHeadDim, kBN = Cfg::kBlockN, kBM = Cfg::kBlockM;
  constexpr int kThreads = Cfg::kThreads, kDT = Cfg::kOutDim / 8, kKT = kBN / 8;
  static_assert(kBM == 16 * Cfg::kWarps, "one m16 slice of queries per warp");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Elem* sk = reinterpret_cast<Elem*>(smem_raw);
  Elem* sv = sk + Cfg::kTileElems;
  Elem* sq = sv + Cfg::kTileElems;
  Elem* sdo = sq + Cfg::kTileElems;

  const FwdParams& f = p.fwd;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m0 = blockIdx.x * kBM, h = blockIdx.y, hk = h / f.h_ratio;
  const SeqInfo seq(f, blockIdx.z);
  if (m0 >= seq.q_len) return;
  const int q_len = seq.q_len, kv_len = seq.kv_len, offset = kv_len - q_len;
  const int left = kHasMask ? f.window_left : -1, right = kHasMask ? f.window_right : -1;
  const BwdColumns<Cfg> cols(p);

  const Elem* qg = static_cast<const Elem*>(f.q) + seq.q_off(f) + h * f.q_head_stride;
  const Elem* dog = static_cast<const Elem*>(p.dout) +
                    (f.cu_seqlens_q ? seq.q_start * p.do_row_stride : seq.b * p.do_batch_stride) +
                    h * p.do_head_stride;
  const int valid_q = min(kBM, q_len - m0);
  load_tile_async<kBM, D, kThreads>(sq, qg + m0 * f.q_row_stride, f.q_row_stride, valid_q, tid,
                                    cols.chunks);
  load_tile_async<kBM, D, kThreads>(sdo, dog + m0 * p.do_row_stride, p.do_row_stride, valid_q, tid,
                                    cols.chunks);
  cp_async_commit();

  // This thread's two query rows (fragment rows g and g + 8 of the warp's slice).
  const float log2e = 1.4426950408889634f;
  const float* lse = f.lse + seq.lse_off(f) + h * f.lse_head_stride;
  const int64_t q_row0 = seq.q_row0(f);
  int rows[2];
  float lse2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rows[r] = m0 + warp * 16 + (lane >> 2) + 8 * r;
    const bool ok = rows[r] < q_len;
    const float l = ok ? lse[rows[r] * f.lse_row_stride] : INFINITY;
    lse2[r] = l == -INFINITY ? INFINITY : l * log2e;
    delta[r] = ok ? p.delta[(q_row0 + rows[r]) * f.h_q + h] : 0.0f;
  }

  // Keys that some query of the block sees.
  int k_lo = 0, k_hi = kv_len;  // [k_lo, k_hi)
  if (left >= 0) k_lo = max(0, m0 + offset - left);
  if (right >= 0) k_hi = min(kv_len, m0 + kBM - 1 + offset + right + 1);
  const Elem* kg = static_cast<const Elem*>(f.k) + seq.k_off(f) + hk * f.k_head_stride;
  const Elem* vg = static_cast<const Elem*>(f.v) + seq.v_off(f) + hk * f.v_head_stride;

  float dq[1][kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[0][dt][e] = 0.0f;
  for (int n0 = k_lo / kBN * kBN; n0 < k_hi; n0 += kBN) {
    __syncthreads();  // the previous block is done with K and V
    const int valid_k = min(kBN, kv_len - n0);
    load_tile_async<kBN, D, kThreads>(sk, kg + n0 * f.k_row_stride, f.k_row_stride, valid_k, tid,
                                      cols.chunks);
    load_tile_async<kBN, D, kThreads>(sv, vg + n0 * f.v_row_stride, f.v_row_stride, valid_k, tid,
                                      cols.chunks);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float s[1][kKT][4], dp[1][kKT][4];
    gemm_qk<D, 1, kKT, false>(s, sq + warp * 16 * D, sk, lane, cols.steps);
    gemm_qk<D, 1, kKT, false>(dp, sdo + warp * 16 * D, sv, lane, cols.steps);
#pragma unroll
    for (int nt = 0; nt < kKT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, t = rows[r];
        const int key = n0 + nt * 8 + 2 * (lane & 3) + (e & 1);
        bool seen = key < kv_len && t < q_len;
        if constexpr (kHasMask) {
          if (right >= 0) seen = seen && key <= t + offset + right;
          if (left >= 0) seen = seen && key >= t + offset - left;
        }
        const float pr = seen ? fast_exp2(s[0][nt][e] * f.scale_log2 - lse2[r]) : 0.0f;
        dp[0][nt][e] = pr * (dp[0][nt][e] - delta[r]);
      }
    gemm_pv<D, 1, kBN / 16, kDT, false>(
        dq, [&](int ks, uint32_t(&a)[1][4]) { pack_p<Elem, kKT>(dp[0], ks, a[0]); }, sk + cols.col0,
        lane, cols.pairs);
  }
  cp_async_wait<0>();  // Q and dO, where no key block was visited

  Elem* dqg = static_cast<Elem*>(p.dq) +
              (f.cu_seqlens_q ? seq.q_start * p.dq_row_stride : seq.b * p.dq_batch_stride) +
              h * p.dq_head_stride + cols.col0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (rows[r] >= q_len) continue;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = dt * 8 + 2 * (lane & 3) + e;
        if (cols.has(col))
          dqg[rows[r] * p.dq_row_stride + col] = from_f<Elem>(f.scale * dq[0][dt][2 * r + e]);
      }
  }
}

}  // namespace flashserve::attention::sm80
