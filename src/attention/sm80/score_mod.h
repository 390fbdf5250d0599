// The score modifiers of the contract (attention/score_mod.h: tanh soft-capping, the ALiBi bias)
// in the sm80 forward kernel. They are a compile-time choice: the kernels without them are
// instantiated with NoScoreMod and compile to the code they had before modifiers existed (the
// no-modifier prefill is the hot path; a run-time test in the key loop cost it 2.5-5% on an H200,
// docs/kernel-notes.md). The modifier kernels take FwdModParams and run ScoreModRows on each block
// of scores, before the mask.
//
// Units: the key loop keeps raw scores q.k and folds the softmax scale into the exponent
// (softmax.h: exp2(s * scale_log2 - max * scale_log2), LSE = max * scale + log l). The modifier
// kernels keep the modified score divided by a unit u instead, and the host passes u as the scale
// (fwd_params_of.h score_mod_params): u = softcap when capped, so a block holds
//   tanh(scale * q.k / softcap) - slope / softcap * |p - j|,
// and u = scale otherwise, so it holds q.k - slope / scale * |p - j|. Either way u > 0 (the row max
// needs a positive scale) and the running max, the probabilities and the LSE need no change; the
// split-KV combine merges LSEs, which are in natural units, unchanged.
#pragma once

#include <cstdint>

#include "fwd_params.h"
#include "ptx.h"

namespace flashserve::attention::sm80 {

// What the modifier kernels add to FwdParams. Filled on the host from the validated call.
struct ScoreModParams {
  int32_t capped;   // softcap > 0
  float cap_scale;  // capped: scale / softcap, the tanh argument per unit of q.k
  float unit_inv;   // 1 / u: ALiBi slopes are applied in the block's units
  // ALiBi slopes, float32 [h_q] (batch stride 0) or [batch, h_q]; null: no bias.
  const float* alibi;
  int64_t alibi_batch_stride, alibi_head_stride;
};

struct FwdModParams : FwdParams {
  ScoreModParams mod;
};

// The kernels without modifiers: every use is under `if constexpr (Mod::kActive)`.
struct NoScoreMod {
  static constexpr bool kActive = false;
};

// tanh(x) in float, to about 1e-6 relative, which keeps the capped score softcap * tanh(x) within
// 1e-6 of itself relative: far below the bf16/fp16 rounding of q and k (2^-9, 2^-12), so the
// test bounds of the unmodified kernels hold. Below |x| = 0.3 the odd Taylor polynomial to x^11
// (truncation < 1e-8 relative); above, 1 - 2 / (exp(2x) + 1), whose ex2.approx (~2^-22 relative),
// rcp.approx (1 ulp) and argument rounding add up to < 3e-7 absolute where tanh >= 0.29. A large
// softcap makes x small, so the polynomial is what keeps it relative there (1 - 2 / (e + 1)
// alone cancels to 0 for tiny x). tanh.approx.f32 (FlashAttention's) is 2^-11 relative: a score
// capped at 50 would move by 0.02. Branch-free (both sides computed, one selected); +-inf give
// +-1 and NaN stays NaN (the comparison fails and the exponential side propagates it).
__device__ __forceinline__ float tanh_device(float x) {
  const float x2 = x * x;
  float poly = -1382.0f / 155925;
  poly = fmaf(poly, x2, 62.0f / 2835);
  poly = fmaf(poly, x2, -17.0f / 315);
  poly = fmaf(poly, x2, 2.0f / 15);
  poly = fmaf(poly, x2, -1.0f / 3);
  poly = fmaf(poly * x2, x, x);
  const float e = fast_exp2(x * 2.88539008177792681472f);  // exp(2x): 2 log2(e) x
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(e + 1.0f));
  const float far = fmaf(-2.0f, r, 1.0f);
  return fabsf(x) < 0.3f ? poly : far;
}

// The modifiers for one thread's rows of a tile: the slopes of its rows, already in the block's
// units: one per fragment row where rows are heads (kPerRowHead: packed GQA tiles), else the one
// of the tile's head (a register, not four: the masked tiles run at the register limit).
template <int kMTiles, bool kPerRowHead>
struct ScoreModRows {
  static constexpr bool kActive = true;
  bool capped;
  float cap_scale;
  bool alibi;
  float slope[kPerRowHead ? kMTiles : 1][kPerRowHead ? 2 : 1];

  // `head_of_row(mi, r)`: the query head of fragment row (mi, r), or -1 for a row past the tile's
  // last (packed GQA tiles: rows are heads, and those past the group read no slope).
  template <class HeadOf>
  __device__ __forceinline__ ScoreModRows(const ScoreModParams& m, int b, HeadOf head_of_row)
      : capped(m.capped != 0), cap_scale(m.cap_scale), alibi(m.alibi != nullptr) {
#pragma unroll
    for (int mi = 0; mi < (kPerRowHead ? kMTiles : 1); ++mi)
#pragma unroll
      for (int r = 0; r < (kPerRowHead ? 2 : 1); ++r) {
        const int h = head_of_row(mi, r);
        slope[mi][r] =
            alibi && h >= 0
                ? m.alibi[b * m.alibi_batch_stride + h * m.alibi_head_stride] * m.unit_inv
                : 0.0f;
      }
  }

  // Modifies one warp's raw scores s (the mask's layout: block_mask.h). `pos0`: the query
  // position of the thread's first row (slice 0, fragment row g); kPerRowHead: every row is at pos0
  // (packed GQA tiles). `col0`: the key index of the thread's first column.
  template <int kNTiles>
  __device__ __forceinline__ void apply(float (&s)[kMTiles][kNTiles][4], int pos0, int col0) const {
    // One pass per modifier, each under its own (CTA-uniform) branch: fewer values live at once
    // than one pass that does both.
    if (capped) {
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mi][nt][e] = tanh_device(s[mi][nt][e] * cap_scale);
    }
    if (alibi) {
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int pos = kPerRowHead ? pos0 : pos0 + mi * 16 + r * 8;
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int d = pos - (col0 + nt * 8 + e);
              float& x = s[mi][nt][2 * r + e];
              const float m = slope[kPerRowHead ? mi : 0][kPerRowHead ? r : 0];
              x = fmaf(-m, static_cast<float>(d < 0 ? -d : d), x);
            }
        }
    }
  }
};

}  // namespace flashserve::attention::sm80
