// The masked grid's tile order (src/attention/kernel/tile_order.h): every tile exactly once, the
// heaviest (last) query tiles first within each section, sections of equal size bounded by L2, and
// the figures it picks for the benchmark grid on the H200.
#include "attention/kernel/tile_order.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace flashserve::testing {
namespace {

using attention::kernel::GridOrder;
using attention::kernel::heaviest_first;
using attention::kernel::tile_of;

constexpr int64_t kH200Slots = 2 * 132;
constexpr int64_t kL2 = 50 << 20;

// Walks the 1-D grid: each (m_block, head, z) once; sections in order, sizes within one unit of
// each other (the larger first), each starting with its heaviest tiles; m_block never rises inside
// a section.
void expect_order(const GridOrder& o, int z_count) {
  ASSERT_GT(o.sections, 0);
  ASSERT_LE(o.sections, o.units);
  ASSERT_EQ(o.units, o.heads * z_count);
  std::vector<int> section_of(o.units);
  for (int s = 0, unit = 0; s < o.sections; ++s) {
    const int size = o.units / o.sections + (s < o.units % o.sections ? 1 : 0);
    for (int i = 0; i < size; ++i) section_of[unit++] = s;
  }
  std::vector<int> seen(static_cast<size_t>(o.m_blocks) * o.units, 0);
  int prev_section = -1, prev_m = 0;
  for (int linear = 0; linear < o.m_blocks * o.units; ++linear) {
    const auto c = tile_of(o, linear);
    ASSERT_GE(c.m_block, 0);
    ASSERT_LT(c.m_block, o.m_blocks);
    ASSERT_GE(c.head, 0);
    ASSERT_LT(c.head, o.heads);
    ASSERT_GE(c.z, 0);
    ASSERT_LT(c.z, z_count);
    const int unit = c.z * o.heads + c.head;
    ++seen[static_cast<size_t>(unit) * o.m_blocks + c.m_block];
    const int section = section_of[unit];
    if (section == prev_section) {
      ASSERT_LE(c.m_block, prev_m) << "linear " << linear;
    } else {
      ASSERT_EQ(section, prev_section + 1) << "sections run in order";
      ASSERT_EQ(c.m_block, o.m_blocks - 1) << "a section starts with its heaviest tiles";
    }
    prev_section = section;
    prev_m = c.m_block;
  }
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "tile " << i;
}

TEST(GridOrder, BenchmarkGridOnH200) {
  // d256, causal, 512 rows x 32 sequences x 8 heads, 64-row tiles: two waves would take 66 heads,
  // L2 / 2 holds the K/V of 50 (512 KB each): six sections, of 43 heads (four) and 42 (two).
  GridOrder o = heaviest_first(8, 8, 256, kH200Slots, 512 * 256 * 4, kL2);
  EXPECT_EQ(o.sections, 6);
  expect_order(o, 32);
  EXPECT_EQ(tile_of(o, 0).m_block, 7);
  EXPECT_EQ(tile_of(o, 42).m_block, 7);
  EXPECT_EQ(tile_of(o, 43).m_block, 6);
  // 8k rows, 2 x 8 heads of 8 MB K/V: three per section by L2, so six sections of 3, 3, 3, 3, 2
  // and 2 heads (not five of 3 and a last one of 1, which starts 128 heavy tiles at the end).
  o = heaviest_first(128, 8, 16, kH200Slots, 8192 * 256 * 4, kL2);
  EXPECT_EQ(o.sections, 6);
  expect_order(o, 2);
  // The first block past four sections of 3: unit 12 = head 4 of sequence 1, heaviest tile.
  EXPECT_EQ(tile_of(o, 12 * 128).head, 4);
  EXPECT_EQ(tile_of(o, 12 * 128).z, 1);
  EXPECT_EQ(tile_of(o, 12 * 128).m_block, 127);
  // 16k rows, one sequence of 8 heads: a head's 256 tiles are about a wave and its K/V is 16 MB:
  // one head per section.
  o = heaviest_first(256, 8, 8, kH200Slots, 16384 * 256 * 4, kL2);
  EXPECT_EQ(o.sections, 8);
  expect_order(o, 1);
}

TEST(GridOrder, RandomShapesCoverEveryTileOnce) {
  std::mt19937 rng(20261129);
  for (int iter = 0; iter < 300; ++iter) {
    const int m_blocks = 1 + static_cast<int>(rng() % 40);
    const int heads = 1 + static_cast<int>(rng() % 12);
    const int z = 1 + static_cast<int>(rng() % 9);
    const int64_t slots = 1 + rng() % 600;
    const int64_t kv = 1 + rng() % (64 << 20);
    expect_order(heaviest_first(m_blocks, heads, int64_t{heads} * z, slots, kv, kL2), z);
  }
}

TEST(GridOrder, TooLargeForOneDimensionFallsBack) {
  const GridOrder o = heaviest_first(1 << 16, 64, int64_t{1} << 16, kH200Slots, 1 << 20, kL2);
  EXPECT_EQ(o.sections, 0);
}

}  // namespace
}  // namespace flashserve::testing
