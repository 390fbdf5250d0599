// The order in which a grid's tiles start, shared by the sm80 kernels (masked grids) and the
// persistent sm90 kernel (every grid). The order in which a masked (causal / windowed) grid's
// tiles start matters most. Their costs differ: under a
// causal mask the last query tile of a sequence visits every key block, the first only one. With
// the tiles of each (head, sequence) launched together, the heavy tiles of the last few heads start
// in the last wave and the GPU idles behind them (a list-scheduling model of the FA3 grid puts
// that at 10-13% for 512-8192 rows, under 2% at 16k where one head fills a wave). Heaviest first
// over all heads would fix the tail but stream every head's K/V from memory once per tile, so the
// heads are taken in sections: within a section, tile rows descend from the heaviest and heads
// vary fastest; a section holds enough heads for about two waves of blocks, and no more than half
// of L2 holds the K/V of (FlashAttention-3's LPT scheduler with its L2 swizzle does the same).
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention/mask.h"  // FS_HOST_DEVICE

namespace flashserve::attention::kernel {

// A 1-D grid of m_blocks x units blocks, units = heads x grid z (sequences and their splits),
// taken in `sections` sections whose sizes differ by at most one unit (the larger first).
struct GridOrder {
  int32_t m_blocks;  // query tiles per (head, z)
  int32_t heads;     // grid heads
  int32_t units;     // heads x grid z
  int32_t sections;  // 0: not in use (3-D grid)
};

// slots: blocks resident on the whole GPU at once; kv_bytes_per_unit: the K and V bytes one unit
// reads; l2_bytes: the device's L2.
inline GridOrder heaviest_first(int m_blocks, int heads, int64_t units, int64_t slots,
                                int64_t kv_bytes_per_unit, int64_t l2_bytes) {
  if (units * m_blocks > INT32_MAX) return GridOrder{m_blocks, heads, 0, 0};
  int64_t section = (2 * slots + m_blocks - 1) / m_blocks;
  section = std::min(section,
                     std::max<int64_t>(1, l2_bytes / 2 / std::max<int64_t>(kv_bytes_per_unit, 1)));
  section = std::clamp<int64_t>(section, 1, units);
  // Sections of equal size (within one unit): a small last one would start its heavy tiles in
  // the final wave, behind which the GPU idles.
  const int64_t sections = (units + section - 1) / section;
  return GridOrder{m_blocks, heads, static_cast<int32_t>(units), static_cast<int32_t>(sections)};
}

struct TileCoords {
  int m_block, head, z;
};

// The tile block `linear` of the 1-D grid computes (host too: tested in CI).
FS_HOST_DEVICE TileCoords tile_of(const GridOrder& o, int linear) {
  const int small = o.units / o.sections, large_count = o.units % o.sections;
  const int large_blocks = large_count * (small + 1) * o.m_blocks;
  int size, first, r;
  if (linear < large_blocks) {
    size = small + 1;
    const int s = linear / (size * o.m_blocks);
    first = s * size;
    r = linear - first * o.m_blocks;
  } else {
    size = small;
    const int rest = linear - large_blocks;
    const int s = rest / (size * o.m_blocks);
    first = large_count * (small + 1) + s * size;
    r = rest - s * size * o.m_blocks;
  }
  const int unit = first + r % size;
  return {o.m_blocks - 1 - r / size, unit % o.heads, unit / o.heads};
}

}  // namespace flashserve::attention::kernel
