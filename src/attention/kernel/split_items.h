// Length-aware split-KV for decode launches (split_policy.h balanced_split): the launch's grid
// holds `items` slots a sequence, and the slots go to the sequences by their key blocks rather
// than `items` to each: sequence b takes items_for(blocks_b, chunk) shares of `chunk` key blocks,
// chunk = chunk_for(the launch's key blocks, sequences x (items - 1), floor), so the CTAs of a
// launch carry about the same keys whatever the spread of its lengths. Item w is the w-th share
// in sequence order; the split kernel finds its (sequence, share) from w, the combine a row's
// first item and count, each by the same warp-wide pass over the launch's lengths (on the device:
// a decode graph replays with the step's own lengths). The partials are by item
// ([items x sequences] rows of h_q slots), so nothing of the layout depends on the lengths.
//
// The arithmetic is host-device (tests/attention/split_items_test.cc checks it against a host
// walk); the warp-wide walks are device code for a whole warp (every lane calls, same arguments).
#pragma once

#include <cstdint>

#include "attention/mask.h"  // FS_HOST_DEVICE

namespace flashserve::attention::kernel {

// Key blocks a share: the launch's blocks over its busy target, no fewer than `floor`. With equal
// lengths n (blocks) the shares are ceil(n / (items - 1)), the unbalanced split's (floor <= that
// by the split choice's construction).
FS_HOST_DEVICE int chunk_for(int64_t total_blocks, int64_t busy, int floor) {
  const int64_t c = busy > 0 ? (total_blocks + busy - 1) / busy : total_blocks;
  return static_cast<int>(c > floor ? c : (floor > 0 ? floor : 1));
}

// Key blocks of kBlockN keys a decode tile visits for a sequence of kv_len keys under a left
// window (-1 unbounded): block_mask.h's KeyBlocks for the one query (its right side masks
// nothing), which the test checks it against.
FS_HOST_DEVICE int decode_key_blocks(int kv_len, int left, int block_n) {
  const int begin = left >= 0 && kv_len - 1 - left > 0 ? kv_len - 1 - left : 0;
  return kv_len <= begin ? 0 : (kv_len + block_n - 1) / block_n - begin / block_n;
}

// Shares of a sequence with `blocks` key blocks (0 for none: its row gets no item).
FS_HOST_DEVICE int items_for(int blocks, int chunk) {
  return (blocks + chunk - 1) / chunk;
}

#ifdef __CUDACC__
// The walks below read each sequence's key blocks through `blocks_of(b)` (0 for a sequence the
// launch does not take), for b in [begin, end): lane l takes the contiguous run
// [begin + l * per, begin + (l + 1) * per), per = ceil((end - begin) / 32), so that a scan of the
// lanes' sums orders the items by sequence. A run's first kCached counts are read once and kept
// in registers (launches of up to 256 sequences read each length once); longer runs read the rest
// again. Meant as one round trip to L2 before a CTA's first K/V load, it is still several: the
// SASS (session 33) keeps branches between the reads (split_key_blocks' early return, the length
// arrays' null checks), and every CTA pays them while the others saturate the memory system —
// kernel-notes "Session 33 (issue 21)", where an item map made once a launch is the next step.
template <class BlocksOf>
struct LaneBlocks {
  static constexpr int kCached = 8;
  const BlocksOf& blocks_of;
  int lo, hi;
  int cached[kCached];

  __device__ __forceinline__ LaneBlocks(int begin, int end, int lane, const BlocksOf& f)
      : blocks_of(f) {
    const int per = (end - begin + 31) / 32;
    lo = min(end, begin + lane * per);
    hi = min(end, lo + per);
    // Every lane reads kCached valid sequences whether its run has them or not (the last one of
    // the range again), so that no branch on the run's end separates the loads: under one, each
    // read was its own round trip to L2, eight in a row (session 33, SASS).
#pragma unroll
    for (int i = 0; i < kCached; ++i) {
      const int n = f(max(begin, min(lo + i, end - 1)));
      cached[i] = lo + i < hi ? n : 0;
    }
  }
  // Key blocks of the run's sequences before `b` (all of them for b >= hi).
  __device__ __forceinline__ int64_t blocks_before(int b) const {
    int64_t n = 0;
#pragma unroll
    for (int i = 0; i < kCached; ++i) n += lo + i < b ? cached[i] : 0;
    for (int s = lo + kCached; s < hi && s < b; ++s) n += blocks_of(s);
    return n;
  }
  // Items of the run's sequences before `b`, in shares of `chunk`.
  __device__ __forceinline__ int items_before(int b, int chunk) const {
    int n = 0;
#pragma unroll
    for (int i = 0; i < kCached; ++i) n += lo + i < b ? items_for(cached[i], chunk) : 0;
    for (int s = lo + kCached; s < hi && s < b; ++s) n += items_for(blocks_of(s), chunk);
    return n;
  }
};

template <class T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

struct ItemOf {
  int b = -1;     // the sequence; -1: the item is past the launch's last share
  int share = 0;  // which of its shares
  int count = 0;  // how many shares the sequence has
  int chunk = 0;  // the launch's chunk
};

// Item w's sequence and share, and the launch's chunk (chunk_for over every sequence's blocks,
// `busy` (sequence, share) pairs wanted, shares of at least `floor` blocks).
template <class BlocksOf>
__device__ __forceinline__ ItemOf item_of(int w, int begin, int end, int64_t busy, int floor,
                                          int lane, const BlocksOf& blocks_of) {
  const LaneBlocks<BlocksOf> run(begin, end, lane, blocks_of);
  ItemOf it;
  it.chunk = chunk_for(warp_sum(run.blocks_before(end)), busy, floor);
  const int mine = run.items_before(end, it.chunk);
  int incl = mine;  // a scan of the lanes' item counts: items before this lane's run
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += x;
  }
  int first = incl - mine;
  if (w >= first && w < incl) {  // one lane at most: walk its run
#pragma unroll
    for (int i = 0; i < LaneBlocks<BlocksOf>::kCached; ++i) {
      const int n = items_for(run.cached[i], it.chunk);
      if (it.b < 0 && run.lo + i < run.hi && w < first + n) {
        it.b = run.lo + i;
        it.share = w - first;
        it.count = n;
      }
      first += n;
    }
    for (int s = run.lo + LaneBlocks<BlocksOf>::kCached; s < run.hi && it.b < 0; ++s) {
      const int n = items_for(blocks_of(s), it.chunk);
      if (w < first + n) {
        it.b = s;
        it.share = w - first;
        it.count = n;
      }
      first += n;
    }
  }
  const unsigned owner = __ballot_sync(0xffffffffu, it.b >= 0);
  if (owner == 0) return {-1, 0, 0, it.chunk};
  const int src = __ffs(owner) - 1;
  return {__shfl_sync(0xffffffffu, it.b, src), __shfl_sync(0xffffffffu, it.share, src),
          __shfl_sync(0xffffffffu, it.count, src), it.chunk};
}

// Sequence b's first item and how many it has (none for b past the launch's range).
struct RowItems {
  int first = 0, count = 0;
};
template <class BlocksOf>
__device__ __forceinline__ RowItems row_items(int b, int begin, int end, int64_t busy, int floor,
                                              int lane, const BlocksOf& blocks_of) {
  const LaneBlocks<BlocksOf> run(begin, end, lane, blocks_of);
  const int chunk = chunk_for(warp_sum(run.blocks_before(end)), busy, floor);
  return {warp_sum(run.items_before(b, chunk)), b < end ? items_for(blocks_of(b), chunk) : 0};
}
#endif  // __CUDACC__

}  // namespace flashserve::attention::kernel
