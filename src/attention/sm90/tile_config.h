// The sm90 forward kernel's tiles, in one place, with the reason for each (measurements in
// docs/kernel-notes.md, "sm90").
#pragma once

namespace flashserve::attention::sm90 {

// 128 query rows per tile: two consumer warpgroups of 64 rows each (wgmma's M is 64 per
// warpgroup). The host sizes Q's tensor map and the grid by it.
inline constexpr int kQueryTileRows = 128;

template <int kHeadDim_, int kBlockN_, int kStages_ = 2>
struct TileConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kQueryTileRows;
  // Keys per block: S is a 64 x kBlockN fp32 accumulator (kBlockN / 2 registers per thread);
  // with intra-warpgroup overlap a thread holds S of block j, P of block j - 1 (kBlockN / 4) and
  // O (kHeadDim / 2) at once, all within the consumers' 240 registers.
  static constexpr int kBlockN = kBlockN_;
  // K/V stages: TMA fills the next blocks while the consumers work on this one.
  static constexpr int kStages = kStages_;
  // TMA's 128-byte swizzle moves boxes of at most 128 bytes per row: 64 16-bit columns. A tile of
  // d columns is d/64 boxes, stored one after the other ("column chunks").
  static constexpr int kChunkCols = 64;
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kWarpgroups = 3;  // 1 producer + 2 consumers
  static constexpr int kThreads = kWarpgroups * 128;
  static constexpr int kConsumerWarps = 8;
  // setmaxnreg budgets (64K registers per SM, one CTA): the producer only issues TMA copies;
  // 128 x 24 + 256 x 240 = 64512.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;

  static constexpr int kQChunkBytes = kBlockM * kChunkCols * 2;
  static constexpr int kKVChunkBytes = kBlockN * kChunkCols * 2;
  static constexpr int kQBytes = kQChunkBytes * kChunks;
  static constexpr int kKVBytes = kKVChunkBytes * kChunks;
  static_assert(kHeadDim % kChunkCols == 0, "head dim is a whole number of 64-column boxes");
  static_assert(kBlockN % 16 == 0, "P V takes 16 keys per k-step");
  // Each chunk starts a run of 8-row swizzle atoms on a 1024-byte boundary.
  static_assert(kKVChunkBytes % 1024 == 0, "kBlockN is a multiple of 8");
};

// The tile each head dim runs (FlashAttention-3's choices, hopper/tile_size.h, as a start):
// - d64 and d128 causal: 128 x 128. Causal tiles are balanced by the diagonal: a longer key block
//   wastes more of the masked half.
// - d128 non-causal: 128 x 176 (S 88 + P 44 + O 64 registers): fewer, longer blocks amortise the
//   per-block softmax bookkeeping. Q 32 KB + 2 x (K 44 KB + V 44 KB) = 208 KB of shared memory.
// - d256: 128 x 80 (S 40 + P 20 + O 128 registers): O takes half the registers. Q 64 KB +
//   2 x (K 40 KB + V 40 KB) = 224 KB, just under the 227 KB a block can have.
template <int kHeadDim, bool kCausal>
struct DefaultTile;
template <bool kCausal>
struct DefaultTile<64, kCausal> {
  using type = TileConfig<64, 128>;
};
template <>
struct DefaultTile<128, false> {
  using type = TileConfig<128, 176>;
};
template <>
struct DefaultTile<128, true> {
  using type = TileConfig<128, 128>;
};
template <bool kCausal>
struct DefaultTile<256, kCausal> {
  using type = TileConfig<256, 80>;
};

}  // namespace flashserve::attention::sm90
