// Which tiles a CTA of the sm90 forward kernel (fwd_kernel.h) computes, in which order, and how
// its producer tells its consumers: FwdTileScheduler, with what a tile is (cta_tile, TileWork).
// - The grid's tiles are the entries of FwdParams::order (kernel/tile_order.h: heaviest first,
//   in L2-sized sections of heads). The launch (launch_template.h) starts one CTA (cluster) per
//   multiprocessor (pair of them), or one per tile where there are fewer tiles; the CTAs are
//   persistent and walk the order, by a fixed stride when the tiles are equal (no mask), else
//   (causal) each taking the next free entry from a counter (FwdParams::tile_counter). One walk
//   serves one CTA per tile too: a CTA's first entry is its index, and the next one is past the
//   last.
// - The producer walks the order and announces each tile it starts (past the last one,
//   num_tiles) through a ring of two slots in shared memory (SharedStorage::tile); the
//   consumers follow the announcements, so both sides agree on every tile without a second
//   counter, and with kAnnounceWork (TileSlot) the consumers skip the order's divisions and the
//   lengths' loads.
// - With multicast (TileConfig::kCluster 2) the entries are pairs of adjacent query tiles, one
//   pair per cluster, each CTA taking one of the two (cta_tile).
#pragma once

#include <cstdint>

#include "attention/kernel/block_mask.h"
#include "attention/kernel/seqlen.h"
#include "attention/kernel/tile_order.h"
#include "fwd_params.h"
#include "fwd_sync.h"

namespace flashserve::attention::sm90 {

// The kernel's shared memory (fwd_kernel.h): the announcement ring, and the kv_cp_async
// producers' next tile.
template <class Cfg>
struct SharedStorage;

// A tile as the producer announces it with kAnnounceWork: its index in the grid's order (past
// the last, num_tiles), its coordinates and its sequence's lengths (q_len 0 where the launch
// does not take the sequence, TileWork), which the consumers would otherwise derive again at the
// tile's start (the order's divisions; with varlen or seqused_k, loads of the lengths).
struct TileSlot {
  int32_t t;
  kernel::TileCoords coords;
  kernel::SeqLens seq;
};

// The sequence a tile's grid coordinate z stands for: the launch's range starts at seq_begin.
__device__ __forceinline__ int seq_of(const FwdParams& p, const kernel::TileCoords& tile) {
  return p.seq_begin + tile.z;
}

__device__ __forceinline__ kernel::SeqLens seq_lens_of(const FwdParams& p, int b) {
  return kernel::seq_lens(p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k, p.seqlen_q, p.seqlen_k, b);
}

// The tile this CTA computes for entry t of the grid's order: with multicast, entries are pairs of
// adjacent query tiles (the order's m_blocks counts pairs) and the CTA of rank r takes tile
// 2 m + r of pair m, so the two CTAs of a cluster share the head, the sequence and the key blocks.
template <class Cfg>
__device__ __forceinline__ kernel::TileCoords cta_tile(const FwdParams& p, int t) {
  kernel::TileCoords tile = kernel::tile_of(p.order, t);
  if constexpr (Cfg::kCluster > 1) tile.m_block = tile.m_block * Cfg::kCluster + cta_rank<Cfg>();
  return tile;
}

// A tile's sequence and the key blocks its rows visit; producer and consumers derive both from
// the same tile index, so they agree on every load. `valid`: the tile has rows (a varlen
// sequence shorter than the longest has fewer query tiles than the grid) and its sequence is of
// the kind the launch takes (FwdParams::only).
template <class Cfg, bool kMasked>
struct TileWork {
  int b;  // the sequence
  kernel::SeqLens seq;
  int m0;  // the tile's first query row within its sequence
  kernel::KeyBlocks<Cfg::kBlockM, Cfg::kBlockN, kMasked> blocks;

  __device__ __forceinline__ TileWork(const FwdParams& p, const kernel::TileCoords& tile)
      : b(seq_of(p, tile)),
        seq(seq_lens_of(p, b)),
        m0(tile.m_block * Cfg::kBlockM),
        blocks(m0, seq.q_len, seq.kv_len, p.window_left, p.window_right) {
    if (!kernel::takes_seq(p.only, seq.q_len)) seq.q_len = 0;
  }
  // From the lengths the producer announced (TileSlot: q_len already 0 where the sequence is not
  // taken, and then the blocks are never used).
  __device__ __forceinline__ TileWork(const FwdParams& p, const kernel::TileCoords& tile,
                                      const kernel::SeqLens& announced)
      : b(seq_of(p, tile)),
        seq(announced),
        m0(tile.m_block * Cfg::kBlockM),
        blocks(m0, seq.q_len, seq.kv_len, p.window_left, p.window_right) {}

  __device__ __forceinline__ bool valid() const { return m0 < seq.q_len; }
  // The TMA coordinates of row 0 of the sequence: dense tensors by sequence, varlen ones by row.
  __device__ __forceinline__ int q_z(const FwdParams& p) const {
    return p.cu_seqlens_q != nullptr ? 0 : b;
  }
  __device__ __forceinline__ int kv_z(const FwdParams& p) const {
    return p.cu_seqlens_k != nullptr ? 0 : b;
  }
};

// The order of a CTA's tiles and their announcement (see the top of this file). The producer
// holds one (the fixed stride) and walks first_tile, next_tile until done, announcing each entry
// and the first past the last; the consumers receive the announcements until done.
template <class Cfg, bool kMasked>
class FwdTileScheduler {
 public:
  using Work = TileWork<Cfg, kMasked>;

  __device__ __forceinline__ FwdTileScheduler() : stride_(gridDim.x / Cfg::kCluster) {}

  // The producer's side. This CTA's (cluster's) first entry of the order.
  __device__ __forceinline__ int first_tile() const { return blockIdx.x / Cfg::kCluster; }

  // The entry after t: a fixed stride, or the counter's next (the first gridDim.x entries are
  // the CTAs' first ones). With kCp (all 128 producer threads walk the tiles) thread 0 takes it
  // from the counter and hands it to the others through shared memory between two
  // producers_sync.
  template <bool kCp>
  __device__ __forceinline__ int next_tile(SharedStorage<Cfg>& s, const FwdParams& p, int t,
                                           int tid) const {
    if (p.tile_counter == nullptr) {
      return t + stride_;
    } else if constexpr (!kCp) {
      return gridDim.x + atomicAdd(p.tile_counter, 1);
    } else {
      if (tid == 0) s.producer_tile = gridDim.x + atomicAdd(p.tile_counter, 1);
      producers_sync();
      const int next = s.producer_tile;
      producers_sync();  // every thread has read it before thread 0 writes the next
      return next;
    }
  }

  // Whether entry t is past the order's last: the walk ends (the producer announces it first).
  static __device__ __forceinline__ bool done(const FwdParams& p, int t) {
    return t >= p.num_tiles;
  }

  // The tile of entry t for this CTA.
  static __device__ __forceinline__ kernel::TileCoords coords(const FwdParams& p, int t) {
    return cta_tile<Cfg>(p, t);
  }

  // Thread 0 (`tid`) puts the announcement of the k-th tile in slot k % 2 once the consumers
  // have read what the slot held two tiles before: the entry (int32_t) or with kAnnounceWork its
  // TileSlot.
  template <class Slot>
  static __device__ __forceinline__ void announce(SharedStorage<Cfg>& s, int k, const Slot& slot,
                                                  int tid) {
    if (tid == 0) {
      s.tile_empty[k % 2].wait(((k / 2) & 1) ^ 1);
      s.tile[k % 2] = slot;
      s.tile_full[k % 2].arrive();
    }
  }

  // The consumers' side: the k-th announcement, read by every consumer thread before its own
  // arrival on the slot's tile_empty (coordinates and lengths only with kAnnounceWork).
  static __device__ __forceinline__ TileSlot receive(SharedStorage<Cfg>& s, int k) {
    s.tile_full[k % 2].wait((k / 2) & 1);
    // Every thread reads the slot before its own arrival; lane 0's value, broadcast, lets ptxas
    // see that what follows from it is warp-uniform (a branch it cannot prove uniform between a
    // wgmma's issue and its wait serializes the wgmmas: C7520).
    const auto uniform = [](int v) { return __shfl_sync(0xffffffffu, v, 0); };
    TileSlot got{};
    if constexpr (Cfg::kAnnounceWork) {
      const TileSlot& slot = s.tile[k % 2];
      got.t = uniform(slot.t);
      got.coords = {uniform(slot.coords.m_block), uniform(slot.coords.head),
                    uniform(slot.coords.z)};
      got.seq = {uniform(slot.seq.q_start), uniform(slot.seq.q_len), uniform(slot.seq.k_start),
                 uniform(slot.seq.kv_len)};
    } else {
      got.t = uniform(s.tile[k % 2]);
    }
    s.tile_empty[k % 2].arrive();
    return got;
  }

  // The tile of a received announcement and its work: as announced with kAnnounceWork, else
  // derived from its entry as the producer derived them.
  static __device__ __forceinline__ kernel::TileCoords coords(const FwdParams& p,
                                                              const TileSlot& got) {
    if constexpr (Cfg::kAnnounceWork)
      return got.coords;
    else
      return cta_tile<Cfg>(p, got.t);
  }
  static __device__ __forceinline__ Work work(const FwdParams& p, const kernel::TileCoords& tile,
                                              const TileSlot& got) {
    if constexpr (Cfg::kAnnounceWork)
      return Work(p, tile, got.seq);
    else
      return Work(p, tile);
  }

 private:
  int stride_;  // the fixed stride: the grid's clusters (CTAs without multicast)
};

}  // namespace flashserve::attention::sm90
