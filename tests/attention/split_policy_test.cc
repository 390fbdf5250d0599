// The CUDA path's split-KV policy (src/attention/split_policy.h), on the H200's figures: the
// counts the decode measurements chose (docs/kernel-notes.md, run 12; the model's decode step at
// 1k keys, docs/model-gpu.md), explicit counts passed through, and over random shapes the
// invariants the kernels and the workspace rely on.
#include "attention/split_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "attention/sm80/tile_config.h"

namespace flashserve::testing {
namespace {

using attention::choose_splits;
using attention::is_decode;
using attention::Problem;
using attention::SplitDevice;

constexpr SplitDevice kH200{132, 228 * 1024};

Problem shape(int64_t batch, int64_t q_len, int64_t kv_len, int64_t h_q, int64_t h_kv,
              int64_t d = 128, int32_t num_splits = 0) {
  Problem pr;
  pr.batch = batch;
  pr.max_q_len = q_len;
  pr.max_kv_len = kv_len;
  pr.h_q = h_q;
  pr.h_kv = h_kv;
  pr.head_dim = pr.head_dim_v = d;
  pr.num_splits = num_splits;
  return pr;
}

TEST(SplitPolicy, DecodeIsOneQueryWithoutLeftWindow) {
  EXPECT_TRUE(is_decode(shape(8, 1, 4096, 32, 8)));
  EXPECT_FALSE(is_decode(shape(8, 2, 4096, 32, 8)));  // two queries: prefill tiles
}

TEST(SplitPolicy, DecodeCountsOfTheMeasuredShapes) {
  // 32 query heads over 8 KV heads, d128: 8 KV heads x batch packed tiles.
  EXPECT_EQ(choose_splits(shape(1, 1, 32768, 32, 8), kH200, true), 32);  // 16 key blocks each
  // 8 splits would be 512 blocks in 396 slots (1.3 rounds): 6 fill one round
  EXPECT_EQ(choose_splits(shape(8, 1, 8192, 32, 8), kH200, true), 6);
  EXPECT_EQ(choose_splits(shape(64, 1, 4096, 32, 8), kH200, true), 2);
  EXPECT_EQ(choose_splits(shape(128, 1, 2048, 32, 8), kH200, true), 1);  // enough tiles
}

// Under 2k keys (d128), and at 2k over at most one tile per SM: two blocks per SM, one 64-key
// block per split at least. Measured (run 47, 1k keys): batch 1 fastest at 16 splits (14.6 us,
// 43.3 unsplit), batch 32 unsplit (46.3 us, 76.4 with 16 splits); session 37 (batches 2-16 at
// 512, 1k and 2k keys): the fastest forced count gave 256 blocks.
TEST(SplitPolicy, ShortDecodesSplitToTwoBlocksPerSm) {
  EXPECT_EQ(choose_splits(shape(1, 1, 1024, 32, 8), kH200, true), 16);
  EXPECT_EQ(choose_splits(shape(32, 1, 1024, 32, 8), kH200, true), 1);
  EXPECT_EQ(choose_splits(shape(1, 1, 1000, 32, 8), kH200, true), 15);  // 15 whole key blocks
  // b sequences x 8 KV heads = 8b tiles: 264 / 8b splits (the measured best at b = 2..16).
  EXPECT_EQ(choose_splits(shape(2, 1, 1024, 32, 8), kH200, true), 16);
  EXPECT_EQ(choose_splits(shape(4, 1, 1024, 32, 8), kH200, true), 8);
  EXPECT_EQ(choose_splits(shape(8, 1, 1024, 32, 8), kH200, true), 4);
  EXPECT_EQ(choose_splits(shape(16, 1, 1024, 32, 8), kH200, true), 2);
  EXPECT_EQ(choose_splits(shape(4, 1, 512, 32, 8), kH200, true), 8);  // all 8 whole blocks
  EXPECT_EQ(choose_splits(shape(8, 1, 512, 32, 8), kH200, true), 4);
  EXPECT_EQ(choose_splits(shape(64, 1, 1024, 32, 8), kH200, true), 1);
  EXPECT_EQ(choose_splits(shape(1, 1, 63, 32, 8), kH200, true), 1);  // not one whole block
  // 2k keys (32 blocks): the same rule while the tiles fit one per SM (16 x 8 = 128 of 132).
  EXPECT_EQ(choose_splits(shape(2, 1, 2048, 32, 8), kH200, true), 16);
  EXPECT_EQ(choose_splits(shape(4, 1, 2048, 32, 8), kH200, true), 8);
  EXPECT_EQ(choose_splits(shape(8, 1, 2048, 32, 8), kH200, true), 4);
  EXPECT_EQ(choose_splits(shape(16, 1, 2048, 32, 8), kH200, true), 2);
  EXPECT_EQ(choose_splits(shape(24, 1, 2048, 32, 8), kH200, true), 2);  // 192 tiles: long rule
}

// Past 2k keys, a few sequences whose 16-block splits would keep under half the GPU's 396 block
// slots busy split further, up to the 32 splits batch 1 x 32k measured best.
TEST(SplitPolicy, SmallDecodeGridsSplitUpTo32Ways) {
  EXPECT_EQ(choose_splits(shape(1, 1, 2048, 32, 8), kH200, true), 32);  // 16-block splits: 2
  EXPECT_EQ(choose_splits(shape(1, 1, 8192, 32, 8), kH200, true), 32);  // 16-block splits: 8
  // 4 x 8 tiles; two rounds of slots want 25 splits, fewer than 32.
  EXPECT_EQ(choose_splits(shape(4, 1, 4096, 32, 8), kH200, true), 25);
}

// The fp8 KV cache's register-conversion tiles: six blocks an SM (792 slots) where the 16-bit
// tiles fit three, so their counts follow their own slots, and a grid that one round of them holds
// at least half busy runs unsplit (measured, session 23: 64 x 2k and 64 x 4k fastest unsplit).
TEST(SplitPolicy, Fp8CodeTilesSplitByTheirOwnSlots) {
  const auto both = [](int64_t batch, int64_t kv) {
    const Problem pr = shape(batch, 1, kv, 32, 8);
    return std::pair{choose_splits(pr, kH200, true), choose_splits(pr, kH200, true, true)};
  };
  EXPECT_EQ(both(64, 2048), std::pair(2, 1));  // 512 tiles: 1.3 rounds of 396, 0.65 of 792
  EXPECT_EQ(both(64, 4096), std::pair(2, 1));
  EXPECT_EQ(both(96, 2048), std::pair(2, 1));    // 768 tiles, one round of 792
  EXPECT_EQ(both(128, 2048), std::pair(1, 2));   // 1024: two rounds of 396, 1.3 of 792
  EXPECT_EQ(both(32, 4096), std::pair(4, 3));    // 256 tiles, under half a round: 768 blocks
  EXPECT_EQ(both(8, 32768), std::pair(13, 25));  // two rounds of their slots each
  EXPECT_EQ(both(8, 8192), std::pair(6, 8));
  // Prefill launches and explicit counts do not look at it.
  EXPECT_EQ(choose_splits(shape(1, 128, 8192, 8, 8), kH200, false, true), 32);
  EXPECT_EQ(choose_splits(shape(64, 1, 4096, 32, 8, 128, 5), kH200, true, true), 5);
}

TEST(SplitPolicy, PrefillSplitsOnlyBelowOneWave) {
  // A 128-query chunk of 8 heads over 8192 cached keys: 8 tiles, two waves' worth of splits, but
  // no fewer than 4 key blocks each.
  EXPECT_EQ(choose_splits(shape(1, 128, 8192, 8, 8), kH200, false), 32);
  EXPECT_EQ(choose_splits(shape(16, 1024, 1024, 16, 16), kH200, false), 1);  // 2048 tiles
}

TEST(SplitPolicy, ExplicitCountsPassThrough) {
  EXPECT_EQ(choose_splits(shape(1, 1, 32768, 32, 8, 128, 1), kH200, true), 1);
  EXPECT_EQ(choose_splits(shape(1, 1, 32768, 32, 8, 128, 5), kH200, true), 5);
  EXPECT_EQ(choose_splits(shape(1, 512, 100, 8, 8, 64, 3), kH200, false), 3);
}

// Over random shapes (batch <= 65535, as the dispatch requires): 1..128 splits, a grid z (batch x
// splits) within 65535, and every split of an automatic choice keeps its minimum share of key
// blocks: prefill 4; decode one whole block under 32 blocks, else min(16, blocks / 32).
TEST(SplitPolicy, InvariantsOverRandomShapes) {
  std::mt19937_64 rng(5);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int split_calls = 0;
  for (int i = 0; i < 20000; ++i) {
    const int64_t h_kv = pick(1, 16), group = pick(1, 32), d = 64 << pick(0, 2);
    const bool decode = pick(0, 1) == 1, fp8_codes = pick(0, 1) == 1;
    // Log-uniform sizes, so that small grids (the ones that split) are common.
    auto log_pick = [&](int bits) { return pick(1, int64_t{1} << pick(0, bits)); };
    const Problem pr = shape(std::min<int64_t>(log_pick(16), 65535), decode ? 1 : log_pick(14),
                             log_pick(20) - 1, h_kv * group, h_kv, d);
    const SplitDevice dev{static_cast<int>(pick(1, 200)), static_cast<int>(pick(96, 228)) * 1024};
    const int splits = choose_splits(pr, dev, decode, fp8_codes);
    ASSERT_GE(splits, 1);
    ASSERT_LE(splits, 128);
    ASSERT_LE(pr.batch * splits, 65535) << "batch " << pr.batch;
    if (splits > 1) {
      ++split_calls;
      const int64_t block_n = decode
                                  ? attention::sm80::decode_tiles(static_cast<int>(d)).block_n
                                  : attention::sm80::fwd_tiles(static_cast<int>(d), false).block_n;
      const int64_t key_blocks = (pr.max_kv_len + block_n - 1) / block_n;
      if (!decode)
        EXPECT_GE(key_blocks / splits, 4) << "kv " << pr.max_kv_len << " into " << splits;
      else if (key_blocks < 32)
        EXPECT_LE(splits, pr.max_kv_len / block_n) << "kv " << pr.max_kv_len << " into " << splits;
      else
        EXPECT_GE(key_blocks / splits, std::min<int64_t>(16, key_blocks / 32))
            << "kv " << pr.max_kv_len << " into " << splits;
    }
  }
  EXPECT_GT(split_calls, 100);  // the shapes do reach the splitting branch
}

}  // namespace
}  // namespace flashserve::testing
