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
// lanes' sums orders the items by sequence.
struct LaneRun {
  int lo, hi;
  __device__ __forceinline__ LaneRun(int begin, int end, int lane) {
    const int per = (end - begin + 31) / 32;
    lo = min(end, begin + lane * per);
    hi = min(end, lo + per);
  }
};

__device__ __forceinline__ int64_t warp_sum(int64_t x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// The launch's chunk (chunk_for over every sequence's blocks).
template <class BlocksOf>
__device__ __forceinline__ int launch_chunk(int begin, int end, int64_t busy, int floor, int lane,
                                            BlocksOf blocks_of) {
  const LaneRun run(begin, end, lane);
  int64_t blocks = 0;
#pragma unroll 4
  for (int b = run.lo; b < run.hi; ++b) blocks += blocks_of(b);
  return chunk_for(warp_sum(blocks), busy, floor);
}

// Items of the sequences before this lane's run (an exclusive scan over lanes) and in it.
template <class BlocksOf>
__device__ __forceinline__ void lane_items(const LaneRun& run, int chunk, int lane,
                                           BlocksOf blocks_of, int& before, int& mine) {
  mine = 0;
#pragma unroll 4
  for (int b = run.lo; b < run.hi; ++b) mine += items_for(blocks_of(b), chunk);
  int incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int x = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += x;
  }
  before = incl - mine;
}

struct ItemOf {
  int b = -1;     // the sequence; -1: the item is past the launch's last share
  int share = 0;  // which of its shares
};

// Item w's sequence and share.
template <class BlocksOf>
__device__ __forceinline__ ItemOf item_of(int w, int begin, int end, int chunk, int lane,
                                          BlocksOf blocks_of) {
  const LaneRun run(begin, end, lane);
  int before, mine;
  lane_items(run, chunk, lane, blocks_of, before, mine);
  ItemOf it;
  if (w >= before && w < before + mine) {  // one lane at most: walk its run
    int first = before;
    for (int b = run.lo; b < run.hi; ++b) {
      const int n = items_for(blocks_of(b), chunk);
      if (w < first + n) {
        it.b = b;
        it.share = w - first;
        break;
      }
      first += n;
    }
  }
  const unsigned owner = __ballot_sync(0xffffffffu, it.b >= 0);
  if (owner == 0) return ItemOf{};
  const int src = __ffs(owner) - 1;
  return {__shfl_sync(0xffffffffu, it.b, src), __shfl_sync(0xffffffffu, it.share, src)};
}

// Sequence b's first item and how many it has (none for b past the launch's range).
struct RowItems {
  int first = 0, count = 0;
};
template <class BlocksOf>
__device__ __forceinline__ RowItems row_items(int b, int begin, int end, int chunk, int lane,
                                              BlocksOf blocks_of) {
  const LaneRun run(begin, end, lane);
  int before_in_run = 0;
#pragma unroll 4
  for (int s = run.lo; s < run.hi && s < b; ++s) before_in_run += items_for(blocks_of(s), chunk);
  return {static_cast<int>(warp_sum(before_in_run)), b < end ? items_for(blocks_of(b), chunk) : 0};
}
#endif  // __CUDACC__

}  // namespace flashserve::attention::kernel
