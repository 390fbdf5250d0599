// The online softmax of the sm90 forward's consumers (fwd_mainloop.h runs it per key block,
// fwd_epilogue.h normalises O and writes the LSE from its state): RowState, the running max and
// sum of a thread's two rows, with lazy rescaling, fp8's offset of P and part of the
// exponentials on the FMA pipe; O's rescale; the fp8 tiles' descale factors of the scores.
#pragma once

#include <cmath>
#include <cstdint>

#include "device_util.h"
#include "exp2_poly.h"
#include "fwd_params.h"

namespace flashserve::attention::sm90 {

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

}  // namespace flashserve::attention::sm90
