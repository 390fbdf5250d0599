// kernel/block_mask.h against a brute force over every (query, key) pair: the key blocks a query
// tile visits (KeyBlocks, the forward's walk) and the query blocks a key block is seen by
// (QueryBlocks, the sm90 backward's walk) are exactly the blocks that hold a pair the mask lets
// through, for bottom-right causal, sliding windows, q_len above and below kv_len, and no keys;
// and QueryBlocks::needs_mask holds exactly where some query misses some key of the pair.
#include "attention/kernel/block_mask.h"

#include <gtest/gtest.h>

#include <vector>

namespace flashserve::testing {
namespace {

using attention::kernel::KeyBlocks;
using attention::kernel::QueryBlocks;

// Whether query t sees key j (mask.h's bottom-right window; -1 unbounded).
bool sees(int t, int j, int q_len, int kv_len, int left, int right) {
  const int pos = kv_len - q_len + t;
  return j < kv_len && (right < 0 || j <= pos + right) && (left < 0 || j >= pos - left);
}

// Whether some query of block m sees some key of block n.
template <int kM, int kN>
bool block_pair_seen(int m, int n, int q_len, int kv_len, int left, int right) {
  for (int t = m * kM; t < (m + 1) * kM && t < q_len; ++t)
    for (int j = n * kN; j < (n + 1) * kN && j < kv_len; ++j)
      if (sees(t, j, q_len, kv_len, left, right)) return true;
  return false;
}

// Whether the pair (query block m, key block n) needs per-element masking: some query of block m
// before q_len misses some key of block n, or block n has positions past kv_len.
template <int kM, int kN>
bool block_pair_partial(int m, int n, int q_len, int kv_len, int left, int right) {
  for (int t = m * kM; t < (m + 1) * kM && t < q_len; ++t)
    for (int j = n * kN; j < (n + 1) * kN; ++j)
      if (!sees(t, j, q_len, kv_len, left, right)) return true;
  return false;
}

template <int kM, int kN>
void check_shape(int q_len, int kv_len, int left, int right) {
  const int m_blocks = (q_len + kM - 1) / kM, n_blocks = (kv_len + kN - 1) / kN;
  for (int n = 0; n < n_blocks; ++n) {
    const QueryBlocks<kM, kN, true> qb(n, q_len, kv_len, left, right);
    for (int m = 0; m < m_blocks; ++m) {
      const bool seen = block_pair_seen<kM, kN>(m, n, q_len, kv_len, left, right);
      EXPECT_EQ(m >= qb.m_min && m < qb.m_max, seen)
          << "QueryBlocks n " << n << " m " << m << " q " << q_len << " kv " << kv_len << " left "
          << left << " right " << right;
      if (seen)  // the sm90 backward's mask-free steps are exactly the fully seen pairs
        EXPECT_EQ(qb.needs_mask(m), (block_pair_partial<kM, kN>(m, n, q_len, kv_len, left, right)))
            << "QueryBlocks::needs_mask n " << n << " m " << m << " q " << q_len << " kv " << kv_len
            << " left " << left << " right " << right;
      const KeyBlocks<kM, kN, true> kb(m * kM, q_len, kv_len, left, right);
      EXPECT_EQ(n >= kb.n_min && n < kb.n_max, seen)
          << "KeyBlocks m " << m << " n " << n << " q " << q_len << " kv " << kv_len << " left "
          << left << " right " << right;
    }
  }
  // Unmasked: every query block sees every key block with keys.
  for (int n = 0; n < n_blocks; ++n) {
    const QueryBlocks<kM, kN, false> qb(n, q_len, kv_len, left, right);
    EXPECT_EQ(qb.m_min, 0);
    EXPECT_EQ(qb.m_max, m_blocks);
    for (int m = 0; m < m_blocks; ++m)  // masked exactly where the block ends past kv_len
      EXPECT_EQ(qb.needs_mask(m), (n + 1) * kN > kv_len) << "unmasked n " << n << " m " << m;
  }
}

TEST(BlockMask, QueryAndKeyBlocksMatchTheBruteForce) {
  const std::vector<std::pair<int, int>> windows = {{-1, 0}, {-1, -1}, {37, 0},  {37, 11},
                                                    {0, 0},  {5, -1},  {200, 3}, {-1, 40}};
  for (int q_len : {1, 17, 64, 127, 200, 300, 384})
    for (int kv_len : {1, 9, 77, 128, 257, 300, 384})
      for (const auto& [left, right] : windows) {
        check_shape<64, 128>(q_len, kv_len, left, right);
        check_shape<128, 128>(q_len, kv_len, left, right);
      }
}

TEST(BlockMask, AKeyBlockNoQuerySeesHasNoQueryBlocks) {
  // Causal, 10 queries over 300 keys: the first keys are seen by every query (bottom-right:
  // query 0 sits at key 290); a window of 5 on the left leaves keys 0 .. 284 unseen.
  const QueryBlocks<64, 128, true> first(0, 10, 300, 5, 0);
  EXPECT_EQ(first.count(), 0);
  const QueryBlocks<64, 128, true> last(2, 10, 300, 5, 0);
  EXPECT_EQ(last.m_min, 0);
  EXPECT_EQ(last.m_max, 1);
  // No queries at all.
  EXPECT_EQ((QueryBlocks<64, 128, false>(0, 0, 300, -1, -1).count()), 0);
}

}  // namespace
}  // namespace flashserve::testing
