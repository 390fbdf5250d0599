// Length-aware split-KV for decode launches (split_policy.h balanced_split): the launch's grid
// holds `items` slots a sequence, and the slots go to the sequences by their key blocks rather
// than `items` to each: sequence b takes items_for(blocks_b, chunk) shares of `chunk` key blocks,
// chunk = chunk_for(the launch's key blocks, sequences x (items - 1), floor), so the CTAs of a
// launch carry about the same keys whatever the spread of its lengths. Item w is the w-th share
// in sequence order. One CTA works the map out on the device before the split kernel
// (sm80/split_map.cu: a decode graph replays with the step's own lengths); the split kernel's
// CTAs read their (sequence, share) from it and the combine its rows' (first item, count). The
// partials are by item ([items x sequences] rows of h_q slots), so nothing of the layout depends
// on the lengths. (Session 33 first had each CTA walk the lengths itself: a chain of round trips
// to L2 in every CTA, 12-18% on the split kernel at equal lengths.)
//
// The arithmetic here is host-device; tests/attention/split_items_test.cc checks it on the host.
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

}  // namespace flashserve::attention::kernel
