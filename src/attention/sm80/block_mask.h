// The mask of mask.h at the two granularities the kernel needs: which key blocks a query tile
// visits at all (and which of those need no per-element masking: the fast path), and the
// per-element mask of the boundary blocks.
#pragma once

#include <cmath>

namespace flashserve::attention::sm80 {

// Key blocks of kBlockN keys met by query rows [m0, m0 + kBlockM) of a sequence. Visited blocks
// are [n_min, n_max); blocks in [full_lo, full_hi) are seen in full by every valid row of the
// tile (inside the window on both sides and before kv_len), so they skip element masking.
template <int kBlockM, int kBlockN, bool kHasMask>
struct KeyBlocks {
  int n_min, n_max, full_lo, full_hi;

  __device__ __forceinline__ KeyBlocks(int m0, int q_len, int kv_len, int left, int right) {
    const int r_lo = m0, r_hi = min(m0 + kBlockM, q_len) - 1;
    const int offset = kv_len - q_len;      // query t sits at key position t + offset
    int some_begin = 0, some_end = kv_len;  // keys that some row sees
    int all_begin = 0, all_end = kv_len;    // keys that every row sees
    if constexpr (kHasMask) {
      if (right >= 0) {
        some_end = min(some_end, r_hi + offset + right + 1);
        all_end = min(all_end, r_lo + offset + right + 1);
      }
      if (left >= 0) {
        some_begin = max(0, r_lo + offset - left);
        all_begin = max(0, r_hi + offset - left);
      }
    }
    n_min = some_begin / kBlockN;
    n_max = some_end <= some_begin ? n_min : (some_end + kBlockN - 1) / kBlockN;
    full_lo = (all_begin + kBlockN - 1) / kBlockN;
    full_hi = all_end > 0 ? all_end / kBlockN : 0;
  }

  __device__ __forceinline__ bool needs_mask(int n) const { return n >= full_hi || n < full_lo; }

  // Split-KV: keep split `split` of `splits` near-equal shares of [n_min, n_max) (may be empty).
  __device__ __forceinline__ void keep_split(int split, int splits) {
    const int per = (n_max - n_min + splits - 1) / splits;
    const int lo = min(n_max, n_min + split * per);
    n_max = min(n_max, lo + per);
    n_min = lo;
  }
};

// Sets to -inf the scores of one warp's S accumulators that the row may not see. `row0` is the
// query index of the thread's first row (slice 0, fragment row g), `col0` the key index of its
// first column (block start + 2 * (lane % 4)). kSharedRow: every tile row is query row0 (GQA-packed
// decode tiles, whose rows are the heads of one query).
template <int kMTiles, int kNTiles, bool kHasMask, bool kSharedRow = false>
__device__ __forceinline__ void mask_scores(float (&s)[kMTiles][kNTiles][4], int row0, int col0,
                                            int kv_len, int offset, int left, int right) {
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = kSharedRow ? row0 : row0 + mi * 16 + r * 8;
      int lo = 0, hi = kv_len - 1;  // visible keys [lo, hi]
      if constexpr (kHasMask) {
        if (right >= 0) hi = min(hi, row + offset + right);
        if (left >= 0) lo = row + offset - left;
      }
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = col0 + nt * 8 + e;
          if (col < lo || col > hi) s[mi][nt][2 * r + e] = -INFINITY;
        }
      }
    }
  }
}

}  // namespace flashserve::attention::sm80
