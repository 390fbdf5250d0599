// The sm90 (Hopper, sm_90a) forward kernel: query tiles of 64 rows per consumer warpgroup
// (FlashAttention-3's mainloop, written from the PTX ISA).
// - Warpgroup 0, the producer, gives registers back (setmaxnreg.dec); one thread picks the tiles
//   and issues the TMA copies: per tile Q once, then K and V blocks through a ring of kStages,
//   K one block ahead of V (the order the consumers use them in). K/V in pages shorter than a
//   key block are copied by all 128 producer threads with cp.async instead (copy_kv, up to d128).
// - Warpgroups 1.. (two or three), the consumers, own 64 query rows each. Per key block j they
//   compute S = Q K^T (wgmma, both operands in shared memory), the online softmax on the
//   accumulator fragment, and O += P V (wgmma, P from registers). Two overlaps keep the tensor
//   cores busy: within a warpgroup, QK^T of block j is issued together with PV of block j - 1 and
//   the softmax of j runs while PV(j - 1) is still in flight; between the warpgroups, the
//   WarpScheduler makes them take turns issuing, so one's softmax runs under the others' GEMMs.
// - Key blocks go from the last to the first: the blocks that need a mask on their high side (the
//   causal diagonal or a window's right edge, the ragged end of the keys) come first, then the
//   mask-free path, then (a sliding window's left edge) masked blocks again.
// - Sequences: dense, varlen (cu_seqlens) or seqused_k (kernel/seqlen.h), K/V dense or paged
//   (a key block as boxes within pages, load_kv); query tiles past a shorter sequence's rows have
//   no work; the visited key blocks follow the mask (kernel/block_mask.h, as the sm80 kernels').
// - Barriers per stage: k_full / v_full (TMA bytes landed), k_empty / v_empty (one arrival per
//   consumer warp once its warpgroup's GEMM that read the buffer has completed): K is released
//   after QK^T, V after PV, so the producer refills K while PV still reads V.
// - Persistent: one CTA per multiprocessor walks its tiles (FwdParams::order, heaviest first in
//   L2-sized sections of heads; a fixed stride, or causal the next free tile from a counter); the
//   producer runs ahead into the next tile (Q is released after a tile's last QK^T, K and V block
//   by block), so its loads overlap this tile's last GEMMs and epilogue.
// - Multicast (TileConfig::kCluster 2, tile_config.h's Multicast): clusters of two CTAs take pairs
//   of adjacent query tiles of one head; each producer loads half of every K/V block into both
//   CTAs (load_kv), and every consumer warp releases a stage on both CTAs' barriers (release_kv).
//
// - Session 18's tile boundary (tile_config.h OverlappedEpilogue, FLASHSERVE_SM90_EPILOGUE): O
//   leaves through shared memory by TMA stores (FwdEpilogue::store), the producer announces each
//   tile's work with its index (TileSlot) and loads a tile's first K block before its Q.
// - Part of the exponentials on the FMA pipe (tile_config.h Exp2Fma, FLASHSERVE_SM90_EXP2_FMA; d64
//   16-bit and fp8 tiles): RowState computes one 8-column chunk in kExp2FmaEvery by exp2_poly.h.
//
// Not yet here (docs/kernel-notes.md, "sm90 next steps"): split-KV.
//
// The kernel's shape is FlashAttention-3's Kernel<Mainloop, Epilogue, TileScheduler>: FwdKernel
// (here) inits the barriers, splits the warpgroups into the producer and the consumers and walks
// the tiles; what happens per tile lives with its role:
// - fwd_tile_scheduler.h FwdTileScheduler: which tiles a CTA takes, in which order, and the
//   producer's announcement of each to the consumers (TileSlot, TileWork);
// - fwd_mainloop.h FwdMainloop: the producer's loads of a tile (load) and a consumer
//   warpgroup's key loop over it (mma: QK^T, softmax, PV);
// - fwd_epilogue.h FwdEpilogue: O and the LSE out (register stores, or staging and TMA stores);
// - fwd_softmax.h (RowState), fwd_sync.h (named barriers, releases, the cluster's barrier).
// This file also holds the shared memory that the roles share (SharedStorage) and which tiles
// have room for O's own staging (EpilogueTile).
#pragma once

#include <cstdint>
#include <type_traits>

#include "attention/kernel/seqlen.h"
#include "attention/kernel/tile_order.h"
#include "fwd_epilogue.h"
#include "fwd_mainloop.h"
#include "fwd_params.h"
#include "fwd_softmax.h"
#include "fwd_sync.h"
#include "fwd_tile_scheduler.h"
#include "mbarrier.h"
#include "tile_config.h"
#include "trace.h"
#include "warp_scheduler.h"

namespace flashserve::attention::sm90 {

// The CTA's shared memory, every role's part in one struct: O's staging (the epilogue's
// OStaging, the base), Q and the K/V ring with their barriers and copy_kv's row offsets (the
// mainloop's), the announcement ring and the copying producers' next tile (the tile
// scheduler's). The members keep the order the kernels were tuned with: moving one moves the
// offsets in every kernel's machine code.
template <class Cfg>
struct SharedStorage : OStaging<Cfg> {
  // Each chunk is a 1024-byte aligned run of 8-row swizzle atoms (wgmma.h).
  alignas(1024) uint8_t q[Cfg::kChunks][Cfg::kQChunkBytes];
  alignas(1024) uint8_t k[Cfg::kStages][Cfg::kChunks][Cfg::kKVChunkBytes];
  // V's blocks as TMA reads them ([keys, d]), or with kFp8 V^T's ([d, keys], fp8_vt.h).
  alignas(1024) uint8_t v[Cfg::kStages][Cfg::kVChunks][Cfg::kVChunkBytes];
  Mbarrier q_full, q_empty;
  // The producer announces each tile it starts (FwdParams::tile_counter) to the consumers
  // through a ring of two slots: tile_full (the producer's arrival) and tile_empty (one arrival
  // per consumer thread once it has read the slot: each thread's own release orders its read
  // before the producer's next write, which racecheck cannot see through a warp's __syncwarp).
  std::conditional_t<Cfg::kAnnounceWork, TileSlot, int32_t> tile[2];
  Mbarrier tile_full[2], tile_empty[2];
  int32_t producer_tile;  // copy_kv's producer threads: the next tile, from thread 0
  // copy_kv's row offsets in the K (0) and V (1) pools (none without kPagedCpAsync: d256's
  // tile has no shared memory to spare).
  int64_t kv_rows[2][Cfg::kPagedCpAsync ? Cfg::kBlockN : 1];
  Mbarrier k_full[Cfg::kStages], v_full[Cfg::kStages];
  Mbarrier k_empty[Cfg::kStages], v_empty[Cfg::kStages];
};

template <class Cfg>
constexpr int smem_bytes() {
  return static_cast<int>(sizeof(SharedStorage<Cfg>)) + 1024;  // + the base's realignment
}

// Whether tile Cfg with session 18's boundary has room for a staging buffer of O's own beside Q
// and the K/V ring: d64 and the 128 x 128 d128 tiles (24 / 16 / 32 KB); d128 x 176 (208 KB) and
// d256 (224 KB) do not.
template <class Cfg>
inline constexpr bool kOwnEpilogueBuffer =
    smem_bytes<OverlappedEpilogue<Cfg, true>>() <= kMaxSmemPerBlock;
static_assert(kOwnEpilogueBuffer<TileConfig<64, 192, 128>> &&
                  kOwnEpilogueBuffer<TileConfig<64, 128, 128, 3>> &&
                  kOwnEpilogueBuffer<TileConfig<128, 128, 128>>,
              "d64 and d128 x 128 have room for O's own staging");
static_assert(!kOwnEpilogueBuffer<TileConfig<128, 128, 176>> &&
                  !kOwnEpilogueBuffer<TileConfig<256, 128, 80, 2, true>>,
              "d128 x 176 and d256 have no room for O's own staging");
// The fp8 tiles' one-byte Q and K/V leave room for the 16-bit O's staging at every head dim
// (d256: Q 32 KB + 2 x (K 32 KB + V^T 32 KB) + O 64 KB = 224 KB).
static_assert(kOwnEpilogueBuffer<Fp8TileConfig<64, 192, 128>> &&
                  kOwnEpilogueBuffer<Fp8TileConfig<128, 128, 128>> &&
                  kOwnEpilogueBuffer<Fp8TileConfig<128, 128, 192, 2, 64>> &&
                  kOwnEpilogueBuffer<Fp8TileConfig<256, 128, 128>>,
              "the fp8 tiles have room for O's own staging");

// Tile Cfg with session 18's boundary (tile_config.h OverlappedEpilogue) where O has a staging
// buffer of its own; elsewhere Cfg as it is. O staged in Q's buffer instead (kOInQ) measured
// slower than the register stores on the H200 (session 19, bench_sm90 --epilogue-ab, 512-2k
// keys: d256 -2..-6%, d128 x 176 -4% at 2k; the next tile's Q waits for this tile's O to leave),
// so those tiles keep the register stores; sm90_trace keeps the staged-in-Q variant to study.
template <class Cfg>
using EpilogueTile =
    std::conditional_t<kOwnEpilogueBuffer<Cfg>, OverlappedEpilogue<Cfg, true>, Cfg>;

// The kernel: Mainloop FwdMainloop<Cfg, kBf16, kMasked>, Epilogue FwdEpilogue<Cfg, kBf16>,
// TileScheduler FwdTileScheduler<Cfg, kMasked>.
template <class Mainloop, class Epilogue, class TileScheduler>
class FwdKernel {
 public:
  using Cfg = typename Mainloop::Cfg;
  using Work = typename Mainloop::Work;
  static_assert(std::is_same_v<typename Epilogue::Cfg, Cfg> &&
                    std::is_same_v<typename TileScheduler::Work, Work>,
                "the mainloop, the epilogue and the tile scheduler are of one tile");

  // The CTA's work: every thread of it runs this once.
  __device__ __forceinline__ void operator()(const FwdParams& p) const {
    constexpr int kStages = Cfg::kStages;
    extern __shared__ uint8_t smem_raw[];
    // Realigned by pointer arithmetic on the __shared__ array, not through an integer, so that the
    // compiler still knows every access through `s` is to shared memory (32-bit ld/st.shared, not
    // generic ones with 64-bit addresses; the backward's kernel, session 26).
    const uint32_t misalign = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) % 1024;
    auto& s = *reinterpret_cast<SharedStorage<Cfg>*>(smem_raw + (1024 - misalign) % 1024);

    // Broadcast from lane 0, so that ptxas knows the role is warp-uniform: a branch on a value it
    // cannot prove uniform between a wgmma's issue and its wait serializes the wgmmas (C7520).
    const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
    const int tid = threadIdx.x % 128;

    if (threadIdx.x == 0) {
      s.q_full.init(1);
      s.q_empty.init(Cfg::kConsumerWarps);
      for (int i = 0; i < 2; ++i) {
        s.tile_full[i].init(1);
        s.tile_empty[i].init(Cfg::kConsumerWarps * 32);
      }
      // A full barrier completes on thread 0's TMA arrival and bytes, or with kv_cp_async on the
      // 128 producer threads' cp.async arrivals.
      const uint32_t fill_arrivals = Cfg::kPagedCpAsync && p.kv_cp_async ? 128 : 1;
#pragma unroll
      for (int st = 0; st < kStages; ++st) {
        s.k_full[st].init(fill_arrivals);
        s.v_full[st].init(fill_arrivals);
        // With multicast the consumer warps of both CTAs release each stage.
        s.k_empty[st].init(Cfg::kConsumerWarps * Cfg::kCluster);
        s.v_empty[st].init(Cfg::kConsumerWarps * Cfg::kCluster);
      }
      Mbarrier::fence_init();
    }
    if constexpr (Cfg::kCluster == 1)
      __syncthreads();
    else
      cluster_sync();  // the other CTA's barriers are ready before this one multicasts or arrives

    // The producer picks the tiles (the next one once it has issued a tile's loads) and announces
    // each, and past the last one num_tiles, to the consumers; both count the same ring slots and
    // Q rounds. Tiles without rows (varlen) or without keys (causal rows before the first key, a
    // window that misses every key) load nothing; those with rows store O = 0, LSE = -inf. The two
    // roles are the two branches of one if/else: ptxas applies each branch's setmaxnreg budget to
    // its register allocation only in that shape.
    if (warpgroup == 0) {
      setmaxnreg_dec<Cfg::kProducerRegs>();
      // Thread 0 alone with TMA; with kv_cp_async all 128 threads (a separate instantiation, so
      // that the TMA producer's registers are not the copy loop's: sharing one loop cost dense
      // d64/d128 tiles 2-4% at 512 keys, session 14).
      if constexpr (Cfg::kPagedCpAsync && Cfg::kCluster == 1) {
        if (p.kv_cp_async)
          produce<true>(s, p, tid);
        else if (tid == 0)
          produce<false>(s, p, tid);
      } else if (tid == 0) {
        produce<false>(s, p, tid);
      }
    } else {
      setmaxnreg_inc<Cfg::kConsumerRegs>();
      consume(s, p, warpgroup - 1, tid);
    }
    // The other CTA's last arrivals on this one's barriers land before its shared memory goes.
    if constexpr (Cfg::kCluster > 1) cluster_sync();
  }

 private:
  // The producer's walk over its CTA's tiles: thread 0 announces each (and, past the last one,
  // num_tiles) to the consumers and loads Q (and K/V by TMA); with kCp all 128 producer threads
  // walk the same tiles, copying K/V, and take the counter's next tile from thread 0 through
  // shared memory (FwdTileScheduler::next_tile). With multicast the grid's entries are the
  // clusters' (cta_tile), walked by both CTAs of a cluster in the same order (no counter:
  // unmasked grids).
  template <bool kCp>
  static __device__ __forceinline__ void produce(SharedStorage<Cfg>& s, const FwdParams& p,
                                                 int tid) {
    Trace<Cfg::kTrace> trace(p.trace, 0, tid == 0);
    const uint32_t rank = cta_rank<Cfg>();
    const TileScheduler scheduler;
    int ring = 0, q_round = 0;
    for (int t = scheduler.first_tile(), k = 0;; ++k) {
      // (Two copies of the same steps rather than one with lambdas: captured by a lambda, ring
      // and q_round changed the register-store kernels' machine code, scripts/kernel-identity.py.)
      if constexpr (Cfg::kAnnounceWork) {
        // The work first, since the announcement carries it (past the last tile, the last
        // tile's: the consumers stop at num_tiles without reading it).
        const kernel::TileCoords tile = TileScheduler::coords(p, min(t, p.num_tiles - 1));
        const Work w(p, tile);
        TileScheduler::announce(s, k, TileSlot{t, tile, w.seq}, tid);
        trace(kProducerTile);
        if (TileScheduler::done(p, t)) break;
        if (w.valid() && w.blocks.count() > 0) {
          Mainloop::template load<kCp>(s, p, tile, w, ring, q_round, tid, rank, trace);
          ring += w.blocks.count();
          ++q_round;
        }
      } else {
        TileScheduler::announce(s, k, int32_t{t}, tid);
        trace(kProducerTile);
        if (TileScheduler::done(p, t)) break;
        const kernel::TileCoords tile = TileScheduler::coords(p, t);
        const Work w(p, tile);
        if (w.valid() && w.blocks.count() > 0) {
          Mainloop::template load<kCp>(s, p, tile, w, ring, q_round, tid, rank, trace);
          ring += w.blocks.count();
          ++q_round;
        }
      }
      t = scheduler.template next_tile<kCp>(s, p, t, tid);
    }
    Mainloop::template load_tail<kCp>();
  }

  // One consumer warpgroup (cw c of the tile's 64-row slices, tid its thread 0..127) over all of
  // its CTA's tiles, as the producer announces them: per tile with keys the mainloop's key loop,
  // then the epilogue; `ring` and `q_round` count as in FwdMainloop::load.
  static __device__ __forceinline__ void consume(SharedStorage<Cfg>& s, const FwdParams& p, int cw,
                                                 int tid) {
    // The turns of the warp scheduler run on from one tile to the next (a warpgroup may start
    // the next tile while the others finish this one).
    WarpScheduler<Cfg::kConsumers> sched(cw);
    Trace<Cfg::kTrace> trace(p.trace, 1 + cw, tid == 0);

    float o[Cfg::kHeadDim / 2];
    RowsOf<Cfg> rows;
    typename Mainloop::Scratch scratch;
    int ring = 0, q_round = 0;
    for (int k = 0;; ++k) {
      const TileSlot got = TileScheduler::receive(s, k);
      trace(kTileRead);
      if (TileScheduler::done(p, got.t)) break;
      const kernel::TileCoords tile = TileScheduler::coords(p, got);
      const Work w = TileScheduler::work(p, tile, got);
      if (!w.valid()) continue;  // no rows: nothing to load or store
      const int n_blocks = w.blocks.count();
      if (n_blocks == 0) {  // no row sees a key: O = 0, LSE = -inf
#pragma unroll
        for (int i = 0; i < Cfg::kHeadDim / 2; ++i) o[i] = 0.0f;
        rows = RowsOf<Cfg>{};
        Epilogue::store(s, p, tile, w.seq, cw, tid, o, rows, /*keyed=*/false, trace);
        continue;
      }
      Mainloop::mma(s, p, tile, w, cw, tid, ring, q_round, sched, o, rows, scratch, trace);
      // The epilogue reads the sequence's first row and length again rather than holding them
      // through the key loop (registers are what the consumers lack; the reads are a few loads).
      Epilogue::store(s, p, tile, seq_lens_of(p, seq_of(p, tile)), cw, tid, o, rows,
                      /*keyed=*/true, trace);
      trace(kEpilogueEnd);
      ring += n_blocks;
      ++q_round;
    }
    sched.finish();
    Epilogue::store_tail(tid);
  }
};

// The entry that launch_template.h launches: one CTA of tile Cfg's kernel.
template <class Cfg, bool kBf16, bool kMasked>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_kernel(const __grid_constant__ FwdParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  FwdKernel<FwdMainloop<Cfg, kBf16, kMasked>, FwdEpilogue<Cfg, kBf16>,
            FwdTileScheduler<Cfg, kMasked>>{}(p);
#endif
}

}  // namespace flashserve::attention::sm90
