// Tile sizes of the sm80 forward kernels: the one place they are chosen, with the reason beside
// each choice. Everything else (warp tiling, shared-memory size, launch bounds) derives from here.
#pragma once

namespace flashserve::attention::sm80 {

// A query tile of block_m rows meets key/value tiles of block_n rows; `warps` warps split the
// query rows (each warp owns block_m / warps consecutive rows, in m16 slices) and `stages` K/V
// tiles are in shared memory at once (the next `stages - 1` load while one is computed on).
struct Tiles {
  int block_m, block_n, warps, stages;
  // Skip the O rescale of a block when no row max of the warp moved (softmax.h). Measured on the
  // H200: +1..+6% for d128 and masked d256, -2..-3.5% for unmasked d256 (8 warps, 2 stages) and
  // -3..-8% for d64 (spills), so it is a per-configuration choice.
  bool skip_unchanged_rescale;
  // __launch_bounds__ occupancy hint: caps registers at 64K / (threads * min_blocks_per_sm).
  int min_blocks_per_sm;
  // Decode: the query heads of a GQA group become the tile's rows (fwd_tile.h); only for calls
  // where every sequence has at most one query (a left window bounds the packed rows alike).
  bool pack_gqa = false;
  // Load each ldmatrix fragment one MMA pair ahead of its use (warp_gemm.h).
  bool pipeline_frags = false;
  // PV in warp pairs: each warp computes S and the softmax of its own m16 slice, the pair swaps
  // the probabilities through shared memory, and each warp accumulates O for both slices over
  // half of the head dim, so every V fragment it reads feeds two slices (fwd_kernel.h): fewer
  // ldmatrix and fewer waits on them (shared-memory bandwidth itself was a third used, run 21).
  // Needs one m16 slice per warp, an even warp count and single K/V buffers (stages = 1).
  bool pv_pairs = false;
};

// The shared-memory exchange of a PV pair, per warp and lane: the packed probabilities (one
// 16-byte word per 16-key MMA step), the row-max corrections of the step, and the final
// normalisers: (block_n / 16 + 2) words of 16 bytes per lane.
constexpr int pv_exchange_bytes(Tiles t) {
  return t.pv_pairs ? t.warps * (t.block_n / 16 + 2) * 32 * 16 : 0;
}

// Shared memory a configuration needs: Q once plus `stages` buffers of K and of V (2-byte
// elements), and the PV pairs' exchange.
constexpr int fwd_smem_bytes(int head_dim, Tiles t) {
  return (t.block_m + 2 * t.stages * t.block_n) * head_dim * 2 + pv_exchange_bytes(t);
}

// The configuration for a head dim and mask. Chosen by measurement on the H200 (docs/
// kernel-notes.md, runs 2-11), FA2's grid, bf16. Every configuration needs at most 108 KB of
// shared memory, so the same tiles run on H100/H200 (227 KB per block) and A100 (163 KB); on
// Hopper two blocks share an SM. sm86/sm89 (99 KB) take fwd_tiles_small_smem where that is less.
//
// Each warp owns two m16 slices (32 query rows) where registers allow: every K/V fragment a warp
// reads from shared memory then feeds two MMAs, which halves shared-memory traffic per FLOP (with
// one slice per warp, ldmatrix needs ~160 B/clk/SM at full mma.sync rate, above the 128 B/clk an
// SM delivers). stages = 1 is FA2's schedule (single K and V buffers, V(n) loading during
// QK^T(n), K(n-1) during softmax and PV(n)); stages = 2 a ring of two K/V blocks.
constexpr Tiles fwd_tiles(int head_dim, bool masked) {
  switch (head_dim) {
    case 64:
      // 4 warps x 32 rows. S accumulator 2x16x4 = 128 fp32 and O 2x8x4 = 64 fp32 per thread fit
      // in 255 registers; a 128-key block keeps the per-block softmax/barrier overhead small
      // against the short (64-deep) QK^T. 48 KB smem; registers allow two blocks per SM. The
      // single-buffer schedule measured 0-6% faster than a two-stage ring (run 3).
      return {128, 128, 4, 1, false, 2};
    case 128:
      // 4 warps x 32 rows. O is 2x16x4 = 128 fp32 per thread, so S gets 64 keys (64 fp32) to
      // stay near 255 registers (ptxas still spills 64-80 bytes, off the MMA path); two blocks
      // per SM. 128x32 and 8-warp variants measured 5-20% slower. Unmasked: a two-stage ring
      // (96 KB) measured 0.5-2% faster than single buffers (run 11); masked tiles keep the
      // single buffers of run 3 (64 KB).
      if (masked) return {128, 64, 4, 1, true, 2};
      return {128, 64, 4, 2, true, 2};
    case 256:
      // O alone is 256 fp32 per 32 rows, so each warp owns one m16 slice (O 128 fp32, S 32) and
      // 255 registers allow 8 warps per SM: one 128-row block or two 64-row blocks. Two 64-row
      // blocks (96 KB each) overlap one's prologue, barriers and epilogue with the other's math:
      // 8-15% faster than 128-row tiles on the causal grid (run 3), 1.7-2.9% faster than the
      // 128-row two-stage ring and 0-1.5% faster than FA2's 128-row single buffers unmasked
      // (runs 11-12); the rescale skip is worth 0-1% here, masked or not (run 12). Copying each
      // fragment one MMA pair ahead (FA2's pipelining) adds 0.2-2.2%, most on short sequences;
      // for d64/d128 it measured 0-2% slower (run 13).
      // PV pairs (run 17): +1-2.5% unmasked; masked, with heaviest-first grids (run 18), the
      // one-slice tile measured 2-4% faster.
      return {64, 64, 4, 1, true, 2, false, true, !masked};
    default:
      return {0, 0, 0, 0, false, 0};
  }
}

// Where the device's per-block shared memory is below fwd_tiles' need (sm86/sm89: 99 KB), the
// same tile without the PV pairs' exchange (96 KB).
constexpr Tiles fwd_tiles_small_smem(int head_dim, bool masked) {
  Tiles t = fwd_tiles(head_dim, masked);
  t.pv_pairs = false;
  return t;
}

// Decode (at most one query per sequence): the GQA group's heads fill a 16-row tile (one m16
// slice, one warp), so a KV head's keys are read once for its whole group; the work is reading
// K/V, and many small blocks (plus split-KV) keep enough loads in flight. A 128-row prefill tile
// here computed 128 rows for each real one and ran compute-bound at 0.2-0.8 TB/s.
// The key block is sized so that each step moves 32 KB of K and V (16 KB each), which keeps the
// block at 68-72 KB of shared memory: three per SM.
constexpr Tiles decode_tiles(int head_dim) {
  const int block_n = 8192 / head_dim;  // 16 KB per K or V tile
  return {16, block_n, 1, 2, false, 8, true};
}

// The most splits a decode launch merges in a thread-block cluster (cluster_combine.h): 16 CTAs,
// the non-portable cluster size Hopper allows (8 is the portable one).
inline constexpr int kClusterCombineMaxSplits = 16;

// The shared memory of a decode block of the fp8 KV cache's register-conversion kernel
// (kv_fp8_reg.h CodeSmem): Q in 16 bits, K and V tiles as one-byte codes, half the bytes of
// fwd_smem_bytes' (its page-table entries, a few hundred bytes, aside): 35-41 KB, five or six an
// SM where the 16-bit decode tiles fit three.
constexpr int decode_code_smem_bytes(int head_dim, Tiles t) {
  return t.block_m * head_dim * 2 + 2 * t.stages * t.block_n * head_dim;
}

// The head dims compiled (fwd_hdim*.cu): a call with other head dims (multiples of 8 from 32 to
// 256, possibly q/k's differing from v's) runs on the smallest of them at or above both, its
// padded instantiation (PaddedConfig below). FlashAttention-2 compiles 32, 64, 96, 128, 160, 192,
// 224 and 256; here a further compiled dim is added only where a measurement asks for it
// (docs/kernel-notes.md, "Issue 24: head dims").
constexpr bool compiled_head_dim(int d) {
  return d == 64 || d == 128 || d == 256;
}
constexpr int kernel_head_dim(int head_dim, int head_dim_v) {
  const int d = head_dim > head_dim_v ? head_dim : head_dim_v;
  return d <= 64 ? 64 : d <= 128 ? 128 : d <= 256 ? 256 : 0;
}
// Whether a call runs on a padded instantiation: its head dims are not both the kernel's.
constexpr bool padded_head_dims(int head_dim, int head_dim_v) {
  return head_dim != head_dim_v || !compiled_head_dim(head_dim);
}

// Compile-time view of one configuration: the derived sizes every part of the kernel uses.
template <int kHeadDim_, Tiles kTiles>
struct FwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kTiles.block_m;
  static constexpr int kBlockN = kTiles.block_n;
  static constexpr int kWarps = kTiles.warps;
  static constexpr int kStages = kTiles.stages;
  static constexpr int kMinBlocksPerSm = kTiles.min_blocks_per_sm;
  static constexpr bool kSkipUnchangedRescale = kTiles.skip_unchanged_rescale;
  static constexpr bool kPackGqa = kTiles.pack_gqa;
  static constexpr bool kPipelineFrags = kTiles.pipeline_frags;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = kBlockM / kWarps;  // query rows per warp
  static constexpr int kMTiles = kWarpRows / 16;      // m16 slices per warp
  static constexpr int kNTiles = kBlockN / 8;         // n8 tiles of S per slice
  static constexpr int kDTiles = kHeadDim / 8;        // n8 tiles of O per slice
  static constexpr bool kPvPairs = kTiles.pv_pairs;
  // The O accumulators a warp holds: its own m16 slices over the whole head dim, or (PV pairs) its
  // own slice and its partner's over half of it.
  static constexpr int kOSlices = kPvPairs ? 2 : kMTiles;
  static constexpr int kODTiles = kPvPairs ? kDTiles / 2 : kDTiles;
  static constexpr int kPvSteps = kBlockN / 16;  // k16 steps of P . V
  static constexpr int kSmemBytes = fwd_smem_bytes(kHeadDim, kTiles);
  // Every column of kHeadDim is real (PaddedConfig: the call's head dims are run-time bounds).
  static constexpr bool kPadded = false;
  static_assert(kHeadDim % 64 == 0, "rows are whole 128-byte swizzle groups");
  static_assert(kBlockM % (16 * kWarps) == 0 && kBlockN % 16 == 0);
  static_assert(kStages >= 1);
  static_assert(!kPvPairs || (kMTiles == 1 && kWarps % 2 == 0 && kStages == 1 && !kPackGqa),
                "PV pairs: one m16 slice per warp, whole pairs, single K/V buffers");
};

// A configuration run for head dims below its kHeadDim (fwd_kernel_padded): the same tiles, the
// columns of q, k and v past the call's head dims zero-filled on load, out's past head_dim_v never
// stored (FwdPaddedParams). A type of its own, so the kernels of FwdConfig keep their names.
template <class Cfg>
struct PaddedConfig : Cfg {
  static constexpr bool kPadded = true;
};

}  // namespace flashserve::attention::sm80
