// The sm90 forward kernel's tiles, in one place, with the reason for each (measurements in
// docs/kernel-notes.md, "sm90").
#pragma once

#include <cstdint>

namespace flashserve::attention::sm90 {

// The registers a CTA of `threads` threads holds with __launch_bounds__(threads, 1): ptxas's cap
// of 65536 / threads per thread, rounded down to its allocation unit of 8, times the threads.
// setmaxnreg moves registers within that pool only; an .inc past it waits forever.
constexpr int cta_registers(int threads) {
  return 65536 / threads / 8 * 8 * threads;
}
// A producer warpgroup at `producer` registers per thread and `consumers` warpgroups at
// `consumer` fit the pool of a CTA of 1 + consumers warpgroups.
constexpr bool setmaxnreg_fits(int producer, int consumer, int consumers) {
  return 128 * producer + 128 * consumers * consumer <= cta_registers(128 * (1 + consumers)) &&
         producer % 8 == 0 && consumer % 8 == 0 && producer >= 24 && consumer <= 256;
}

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_ = 2, bool kLazyRescale_ = false,
          bool kTmaStoreO_ = false, bool kTrace_ = false>
struct TileConfig {
  static constexpr int kHeadDim = kHeadDim_;
  // Query rows: one consumer warpgroup per 64 (wgmma's M is 64 per warpgroup).
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kConsumers = kBlockM / 64;
  // Keys per block: S is a 64 x kBlockN fp32 accumulator (kBlockN / 2 registers per thread);
  // with intra-warpgroup overlap a thread holds S of block j, P of block j - 1 (kBlockN / 4) and
  // O (kHeadDim / 2) at once, all within the consumers' registers.
  static constexpr int kBlockN = kBlockN_;
  // K/V stages: TMA fills the next blocks while the consumers work on this one.
  static constexpr int kStages = kStages_;
  // The softmax rescales O only when a row's max grew by more than 2^8 (fwd_softmax.h's RowState).
  static constexpr bool kLazyRescale = kLazyRescale_;
  // O leaves through shared memory and TMA stores, one per warpgroup and 64 columns, instead of
  // register stores (fwd_epilogue.h's FwdEpilogue::store): 16 KB of staging per warpgroup at d128.
  // The library's tiles take it through OverlappedEpilogue below.
  static constexpr bool kTmaStoreO = kTmaStoreO_;
  // With kTmaStoreO: O is staged in Q's buffer (each warpgroup's rows in its own 64 rows of Q,
  // once its last QK^T is done) instead of a buffer of its own; the next tile's Q then loads
  // once this tile's stores have read it.
  static constexpr bool kOInQ = false;
  // The producer announces each tile with its coordinates and lengths (fwd_tile_scheduler.h
  // TileSlot), so that the consumers start it without the order's divisions and the lengths' loads.
  static constexpr bool kAnnounceWork = false;
  // The TMA producer loads a tile's first K block before its Q (the K stage frees one QK^T
  // earlier than Q; with kOInQ, Q frees only after the previous tile's O stores).
  static constexpr bool kFirstKBeforeQ = false;
  // Paged K/V in pages shorter than a key block: copied by the producer warpgroup's 128 threads
  // with cp.async (fwd_mainloop.h's copy_kv) up to d128, one TMA box per page at d256. Measured on
  // the engine's 16-key pages (bench_serve_attn, session 14): cp.async 1.46-1.80x the dense
  // time at d64 and 1.95-2.24x at d128, against TMA boxes' ~2x and 2.4-2.6x; at d256 the boxes
  // (2.0x) beat cp.async (2.30-2.57x). Its row offsets take 16 bytes of shared memory per key.
  static constexpr bool kPagedCpAsync = kHeadDim <= 128;
  // Tuning builds only: the kernel records its timeline (trace.h).
  static constexpr bool kTrace = kTrace_;
  // The softmax's exponentials of one 8-column chunk of a row in kExp2FmaEvery go to the FMA pipe
  // (exp2_poly.h) instead of the MUFU unit; 0: all on the MUFU. Exp2Fma below.
  static constexpr int kExp2FmaEvery = 0;
  // CTAs per cluster sharing K/V by TMA multicast: 1 here, 2 in Multicast<> below.
  static constexpr int kCluster = 1;
  // TMA's 128-byte swizzle moves boxes of at most 128 bytes per row: 64 16-bit columns. A tile of
  // d columns is d/64 boxes, stored one after the other ("column chunks").
  static constexpr int kChunkCols = 64;
  static constexpr int kChunks = kHeadDim / kChunkCols;
  // O leaves in 16 bits whatever the inputs: with kTmaStoreO its staging and TMA stores are
  // boxes of 64 columns (128-byte rows), kHeadDim / 64 of them (kChunks at 16 bits; the fp8
  // tiles' chunks are 128 one-byte columns).
  static constexpr int kOChunks = kHeadDim / 64;
  static constexpr int kWarpgroups = 1 + kConsumers;  // the producer and the consumers
  static constexpr int kThreads = kWarpgroups * 128;
  static constexpr int kConsumerWarps = 4 * kConsumers;
  // setmaxnreg budgets (64K registers per SM, one CTA): the producer issues TMA copies and picks
  // the tiles (at 24 registers its tile loop spilled 8-24 bytes), or with paged K/V all 128 of
  // its threads copy (kPagedCpAsync). Two consumers: 128 x 40 + 256 x 232 = 64512, the whole
  // pool of 384 threads at 168 (at 32 the copy loop spilled 64-100 bytes at d128, 28-68 at d64;
  // at 40, with the storage in the shared address space, 8-48 and 0-8: ptxas, session 26; a
  // 40-register producer measured 2-8% faster on paged d128 once, session 14). Three: 128 x 32
  // + 384 x 160 = 65536, nothing to spare.
  static constexpr int kProducerRegs = kConsumers == 2 ? 40 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 232 : 160;
  static_assert(kBlockM % 64 == 0 && (kConsumers == 2 || kConsumers == 3),
                "two or three consumer warpgroups of 64 rows");
  static_assert(setmaxnreg_fits(kProducerRegs, kConsumerRegs, kConsumers),
                "the setmaxnreg budgets exceed the CTA's registers: setmaxnreg.inc would hang");

  static constexpr int kQChunkBytes = kBlockM * kChunkCols * 2;
  static constexpr int kKVChunkBytes = kBlockN * kChunkCols * 2;
  static constexpr int kQBytes = kQChunkBytes * kChunks;
  static constexpr int kKVBytes = kKVChunkBytes * kChunks;
  static_assert(kHeadDim % kChunkCols == 0, "head dim is a whole number of 64-column boxes");
  static_assert(kBlockN % 16 == 0, "P V takes 16 keys per k-step");
  // Each chunk starts a run of 8-row swizzle atoms on a 1024-byte boundary.
  static_assert(kKVChunkBytes % 1024 == 0, "kBlockN is a multiple of 8");
  // The element type: 16-bit here, float8_e4m3fn in Fp8TileConfig below. V's buffer has the
  // same chunks as K's ([keys, d] as TMA reads it); the wgmma k-steps of QK^T (16 columns, 32
  // bytes of a row) and of P V (16 keys).
  static constexpr bool kFp8 = false;
  static constexpr int kRowBytes = 128;  // a swizzled row of Q and K (128-byte swizzle)
  static constexpr int kVChunks = kChunks;
  static constexpr int kVChunkBytes = kKVChunkBytes;
  static constexpr int kQkSteps = kHeadDim / 16;
  static constexpr int kPSteps = kBlockN / 16;
};

// The float8_e4m3fn forward (docs/fp8.md, "The sm90 fp8 forward"): q, k, v one byte per element,
// so a 128-byte swizzled row holds 128 columns (a chunk is 128 columns of Q or K) and a wgmma
// k-step (k32) 32 columns, still 32 bytes. At d64 a row of Q or K is 64 bytes: TMA and wgmma
// use the 64-byte swizzle there (8-row atoms of 512 bytes, two k-steps per row). V reaches the
// kernel transposed (fp8_vt.h: V^T [batch, h_kv, d, keys], keys contiguous, as the K-major B
// operand of P V needs) in boxes of kVtBoxKeys keys: d rows of 128 bytes (128-byte swizzle), or
// of 64 for key blocks that are not a multiple of 128 (64-byte rows and swizzle, as Q and K at
// d64). P is one byte per key: four registers per 32 keys. Eager rescaling only: P is scaled by
// 2^8 into e4m3's range (RowState's offset), and a lazy max that lags by up to 2^8 more would
// take P past 448.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_ = 2, int kVtBoxKeys_ = 128>
struct Fp8TileConfig : TileConfig<kHeadDim_, kBlockM_, kBlockN_, kStages_> {
  using Base = TileConfig<kHeadDim_, kBlockM_, kBlockN_, kStages_>;
  static constexpr bool kFp8 = true;
  static constexpr bool kPagedCpAsync = false;  // paged K/V is refused (plan.cc sm90_fp8_lacks)
  // Two consumer warpgroups take 240 registers (128 x 32 + 256 x 240 = 65536, the whole file):
  // at d256 they hold O 128 + S 64 + P 32, and at 232 ptxas serialized the wgmmas (C7512); with
  // FlashAttention-3's 24 for the producer, its tile loop spilled (48 bytes).
  //
  // The budgets must fit the registers the CTA is launched with: __launch_bounds__(kThreads, 1)
  // caps ptxas at 65536 / kThreads rounded down to 8 per thread (168 at 384 threads: 64512), and
  // setmaxnreg.inc waits for registers the CTA's pool does not hold forever. 128 x 32 + 256 x 240
  // = 65536 > 64512 hung every two-consumer fp8 tile (d128, d256) on the H200 (docs/fp8.md):
  // the producer takes FlashAttention-3's 24 (128 x 24 + 256 x 240 = 64512), its 48-byte spill
  // in the tile loop accepted.
  static constexpr int kProducerRegs = Base::kConsumers == 2 ? 24 : Base::kProducerRegs;
  static constexpr int kConsumerRegs = Base::kConsumers == 2 ? 240 : Base::kConsumerRegs;
  static constexpr int kRowBytes = Base::kHeadDim >= 128 ? 128 : 64;
  static constexpr int kChunkCols = kRowBytes;
  static constexpr int kChunks = Base::kHeadDim / kChunkCols;
  static constexpr int kQChunkBytes = Base::kBlockM * kRowBytes;
  static constexpr int kKVChunkBytes = Base::kBlockN * kRowBytes;
  static constexpr int kQBytes = kQChunkBytes * kChunks;
  static constexpr int kKVBytes = kKVChunkBytes * kChunks;
  static constexpr int kVtBoxKeys = kVtBoxKeys_;
  static constexpr int kVChunks = Base::kBlockN / kVtBoxKeys;
  static constexpr int kVChunkBytes = Base::kHeadDim * kVtBoxKeys;
  static constexpr int kQkSteps = Base::kHeadDim / 32;
  static constexpr int kPSteps = Base::kBlockN / 32;
  static_assert(Base::kHeadDim % 128 == 0 || Base::kHeadDim == 64,
                "fp8 head dims: 64 (one 64-byte row) or whole 128-byte rows (128, 256)");
  static_assert((kVtBoxKeys == 128 || kVtBoxKeys == 64) && Base::kBlockN % kVtBoxKeys == 0,
                "V^T arrives in whole boxes of 128 or 64 keys (128- or 64-byte rows)");
  static_assert(kVChunks * kVChunkBytes == kKVBytes, "V^T's block is K's bytes");
  static_assert(setmaxnreg_fits(kProducerRegs, kConsumerRegs, Base::kConsumers),
                "the setmaxnreg budgets exceed the CTA's registers: setmaxnreg.inc would hang");
};

// The tile each head dim runs (FlashAttention-3's choices, hopper/tile_size.h, as a start):
// - d64: 192 x 128, three consumer warpgroups at 160 registers (S 64 + P 32 + O 32): at d64 a
//   128-row tile's GEMMs are too short to hide the softmax of two warpgroups behind each other
//   (run 32: 0.66-0.94x cuDNN with 128 x 128). Q 24 KB + 2 x (K 16 KB + V 16 KB) = 88 KB.
// - d128 causal: 128 x 128. Causal tiles are balanced by the diagonal: a longer key block
//   wastes more of the masked half.
// - d128 non-causal: 128 x 176 (S 88 + P 44 + O 64 registers): fewer, longer blocks amortise the
//   per-block softmax bookkeeping. Q 32 KB + 2 x (K 44 KB + V 44 KB) = 208 KB of shared memory.
// - d256: 128 x 80 (S 40 + P 20 + O 128 registers): O takes half the registers. Q 64 KB +
//   2 x (K 40 KB + V 40 KB) = 224 KB, just under the 227 KB a block can have. Lazy rescaling:
//   O's 128 registers made the rescale 13% of the consumers' time (sm90_trace); lazily, +2-3%
//   from 2k keys (run 44; d64 and d128, with less O to rescale, measured 1-8% slower).
template <int kHeadDim, bool kCausal>
struct DefaultTile;
template <bool kCausal>
struct DefaultTile<64, kCausal> {
  using type = TileConfig<64, 192, 128>;
};
template <>
struct DefaultTile<128, false> {
  using type = TileConfig<128, 128, 176>;
};
template <>
struct DefaultTile<128, true> {
  using type = TileConfig<128, 128, 128>;
};
template <bool kCausal>
struct DefaultTile<256, kCausal> {
  using type = TileConfig<256, 128, 80, 2, /*kLazyRescale=*/true>;
};

// K/V multicast over a cluster of two CTAs (FlashAttention-3 runs its non-causal 16-bit tiles
// from d128 up this way, ClusterM = 2): the two CTAs take adjacent query tiles of one head, so
// they read the same K/V blocks, and each loads half of every block (alternate 64-column chunks)
// into both CTAs' shared memory. K/V's L2-to-SM traffic halves: at d128 and 4k+ keys it is ~5 TB/s
// at our rate, and under the 700 W limit what the data movement burns the clock pays for
// (sustained_clock.py, session 11). Only where both CTAs of every cluster provably visit the same
// key blocks: unmasked dense calls with an even number of query tiles (launch_template.h's
// multicast_ok); the rest runs the tile alone.
template <class Cfg>
struct Multicast : Cfg {
  static constexpr int kCluster = 2;
  static_assert(Cfg::kChunks % 2 == 0, "each CTA loads half of the column chunks");
};
template <int kHeadDim>
inline constexpr bool kMulticastKV = kHeadDim >= 128;

// The tile boundary of session 18 (docs/kernel-notes.md, "Session 18 (issue 19): the short
// rows"; FLASHSERVE_SM90_EPILOGUE, read once per plan): at 512-1k keys a tile runs 3-8 key
// blocks, and what it costs once (the epilogue's 16-32 KB of O stores per warpgroup, 16% of a
// tile at d128 512 in sm90_trace; the consumers' decoding of the next tile) weighs against them.
// - O goes to a staging buffer and one thread per warpgroup stores it by TMA, so the warpgroup
//   starts the next tile while the store drains (the register stores held it until the LSU took
//   them). The staging is a buffer of its own where it fits beside Q and the K/V ring
//   (fwd_kernel.h's kOwnEpilogueBuffer): d64 and the 128 x 128 d128 tiles. d128 x 176 (208 KB)
//   and d256 (224 KB) have no room: kOInQ stages O in Q's buffer, so the next tile's Q loads only
//   once this tile's O has left it. That measured slower than the register stores (session 19),
//   so the dispatch (fwd_kernel.h EpilogueTile) leaves those two tiles on the register stores;
//   kOInQ is kept for sm90_trace.
// - kAnnounceWork: the producer, which computes each tile's coordinates and lengths anyway, passes
//   them to the consumers with the tile index, and loads a tile's first K block before its Q.
// The arithmetic is the same: outputs are bit-identical with and without (Sm90Epilogue.SameBits*).
// The producer holds a tile's announced work and, for the first K block before Q, Q's
// coordinates into its key loop: at 32 registers its paged loops spilled 4-16 more bytes
// (ptxas); two-consumer tiles give it 40 (TileConfig::kProducerRegs). Three-consumer tiles (d64
// 192 x 128) have none to spare (128 x 32 + 384 x 160 = 65536): they keep Q first, which
// compiles without spills with the announced work (ptxas; K first spilled 12-20 bytes there).
template <class Cfg, bool kOwnBuffer>
struct OverlappedEpilogue : Cfg {
  static constexpr bool kTmaStoreO = true;
  static constexpr bool kOInQ = !kOwnBuffer;
  static constexpr bool kAnnounceWork = true;
  static constexpr bool kFirstKBeforeQ = Cfg::kConsumers == 2;
};

// Part of the softmax's exponentials on the FMA pipe (FLASHSERVE_SM90_EXP2_FMA, read once per
// plan; docs/kernel-notes.md, "exp2 on the FMA pipe"), FlashAttention-4's way around the MUFU
// unit. Per key block a consumer thread computes kBlockN / 2 exponentials; a warp's MUFU.EX2
// holds its sub-partition's MUFU (4 lanes of the SM's 16) for 8 cycles. At d64 a block's GEMMs
// are short (64 x 128 x 64 per warpgroup, twice), and the three warpgroups' exponentials take as
// long as the tensor work (sm90_trace, run 43: softmax 1538 cycles, the MUFU's 3 x 64 ex2 x 8,
// against 1536 for the GEMMs): the MUFU bounds the tile.
// exp2_poly is 12 instructions (10 on the FP32 pipes, a max and a shift on the integer pipe)
// where the MUFU path issues one, and a sub-partition issues one instruction per cycle: the
// polynomial pays in issue slots what it takes off the MUFU. With ~4.5 other instructions per
// element (the score's FFMA, max, sum, half a conversion, the ex2 itself), a fraction phi on the
// FMA pipe takes 4.5 + 11 phi issue cycles per element and warp against the MUFU's 8 (1 - phi),
// balanced near phi = 0.18. kExp2FmaEvery = 8 (phi = 1/8): 7 cycles instead of 8, with issue
// (5.9) to spare for the mask's selects and the other warps' instructions; 1/4 would be
// issue-bound at 7.25, 1/2 slower than none (9.5).
// 16-bit: only d64. At d128 and d256 the GEMMs per exponential are 2-4x longer (78% tensor at
// d128 in run 43), the MUFU has room, and the issue slots would be a loss. (The d64 A/B, session
// 20: 5-11% slower everywhere; off by default.)
//
// The fp8 tiles (issue 23; docs/kernel-notes.md "exp2 on the FMA pipe for the fp8 forward"; the
// reasoning below was written before the device run, which measured 0.96-1.00x at d128 x 128 and
// d256 and 1.005-1.016x at d128 x 192: ncu put the fp8 tile's XU at 45%, not MUFU-bound, so the
// switch stays off): the e4m3 wgmmas run at twice bf16's rate, so per key block the
// tensor time halves while the exponentials do not. Per SM sub-partition and 128-key block of a
// 128 x 128 tile (two consumer warps there, one per warpgroup; 8192 dense fp8 FLOP per clock per
// SM): tensor 128 x 128 x 2d x 2 / 8192 / 1 = 1024 cycles at d128, 2048 at d256; MUFU 2 warps x
// 64 ex2 x 8 = 1024 cycles: d128 sits on the MUFU as d64 16-bit does, d256 at half of it. Issue
// per element and warp beside the ex2: score FFMA, max, sum (3), P to e4m3 (a
// `cvt.rn.satfinite.e4m3x2.f32` per two elements and a byte merge per four: 0.75) and the eager
// rescale of O (d/2 FMULs per 64 elements: 1 at d128, 2 at d256): a = 5.75 at d128 with the
// ex2. Assumed: the e4m3x2 conversion (F2FP) issues on the ALU pipe, as Nsight Compute's guide
// says the fast FP32-to-FP16 conversions do since Ampere, not on the XU with the MUFU (the docs
// here do not say; unverified). Then, at d128, for a fraction phi of the elements on the FMA pipe:
// MUFU 1024 (1 - phi) against issue 128 (5.75 + 11 phi), balanced at phi = 0.12:
//   phi = 1/8: MUFU 896, issue 912 (both under the tensor's 1024: the tile is GEMM-bound);
//   phi = 1/4: issue 1088, above the MUFU-bound 1024 of none (a loss).
// If the conversion is on the XU (16 per clock per SM, "all other conversions" in the CUDA
// guide's table) the XU holds 1.5 per element: 1536 (1 - phi/1.5) cycles, balanced near
// phi = 1/3; there 1/8 gives 1408 (-8%) and 1/4 1280 (-17%). 1/8 is the share that gains under
// both assumptions (1/4 loses under the first), so kExp2FmaEvery = 8 here too: chunks 7 and 15
// of a 128-key block (16 chunks), 7, 15 and 23 of a 192-key one (24 chunks). d64 fp8 (192 x 128,
// three consumers, 160 registers): MUFU 3 x 64 x 8 = 1536 against tensor 768, issue
// 192 (5.25 + 11 phi): 1/8 gives MUFU 1344, issue 1272. d256: MUFU-bound under neither
// assumption (tensor 2048): the A/B's control, expected ~1.00. The share is one line below.
template <class Cfg>
struct Exp2Fma : Cfg {
  static constexpr int kExp2FmaEvery = 8;
  static_assert(Cfg::kFp8 || Cfg::kHeadDim == 64, "the 16-bit d64 tiles and the fp8 tiles only");
  static_assert(!Cfg::kFp8 || !Cfg::kLazyRescale,
                "fp8 P is 2^8 exp2(x - max) with x <= 8: eager rescaling keeps exp2_poly's "
                "argument at most 8 (and P within e4m3's 448)");
  static_assert(Cfg::kBlockN / 8 % kExp2FmaEvery == 0, "whole groups of chunks per block");
};
constexpr bool exp2_fma_head_dim(int head_dim) {
  return head_dim == 64;
}

// The largest dynamic shared memory a block may have on sm_90.
inline constexpr int kMaxSmemPerBlock = 227 * 1024;

// Up to kShortKeys keys a tile runs few key blocks, and the fixed cost of its start and end
// (first QK^T and softmax, last PV, epilogue) weighs more than the blocks' rate: ShortTile is the
// tile measured fastest there (sm90_sweep, session 10), DefaultTile's elsewhere.
// - d64 causal: 128 x 128 with two consumer warpgroups (runs 38 and 40: +7% and +4% at 512 keys,
//   +9% and +6% at 1k; -4..-15% from 2k, where the three warpgroups' longer tiles win), with
//   three K/V stages (session 38, H100, sm90_sweep in two calls: +1.9% and +4.1% at 512 keys,
//   +1.7% and +2.8% at 1k against two stages; presumably the third stage's 32 KB keeps a load
//   more in flight across the short tiles' boundaries; 128 KB in all with O's staging).
// - d128 non-causal: 128 x 128 (+2% and +3% at 512, equal at 1k; 176-key blocks win from 4k).
// Elsewhere the alternatives were within the sweep's spread (+-3%) of the default or slower.
inline constexpr int kShortKeys = 1024;
constexpr bool short_keys(int64_t max_kv_len) {
  return max_kv_len <= kShortKeys;
}
template <int kHeadDim, bool kCausal>
struct ShortTile : DefaultTile<kHeadDim, kCausal> {};
template <>
struct ShortTile<64, true> {
  using type = TileConfig<64, 128, 128, 3>;
};
template <>
struct ShortTile<128, false> {
  using type = TileConfig<128, 128, 128>;
};

// The query rows and keys of the tile a call runs (the launch's choice, launch_template.h's
// run_fwd_hdim), for the plan and its summary; {0, 0} for a head dim without tiles.
struct TileShape {
  int block_m, block_n;
};
template <class Tile>
constexpr TileShape shape_of() {
  return {Tile::type::kBlockM, Tile::type::kBlockN};
}
template <int kHeadDim>
constexpr TileShape tile_shape_of(bool masked, bool short_tile) {
  if (short_tile)
    return masked ? shape_of<ShortTile<kHeadDim, true>>() : shape_of<ShortTile<kHeadDim, false>>();
  return masked ? shape_of<DefaultTile<kHeadDim, true>>()
                : shape_of<DefaultTile<kHeadDim, false>>();
}
constexpr TileShape tile_shape(int head_dim, bool masked, int64_t max_kv_len) {
  const bool short_tile = short_keys(max_kv_len);
  switch (head_dim) {
    case 64:
      return tile_shape_of<64>(masked, short_tile);
    case 128:
      return tile_shape_of<128>(masked, short_tile);
    case 256:
      return tile_shape_of<256>(masked, short_tile);
    default:
      return {0, 0};
  }
}

// The fp8 tiles (FlashAttention-3's, hopper/tile_size.h: d64 192 x 160, d128 128 x 224, d256
// 128 x 128, as the start), causal or not, until measured:
// - d128 and d256: 128 x 128, one V^T box of 128 keys per block. Registers per consumer thread:
//   S 64 + P 32 + O 64 (d128) or 128 (d256). Shared memory: Q 16 KB + 2 x (K 16 KB + V^T 16 KB)
//   = 80 KB at d128, 160 KB at d256.
// - d128 from kFp8LongKeys keys (masked: above them; fp8_block_n below; FLASHSERVE_FP8_BLOCK_N=128
//   or 192 forces either): 128 x 192, V^T in three boxes of 64 keys; S 96 + P 48 + O 64 registers;
//   Q 16 KB + 2 x (K 24 KB + V^T 24 KB) = 112 KB. Fewer, longer blocks amortise the per-block
//   softmax bookkeeping (FA3's reason for 224).
// - d64: 192 x 128, three consumer warpgroups at 160 registers (S 64 + P 32 + O 32), as the bf16
//   d64 tile and for its reason (a 64-row d64 GEMM is too short to hide two warpgroups' softmax).
//   Q 12 KB + 2 x (K 8 KB + V^T 8 KB) = 44 KB.
template <int kHeadDim, int kBlockN>
struct Fp8Tile {
  static_assert(kBlockN == 128, "the other head dims have 128-key blocks only");
  using type = Fp8TileConfig<kHeadDim, 128, 128>;
};
template <>
struct Fp8Tile<128, 192> {
  using type = Fp8TileConfig<128, 128, 192, 2, 64>;
};
template <int kBlockN>
struct Fp8Tile<64, kBlockN> {
  static_assert(kBlockN == 128, "d64 has 128-key blocks only");
  using type = Fp8TileConfig<64, 192, 128>;
};
constexpr bool fp8_head_dim(int head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}
// The fp8 head dims with Exp2Fma tiles (FLASHSERVE_SM90_EXP2_FMA; fwd_fp8_exp2_fma.cu): all.
constexpr bool fp8_exp2_fma_head_dim(int head_dim) {
  return fp8_head_dim(head_dim);
}
// The key block a call at head_dim runs: `requested` 128 or 192 (FLASHSERVE_FP8_BLOCK_N), or 0
// for the plan's choice by the call's longest key range and its mask; 192 at d128 only: from
// kFp8LongKeys keys unmasked, above them masked. On an H100 (session 39, bench_sm90 --fp8 at
// d128, 16k tokens, two rounds of each alternated in one call): before the overlapped epilogue
// 192 against 128 was +4..+8% from 8k keys, equal at 4k and -3..-8% at 512-2k; with it (call 7)
// unmasked +0.5% at 2k, +1.4..+2.8% at 4k, +5.6..+5.8% at 8k, causal -2.4..-2.9% at 2k, +0..+0.7%
// at 4k, +1.8..+3.1% at 8k (the longer block's masked and unused keys, and fewer blocks to
// pipeline, weigh more on short rows).
inline constexpr int64_t kFp8LongKeys = 4096;
constexpr int fp8_block_n(int head_dim, int requested, int64_t max_kv_len = 0,
                          bool masked = false) {
  const bool long_keys = masked ? max_kv_len > kFp8LongKeys : max_kv_len >= kFp8LongKeys;
  const int wanted = requested != 0 ? requested : long_keys ? 192 : 128;
  return head_dim == 128 && wanted == 192 ? 192 : 128;
}
constexpr TileShape fp8_tile_shape(int head_dim, int requested_block_n, int64_t max_kv_len,
                                   bool masked) {
  return head_dim == 64 ? TileShape{192, 128}
         : fp8_head_dim(head_dim)
             ? TileShape{128, fp8_block_n(head_dim, requested_block_n, max_kv_len, masked)}
             : TileShape{0, 0};
}
// The fp8 P operand (fwd_mainloop.h to_e4m3_operand): byte i = 4 r + e of a 32-key k-step's four
// A registers (register r, byte e) is element fp8_p_element(i) of the step's 16 accumulator
// elements (sc[16 j + ...]: the thread's pairs of columns of groups 4 j .. 4 j + 3, row half
// (element / 2) % 2): register r takes row half r % 2 of groups 4 j + 2 (r / 2) and the next.
constexpr int fp8_p_element(int i) {
  const int r = i / 4, e = i % 4;
  return 8 * (r / 2) + 2 * (r % 2) + 4 * (e / 2) + e % 2;
}
// The key (0..31, within its group of 32) that V^T holds at column a of the group (fp8_vt.h):
// the 8-bit A fragment's column a = 16 v2 + 4 q + v0 (register v1 + 2 v2, byte v0 of thread q of
// a quad; PTX ISA / CUTLASS ALayout_64x32) carries, packed by fp8_p_element, the accumulator's
// column 16 v2 + 8 (v0 / 2) + 2 q + v0 % 2. tests/attention/plan_test.cc (PlanFp8.PFragment...)
// checks the two against each other.
constexpr int fp8_vt_key(int a) {
  return 16 * (a / 16) + 8 * ((a % 4) / 2) + 2 * ((a % 16) / 4) + a % 2;
}

// V^T's keys per sequence: max_kv_len rounded up to whole boxes (fp8_vt.h).
inline constexpr int kFp8VtKeys = 128;
constexpr int64_t fp8_vt_keys(int64_t max_kv_len) {
  return (max_kv_len + kFp8VtKeys - 1) / kFp8VtKeys * kFp8VtKeys;
}
// Whether the pre-pass's CTA for the 128 keys from key0 (a multiple of 128) writes them, for a
// sequence of kv_len keys read by a kernel of block_keys-key blocks: every key block the kernel
// reads (up to kv_len rounded up to block_keys) is written, as whole 128-key pieces (so up to
// that rounded up to 128 again: zeros past kv_len), the rest of the slab left alone.
constexpr bool fp8_vt_writes(int64_t key0, int64_t kv_len, int block_keys) {
  return key0 < (kv_len + block_keys - 1) / block_keys * block_keys;
}

// ---------------------------------------------------------------------------------------------
// The backward (bwd_kernel.h): one CTA per block of kBlockN keys of one KV head of one sequence,
// walking blocks of kBlockM queries. Two consumer warpgroups of 64 keys each compute S^T = K Q^T
// and dP^T = V dO^T (64 keys x kBlockM queries), dV += P^T dO and dK += dS^T Q (64 keys x d, in
// registers for the whole CTA), and between them dQ = dS K (kBlockM x d): a 64 x 64 product per
// warpgroup, by rows of dQ when kBlockM = 128, by columns when kBlockM = 64 and d = 128.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_ = 2>
struct BwdTileConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // queries per step (N of S^T and dP^T)
  static constexpr int kBlockN = kBlockN_;  // keys per CTA (M: 64 per consumer warpgroup)
  static constexpr int kStages = kStages_;  // Q, dO, LSE and D buffers
  static constexpr int kConsumers = kBlockN / 64;
  static constexpr int kWarpgroups = 1 + kConsumers;
  static constexpr int kThreads = kWarpgroups * 128;
  static constexpr int kChunkCols = 64;
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kQChunkBytes = kBlockM * kChunkCols * 2;  // Q and dO
  static constexpr int kKVChunkBytes = kBlockN * kChunkCols * 2;
  static constexpr int kQBytes = kQChunkBytes * kChunks;
  static constexpr int kKVBytes = kKVChunkBytes * kChunks;
  // dS^T in shared memory as [key][query], 64 queries (128 bytes) per row and chunk.
  static constexpr int kDsChunks = kBlockM / 64;
  static constexpr int kDsChunkBytes = kBlockN * 128;
  // dQ = dS K per warpgroup: 64 rows x kDqCols columns, rows 64 w (kBlockM = 128) or columns
  // 64 w (kBlockM = 64) for consumer w.
  static constexpr bool kDqByRows = kBlockM == 128;
  static constexpr int kDqCols = kDqByRows ? kHeadDim : kHeadDim / 2;
  // Consumer w's share starts at query dq_row0(w) of the step and column dq_col0(w).
  static constexpr int dq_row0(int w) { return kDqByRows ? 64 * w : 0; }
  static constexpr int dq_col0(int w) { return kDqByRows ? 0 : 64 * w; }
  // The dQ path by bulk reduce-add (bwd_kernel.h, FLASHSERVE_SM90_BWD_DQ_BULK): each warpgroup's
  // 64 x kDqCols fp32 share staged in shared memory as boxes of 32 columns (128 bytes, TMA's
  // 128-byte swizzle span for 4-byte elements) x 64 rows, one reduce-add per box.
  static constexpr int kDqBoxCols = 32;
  static constexpr int kDqBoxes = kDqCols / kDqBoxCols;
  static constexpr int kDqBoxBytes = 64 * kDqBoxCols * 4;
  // setmaxnreg (FlashAttention-3's for two consumers): 128 x 24 + 256 x 240 = 64512, what the
  // launch gives 384 threads at one CTA per SM (168 each).
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  // The step's order (bwd_kernel.h): each GEMM waited for before the next is issued, or
  // FlashAttention-3's (BwdOverlapTile below).
  static constexpr bool kOverlap = false;
  // Whether the CTAs take their key blocks from a 1-D grid in the heaviest-first order of
  // attention/kernel/tile_order.h instead of the (key block, KV head, sequence) grid
  // (BwdHeavyFirstTile below).
  static constexpr bool kHeavyFirst = false;
  // Whether the grid is persistent: one CTA per multiprocessor, each looping over the tiles
  // (BwdPersistentTile below).
  static constexpr bool kPersistent = false;
  static_assert(kConsumers == 2, "two consumer warpgroups of 64 keys");
  static_assert(setmaxnreg_fits(kProducerRegs, kConsumerRegs, kConsumers),
                "the setmaxnreg budgets exceed the CTA's registers: setmaxnreg.inc would hang");
  static_assert(kHeadDim % kChunkCols == 0 && kBlockM % 64 == 0, "whole 64-column chunks");
  static_assert(kDqCols == 64 && (kDqByRows ? kBlockM == 128 : kBlockM == 64),
                "dQ = dS K is one m64n64 product per warpgroup (wgmma_ops.h mma_ss_tt)");
};

// A backward tile whose step runs in FlashAttention-3's order (FLASHSERVE_SM90_BWD_OVERLAP, the
// bulk-dQ kernel only): dV issued as soon as P^T is packed, under dS^T's packing, stores and the
// consumers' barrier; dK issued after dQ, under the dQ tile's stores. A type of its own rather
// than a template argument, so that the kernels without it keep their names and code
// (scripts/kernel-identity.py compares kernels by name).
template <class Cfg>
struct BwdOverlapTile : Cfg {
  static constexpr bool kOverlap = true;
};

// A backward tile launched heaviest key blocks first (FLASHSERVE_SM90_BWD_HEAVY_FIRST, masked
// calls of the bulk-dQ kernel only): CTA b computes entry b of kernel::tile_of's order (sections of
// (KV head, sequence) units, each unit's heaviest key block first). The same CTAs in another
// launch order; a type of its own for the same reason as BwdOverlapTile, and composable with it
// (BwdOverlapTile<BwdHeavyFirstTile<Cfg>>).
template <class Cfg>
struct BwdHeavyFirstTile : Cfg {
  static constexpr bool kHeavyFirst = true;
};

// A backward tile on a persistent grid (FLASHSERVE_SM90_BWD_PERSISTENT, the bulk-dQ kernel only):
// min(tiles, multiprocessors) CTAs, each taking the next tile of one 1-D order from a counter
// (unmasked: the 3-D grid's, key block fastest; masked: BwdPersistentTile<BwdHeavyFirstTile<Cfg>>,
// tile_order.h's heaviest first), so that a tile's first K/V wait and its dK/dV stores run under
// the neighbouring tiles' loads and steps instead of each CTA paying them alone. The Q/dO ring, its
// phases and the dQ hand-off continue from tile to tile; K and V get a kv_empty barrier
// (bwd_kernel.h). A type of its own for the same reason as BwdOverlapTile, composable with both.
template <class Cfg>
struct BwdPersistentTile : Cfg {
  static constexpr bool kPersistent = true;
};

// The d256 backward's tile (bwd_swapped_kernel.h; docs/kernel-notes.md, session 29): kBlockM
// queries a step x kBlockN keys a CTA with dV and dK computed "swapped" (FlashAttention-3's
// dKV_swapAB: dV^T = dO^T P and dK^T = Q^T dS with M = the head dim), because the unswapped
// kernel's dK and dV of 64 keys a warpgroup would be 64 x 256 x 2 fp32 = 256 registers a thread.
// Consumer warpgroup w owns head-dim rows 128 w .. 128 w + 127 of dV^T and dK^T (2 x 2 m64n64
// accumulators: 128 registers), queries 32 w .. 32 w + 31 of S^T = K Q^T and dP^T (m64n32: 16
// each), and columns 128 w .. 128 w + 127 of dQ = dS K (m64n128: 64); peak ~200 of 240. P^T and
// dS^T go through shared memory ([key][query], one 64 x 64 chunk each), where both warpgroups
// read them. Shared memory: K, V 32 KB each, Q and dO 2 stages x 32 KB each, P^T and dS^T 8 KB
// each: 208 KB, + LSE, D and the barriers; the dQ tile (64 x 256 fp32, 64 KB) has no room of its
// own and is staged in the step's own Q and dO stage once both warpgroups are done reading it
// (warpgroup 0 in Q, 1 in dO), the stage freed by the dQ writer after its reduce-adds read it.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_ = 2>
struct BwdSwappedTileConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // queries per step
  static constexpr int kBlockN = kBlockN_;  // keys per CTA
  static constexpr int kStages = kStages_;  // Q, dO, LSE and D buffers
  static constexpr int kConsumers = 2;
  static constexpr int kWarpgroups = 1 + kConsumers;
  static constexpr int kThreads = kWarpgroups * 128;
  static constexpr int kChunkCols = 64;
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kQChunkBytes = kBlockM * kChunkCols * 2;  // Q and dO
  static constexpr int kKVChunkBytes = kBlockN * kChunkCols * 2;
  static constexpr int kQBytes = kQChunkBytes * kChunks;
  static constexpr int kKVBytes = kKVChunkBytes * kChunks;
  // S^T and dP^T: each warpgroup's share of the step's queries (the N of m64nN).
  static constexpr int kSQueries = kBlockM / kConsumers;
  // dV^T and dK^T: each warpgroup's head-dim rows, as m64 tiles.
  static constexpr int kGradRows = kHeadDim / kConsumers;
  static constexpr int kGradTiles = kGradRows / 64;
  // P^T and dS^T as [key][query]: kBlockN rows of 128 bytes (64 queries).
  static constexpr int kKQBytes = kBlockN * 128;
  // dQ = dS K per warpgroup: the step's kBlockM queries x kDqCols columns from dq_col0(w), staged
  // for the bulk reduce-add as boxes of 32 fp32 columns x 64 rows (store_dq_tile's layout).
  static constexpr int kDqCols = kHeadDim / kConsumers;
  static constexpr int dq_col0(int w) { return kDqCols * w; }
  static constexpr int kDqBoxCols = 32;
  static constexpr int kDqBoxes = kDqCols / kDqBoxCols;
  static constexpr int kDqBoxBytes = 64 * kDqBoxCols * 4;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  // What bwd_produce reads of a tile config: one tile per CTA.
  static constexpr bool kPersistent = false;
  static_assert(kHeadDim == 256 && kBlockM == 64 && kBlockN == 64,
                "the d256 step as written: m64n32 S^T halves, one 64 x 64 P^T chunk, m64n128 dQ");
  static_assert(kDqBoxes * kDqBoxBytes == kQBytes,
                "a warpgroup's dQ tile fills one stage's Q (or dO) exactly");
  static_assert(setmaxnreg_fits(kProducerRegs, kConsumerRegs, kConsumers),
                "the setmaxnreg budgets exceed the CTA's registers: setmaxnreg.inc would hang");
};

// The backward's tiles (FlashAttention-3's choices for two MMA warpgroups, hopper/
// flash_bwd_launch_template.h, as the start, except d128 non-causal, where FA3 takes 80 x 128;
// not yet measured here):
// - d64: 128 queries x 128 keys. Registers per consumer thread: S^T and dP^T 64 each, dV and
//   dK 32 each (192 at the peak). Shared memory: K, V 16 KB each, Q and dO 2 x 16 KB each,
//   dS^T 2 x 32 KB: 160 KB.
// - d128: 64 queries x 128 keys. S^T and dP^T 32 each, dV and dK 64 each (192). K, V 32 KB
//   each, Q and dO 2 x 16 KB each, dS^T 2 x 16 KB: 160 KB.
template <int kHeadDim>
struct DefaultBwdTile;
template <>
struct DefaultBwdTile<64> {
  using type = BwdTileConfig<64, 128, 128>;
};
template <>
struct DefaultBwdTile<128> {
  using type = BwdTileConfig<128, 64, 128>;
};
// - d256: 64 queries x 64 keys, the swapped products (BwdSwappedTileConfig above).
template <>
struct DefaultBwdTile<256> {
  using type = BwdSwappedTileConfig<256, 64, 64>;
};

}  // namespace flashserve::attention::sm90
