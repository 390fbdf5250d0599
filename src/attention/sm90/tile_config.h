// The sm90 forward kernel's tile sizes, in one place, with the reason for each.
#pragma once

namespace flashserve::attention::sm90 {

template <int kHeadDim_>
struct TileConfig {
  static constexpr int kHeadDim = kHeadDim_;
  // 128 query rows: two consumer warpgroups of 64 rows each (wgmma's M is 64 per warpgroup).
  static constexpr int kBlockM = 128;
  // 128 keys per block: S is a 64x128 fp32 accumulator (64 registers per thread), O another 64 at
  // d128; both fit the consumers' 232 registers with P (32) beside them.
  static constexpr int kBlockN = 128;
  // Two K/V stages: TMA fills block j+1 while the consumers work on block j. d128: Q 32 KB +
  // 2 x (K 32 KB + V 32 KB) = 160 KB of the H100/H200's 227 KB.
  static constexpr int kStages = 2;
  // TMA's 128-byte swizzle moves boxes of at most 128 bytes per row: 64 16-bit columns. A tile of
  // d columns is d/64 boxes, stored one after the other ("column chunks").
  static constexpr int kChunkCols = 64;
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kWarpgroups = 3;  // 1 producer + 2 consumers
  static constexpr int kThreads = kWarpgroups * 128;
  // setmaxnreg budgets (64K registers per SM, one CTA): 128 x 40 + 256 x 232 = 64512.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;

  static constexpr int kQChunkBytes = kBlockM * kChunkCols * 2;
  static constexpr int kKVChunkBytes = kBlockN * kChunkCols * 2;
  static constexpr int kQBytes = kQChunkBytes * kChunks;
  static constexpr int kKVBytes = kKVChunkBytes * kChunks;
  static_assert(kHeadDim % kChunkCols == 0, "head dim is a whole number of 64-column boxes");
};

}  // namespace flashserve::attention::sm90
