// Length-aware decode splits (src/attention/kernel/split_items.h, split_policy.h balanced_split):
// the arithmetic the split kernel and the combine share, on the host. The block count agrees with
// the decode tile's KeyBlocks; over random launches the items fit the grid and a sequence's shares
// tile its key blocks exactly; equal lengths give the even split's shares; and the policy's
// choices on the H200's figures. The device side (sm80/split_map.cu, the kernels reading its map)
// runs in the GPU tests (tests/gpu/attention_gpu_test.cc, BalancedDecode).
#include "attention/kernel/split_items.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "attention/kernel/block_mask.h"
#include "attention/sm80/tile_config.h"
#include "attention/split_policy.h"

namespace flashserve::testing {
namespace {

using attention::kernel::chunk_for;
using attention::kernel::decode_key_blocks;
using attention::kernel::items_for;
using attention::kernel::KeyBlocks;

template <int kBlockN>
int tile_blocks(int kv_len, int left) {
  return KeyBlocks<16, kBlockN, true>(0, 1, kv_len, left, -1).count();
}

TEST(SplitItems, DecodeKeyBlocksAreTheDecodeTilesBlocks) {
  for (int kv = 0; kv <= 700; ++kv)
    for (int left : {-1, 0, 1, 31, 32, 63, 64, 129, 1000}) {
      EXPECT_EQ(decode_key_blocks(kv, left, 32), tile_blocks<32>(kv, left)) << kv << " " << left;
      EXPECT_EQ(decode_key_blocks(kv, left, 64), tile_blocks<64>(kv, left)) << kv << " " << left;
      EXPECT_EQ(decode_key_blocks(kv, left, 128), tile_blocks<128>(kv, left)) << kv << " " << left;
    }
}

TEST(SplitItems, ChunkIsTheBusyShareWithItsFloor) {
  EXPECT_EQ(chunk_for(3200, 200, 16), 16);  // 16 exactly
  EXPECT_EQ(chunk_for(3201, 200, 16), 17);  // rounded up
  EXPECT_EQ(chunk_for(100, 200, 16), 16);   // the floor
  EXPECT_EQ(chunk_for(0, 200, 0), 1);       // never 0
  EXPECT_EQ(items_for(0, 16), 0);           // no keys: no item
  EXPECT_EQ(items_for(1, 16), 1);
  EXPECT_EQ(items_for(33, 16), 3);
}

// Random launches (exponential lengths with empty sequences among them): the items fit the grid's
// sequences x items slots, each share keeps 1..chunk blocks, and the shares of a sequence are its
// blocks, in order, without overlap.
TEST(SplitItems, ItemsFitTheGridAndTileEachSequence) {
  std::mt19937_64 rng(33);
  for (int trial = 0; trial < 3000; ++trial) {
    const int seqs = std::uniform_int_distribution<int>(1, 300)(rng);
    const int items = std::uniform_int_distribution<int>(2, 129)(rng);
    const int floor = std::uniform_int_distribution<int>(1, 16)(rng);
    const double mean = std::uniform_real_distribution<double>(1, 400)(rng);
    std::exponential_distribution<double> len(1.0 / mean);
    std::vector<int> blocks(seqs);
    for (int& b : blocks) b = rng() % 7 == 0 ? 0 : static_cast<int>(len(rng));
    const int64_t total = std::accumulate(blocks.begin(), blocks.end(), int64_t{0});
    const int chunk = chunk_for(total, int64_t{seqs} * (items - 1), floor);
    ASSERT_GE(chunk, floor);
    int64_t used = 0;
    for (int n : blocks) {
      const int count = items_for(n, chunk);
      used += count;
      int next = 0;
      for (int share = 0; share < count; ++share) {
        KeyBlocks<16, 64, true> kb(0, 1, n * 64, -1, -1);
        ASSERT_EQ(kb.count(), n);
        kb.keep_share(share, chunk);
        ASSERT_EQ(kb.n_min, next);
        ASSERT_GE(kb.count(), 1);
        ASSERT_LE(kb.count(), chunk);
        next = kb.n_max;
      }
      ASSERT_EQ(next, n);
    }
    ASSERT_LE(used, int64_t{seqs} * items) << "seqs " << seqs << " items " << items;
  }
}

// Equal lengths at the launch's longest give the even split's shares exactly: the chunk is the
// even share ceil(blocks / splits), so a balanced launch of equal sequences computes what the
// even split does (the same blocks a CTA, the same partials).
TEST(SplitItems, EqualLengthsGiveTheEvenSplit) {
  std::mt19937_64 rng(34);
  const attention::SplitDevice h200{132, 228 * 1024};
  int balanced = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    attention::Problem pr;
    pr.batch = std::uniform_int_distribution<int64_t>(1, 600)(rng);
    pr.max_q_len = 1;
    pr.max_kv_len = std::uniform_int_distribution<int64_t>(1, 1 << (rng() % 17 + 1))(rng);
    pr.h_kv = std::uniform_int_distribution<int64_t>(1, 16)(rng);
    pr.h_q = pr.h_kv * std::uniform_int_distribution<int64_t>(1, 16)(rng);
    pr.head_dim = pr.head_dim_v = 64 << (rng() % 3);
    pr.num_splits = 0;  // automatic
    const attention::BalancedSplit b = attention::balanced_split(pr, h200);
    if (b.items == 0) continue;
    ++balanced;
    const int splits = attention::choose_splits(pr, h200, true);
    ASSERT_EQ(b.items, splits + 1);
    const int block_n = attention::sm80::decode_tiles(static_cast<int>(pr.head_dim)).block_n;
    const int n = decode_key_blocks(static_cast<int>(pr.max_kv_len), -1, block_n);
    const int chunk = chunk_for(int64_t{n} * pr.batch, pr.batch * splits, b.min_blocks);
    ASSERT_EQ(chunk, (n + splits - 1) / splits)
        << "batch " << pr.batch << " kv " << pr.max_kv_len << " d " << pr.head_dim;
    ASSERT_LE(items_for(n, chunk), splits);
  }
  EXPECT_GT(balanced, 10000);
}

// The policy on the H200's figures (32/8 heads, d128: 396 decode block slots).
TEST(SplitItems, BalancedSplitOfTheMeasuredShapes) {
  const attention::SplitDevice h200{132, 228 * 1024};
  auto shape = [](int64_t batch, int64_t kv, int32_t num_splits = 0) {
    attention::Problem pr;
    pr.batch = batch;
    pr.max_q_len = 1;
    pr.max_kv_len = kv;
    pr.h_q = 32;
    pr.h_kv = 8;
    pr.head_dim = pr.head_dim_v = 128;
    pr.num_splits = num_splits;
    return pr;
  };
  auto is = [](attention::BalancedSplit b, int items, int min_blocks) {
    return b.items == items && b.min_blocks == min_blocks;
  };
  // 16 x 2k: the even split's 2 (16 blocks each) plus one; shares of one block at least (the
  // short-key rule takes 2k keys over at most one tile per SM).
  EXPECT_TRUE(is(attention::balanced_split(shape(16, 2048), h200), 3, 1));
  // 24 x 2k (192 tiles): the long-key rule, shares of 16 blocks at least.
  EXPECT_TRUE(is(attention::balanced_split(shape(24, 2048), h200), 3, 16));
  // 112 x 2k: 896 tiles, two rounds of 396 slots: unsplit evenly, 2 items by length.
  EXPECT_TRUE(is(attention::balanced_split(shape(112, 2048), h200), 2, 16));
  // 4 x 4k: 25 even splits (under half a round busy at 16 blocks a split: shares of 64 / 32).
  EXPECT_TRUE(is(attention::balanced_split(shape(4, 4096), h200), 26, 2));
  // Short keys: 8 even splits (two blocks per SM) plus one, one block a share at least.
  EXPECT_TRUE(is(attention::balanced_split(shape(4, 1024), h200), 9, 1));
  // Nothing to balance, or the caller's count.
  EXPECT_TRUE(is(attention::balanced_split(shape(1, 32768), h200), 0, 0));
  EXPECT_TRUE(is(attention::balanced_split(shape(8, 8192, 3), h200), 0, 0));
  // 128 even splits (two sequences of one KV head over 1M keys) leave no room for the extra item.
  attention::Problem wide = shape(2, 1 << 20);
  wide.h_q = wide.h_kv = 1;
  ASSERT_EQ(attention::choose_splits(wide, h200, true), 128);
  EXPECT_TRUE(is(attention::balanced_split(wide, h200), 0, 0));
}

}  // namespace
}  // namespace flashserve::testing
