// The mask of mask.h at the two granularities the kernel needs: which key blocks a query tile
// visits at all (and which of those need no per-element masking: the fast path;
// kernel/block_mask.h), and the per-element mask of the boundary blocks.
#pragma once

#include <cmath>

#include "attention/kernel/block_mask.h"

namespace flashserve::attention::sm80 {

// The key blocks a tile visits: kernel/block_mask.h, shared with the sm90 kernel.
using kernel::KeyBlocks;

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
