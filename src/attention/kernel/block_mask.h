// Which key blocks a query tile visits under the mask of mask.h (bottom-right causal or a
// sliding window), and which of those need no per-element masking: shared by the sm80 and sm90
// kernels, so that both walk the same blocks for the same tile.
#pragma once

#include "attention/mask.h"  // FS_HOST_DEVICE

namespace flashserve::attention::kernel {

// Key blocks of kBlockN keys met by query rows [m0, m0 + kBlockM) of a sequence. Visited blocks
// are [n_min, n_max); blocks in [full_lo, full_hi) are seen in full by every valid row of the
// tile (inside the window on both sides and before kv_len), so they skip element masking.
// left/right are mask.h's sides, -1 unbounded (the host clamps a side wider than any sequence to
// -1, so row + offset + side stays far inside int32).
template <int kBlockM, int kBlockN, bool kHasMask>
struct KeyBlocks {
  int n_min, n_max, full_lo, full_hi;

  FS_HOST_DEVICE KeyBlocks(int m0, int q_len, int kv_len, int left, int right) {
    const int r_lo = m0, r_hi = (m0 + kBlockM < q_len ? m0 + kBlockM : q_len) - 1;
    const int offset = kv_len - q_len;      // query t sits at key position t + offset
    int some_begin = 0, some_end = kv_len;  // keys that some row sees
    int all_begin = 0, all_end = kv_len;    // keys that every row sees
    if constexpr (kHasMask) {
      if (right >= 0) {
        some_end = min_(some_end, r_hi + offset + right + 1);
        all_end = min_(all_end, r_lo + offset + right + 1);
      }
      if (left >= 0) {
        some_begin = max_(0, r_lo + offset - left);
        all_begin = max_(0, r_hi + offset - left);
      }
    }
    n_min = some_begin / kBlockN;
    n_max = some_end <= some_begin ? n_min : (some_end + kBlockN - 1) / kBlockN;
    full_lo = (all_begin + kBlockN - 1) / kBlockN;
    full_hi = all_end > 0 ? all_end / kBlockN : 0;
  }

  FS_HOST_DEVICE int count() const { return n_max - n_min; }
  FS_HOST_DEVICE bool needs_mask(int n) const { return n >= full_hi || n < full_lo; }

  // Split-KV: keep split `split` of `splits` near-equal shares of [n_min, n_max) (may be empty).
  FS_HOST_DEVICE void keep_split(int split, int splits) {
    const int per = (n_max - n_min + splits - 1) / splits;
    const int lo = min_(n_max, n_min + split * per);
    n_max = min_(n_max, lo + per);
    n_min = lo;
  }

 private:
  static FS_HOST_DEVICE int min_(int a, int b) { return a < b ? a : b; }
  static FS_HOST_DEVICE int max_(int a, int b) { return a > b ? a : b; }
};

}  // namespace flashserve::attention::kernel
