// Online softmax over the key blocks, in registers. Each thread holds two rows per m16 slice
// (fragment rows g and g + 8); the four threads of a quad share a row, so the row max needs two
// shuffles per block, while the row sum stays per thread until the end (no reduction in the loop).
#pragma once

#include <cmath>

#include "ptx.h"

namespace flashserve::attention::sm80 {

// Multiplies the two rows a thread holds of one m16 slice of accumulators (fragment rows g and
// g + 8) by f0 and f1.
template <int kDTiles>
__device__ __forceinline__ void scale_rows(float (&o)[kDTiles][4], float f0, float f1) {
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) {
    o[dt][0] *= f0;
    o[dt][1] *= f0;
    o[dt][2] *= f1;
    o[dt][3] *= f1;
  }
}

template <int kMTiles, bool kSkipUnchangedRescale>
struct OnlineSoftmax {
  float row_max[kMTiles][2];  // raw (unscaled) running max of the scores; -inf: nothing seen yet
  float row_sum[kMTiles][2];  // this thread's part of sum exp(scale * (s - row_max))

  __device__ __forceinline__ OnlineSoftmax() {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        row_max[mi][r] = -INFINITY;
        row_sum[mi][r] = 0.0f;
      }
    }
  }

  // Turns the block's scores s into unnormalised probabilities exp2(s * scale_log2 - max * ...)
  // in place and sets correction[mi][r], the factor that brings O rows accumulated under the old
  // running max to the new one. Returns whether any of this thread's row maxima moved. A row whose
  // max is still -inf (everything masked so far) uses 0 as its base, so -inf - -inf never makes a
  // NaN.
  template <int kNTiles>
  __device__ __forceinline__ bool probabilities(float (&s)[kMTiles][kNTiles][4], float scale_log2,
                                                float (&correction)[kMTiles][2]) {
    bool changed = false;
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float m = row_max[mi][r];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
          m = fmaxf(m, fmaxf(s[mi][nt][2 * r], s[mi][nt][2 * r + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        const float base = m == -INFINITY ? 0.0f : m * scale_log2;
        correction[mi][r] = fast_exp2(row_max[mi][r] * scale_log2 - base);
        changed |= m != row_max[mi][r];
        row_max[mi][r] = m;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = fast_exp2(fmaf(s[mi][nt][2 * r + e], scale_log2, -base));
            s[mi][nt][2 * r + e] = p;
            sum += p;
          }
        }
        row_sum[mi][r] = row_sum[mi][r] * correction[mi][r] + sum;
      }
    }
    return changed;
  }

  // Once the running max settles (after the first few blocks, on most rows) the correction is
  // exactly 1, and the O rescale (kMTiles x kDTiles x 4 FMULs) can be skipped unless some row
  // of the warp moved; the vote keeps the branch uniform. Per configuration (tile_config.h).
  __device__ __forceinline__ static bool must_rescale(bool changed) {
    return !kSkipUnchangedRescale || __any_sync(0xffffffffu, changed);
  }

  // probabilities(), then the rescale of the warp's own O rows.
  template <int kNTiles, int kDTiles>
  __device__ __forceinline__ void update(float (&s)[kMTiles][kNTiles][4],
                                         float (&o)[kMTiles][kDTiles][4], float scale_log2) {
    float correction[kMTiles][2];
    if (must_rescale(probabilities(s, scale_log2, correction))) {
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi) scale_rows(o[mi], correction[mi][0], correction[mi][1]);
    }
  }

  // The factor that normalises each row (1 / row sum; 0 for a row that saw no key, whose output is
  // 0) and the natural-log LSE of each row (-inf for such a row; NaN for a NaN row).
  __device__ __forceinline__ void finish_rows(float scale, float (&inv)[kMTiles][2],
                                              float (&lse)[kMTiles][2]) const {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float l = row_sum[mi][r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        // NaN, as in PyTorch, for a row with a NaN score (fmaxf skips it in the max, but its
        // exp2 is NaN and so is l) or a +inf one (inf - inf): l != 0, so inv and lse are NaN.
        const bool seen = l != 0.0f;
        inv[mi][r] = seen ? 1.0f / l : 0.0f;
        lse[mi][r] = seen ? row_max[mi][r] * scale + logf(l) : -INFINITY;
      }
    }
  }

  // finish_rows(), applied to the warp's own O rows.
  template <int kDTiles>
  __device__ __forceinline__ void finish(float (&o)[kMTiles][kDTiles][4], float scale,
                                         float (&lse)[kMTiles][2]) const {
    float inv[kMTiles][2];
    finish_rows(scale, inv, lse);
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi) scale_rows(o[mi], inv[mi][0], inv[mi][1]);
  }
};

}  // namespace flashserve::attention::sm80
