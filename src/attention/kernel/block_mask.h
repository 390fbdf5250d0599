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
  // Length-aware split (split_items.h): keep share `share` of `chunk` blocks of [n_min, n_max).
  FS_HOST_DEVICE void keep_share(int share, int chunk) {
    const int lo = min_(n_max, n_min + share * chunk);
    n_max = min_(n_max, lo + chunk);
    n_min = lo;
  }

 private:
  static FS_HOST_DEVICE int min_(int a, int b) { return a < b ? a : b; }
  static FS_HOST_DEVICE int max_(int a, int b) { return a > b ? a : b; }
};

// The backward's walk, the other way round: the query blocks of kBlockM rows whose rows see some
// key of key block n_block (its keys before kv_len), [m_min, m_max) (empty: m_min == m_max).
// Key j is seen by the queries t with j - offset - right <= t <= j - offset + left (mask.h), so
// block n is seen by query blocks [m_min, m_max) exactly when KeyBlocks of each of those blocks
// visits n (tests/attention/block_mask_test.cc checks the two against each other). Query blocks
// in [full_lo, full_hi) need no per-element masking: each of their queries before q_len sees
// every key of the block, and the block's keys all lie before kv_len (a block that ends past
// kv_len has the range empty: its last keys are masked in every query block).
template <int kBlockM, int kBlockN, bool kHasMask>
struct QueryBlocks {
  int m_min, m_max, full_lo, full_hi;

  FS_HOST_DEVICE QueryBlocks(int n_block, int q_len, int kv_len, int left, int right) {
    const int k_lo = n_block * kBlockN;
    const int k_hi = (k_lo + kBlockN < kv_len ? k_lo + kBlockN : kv_len) - 1;  // last key
    const int offset = kv_len - q_len;
    int t_lo = 0, t_hi = q_len - 1;      // queries that see some key of the block
    int all_lo = 0, all_hi = q_len - 1;  // queries that see every key of the block
    if constexpr (kHasMask) {
      if (right >= 0) {
        t_lo = k_lo - offset - right > 0 ? k_lo - offset - right : 0;
        all_lo = k_hi - offset - right > 0 ? k_hi - offset - right : 0;
      }
      if (left >= 0) {
        if (k_hi - offset + left < t_hi) t_hi = k_hi - offset + left;
        if (k_lo - offset + left < all_hi) all_hi = k_lo - offset + left;
      }
    }
    if (k_hi < k_lo || t_hi < t_lo) {
      m_min = m_max = 0;
    } else {
      m_min = t_lo / kBlockM;
      m_max = t_hi / kBlockM + 1;
    }
    if (k_lo + kBlockN > kv_len || all_hi < all_lo) {
      full_lo = full_hi = 0;
    } else {
      full_lo = (all_lo + kBlockM - 1) / kBlockM;
      // Block m's queries before q_len end at min((m + 1) kBlockM, q_len) - 1: every block passes
      // when all_hi is the last query, else those with (m + 1) kBlockM - 1 <= all_hi.
      full_hi = all_hi == q_len - 1 ? (q_len + kBlockM - 1) / kBlockM : (all_hi + 1) / kBlockM;
    }
  }

  FS_HOST_DEVICE int count() const { return m_max - m_min; }
  FS_HOST_DEVICE bool needs_mask(int m) const { return m < full_lo || m >= full_hi; }
};

}  // namespace flashserve::attention::kernel
