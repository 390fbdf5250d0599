// The CUDA path's two shape decisions that do not depend on a kernel being present: whether a call
// is decode (the GQA-packed decode tiles) and how many ways split-KV divides its keys. Plain C++,
// so that CI tests the policy without a GPU; the workspace size a caller allocates follows from it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "problem.h"

namespace flashserve::attention {

// What the choice needs to know of the device.
struct SplitDevice {
  int sms = 0;          // streaming multiprocessors
  int smem_per_sm = 0;  // shared memory per SM in bytes (how many decode blocks fit)
};

// Decode: every sequence has at most one query, so causal masks nothing and a left window bounds
// all of a sequence's heads alike (the GQA-packed decode tiles take it).
bool is_decode(const Problem& pr);

// The split count and the fewest key blocks a split of the automatic choice keeps (its floor:
// 16 for long decodes, fewer for small decode grids, 1 for short keys; 4 for prefill).
struct SplitChoice {
  int splits = 1;
  int min_blocks = 1;
};

// num_splits 1: 1; n > 1: n; 0: the choice below (1 when splitting would not pay). fp8_codes: the
// decode launch runs the fp8 KV cache's register-conversion tiles (smaller blocks, more per SM).
SplitChoice split_choice(const Problem& pr, const SplitDevice& dev, bool decode,
                         bool fp8_codes = false);
inline int choose_splits(const Problem& pr, const SplitDevice& dev, bool decode,
                         bool fp8_codes = false) {
  return split_choice(pr, dev, decode, fp8_codes).splits;
}

// Length-aware decode splits (kernel/split_items.h): the choice above gives every sequence of a
// launch the same number of splits, so a sequence k times the launch's mean length runs k times
// longer a CTA than the others and ends the launch alone (exponential lengths at the same mean:
// 1.26-1.56x the time of equal ones, session 32). Balanced, the launch's grid holds `items`
// (sequence, share) slots a sequence (`splits` + 1: one more than the choice, the rounding's
// room) and each sequence takes shares of `chunk` key blocks, chunk = max(min_blocks, the
// launch's key blocks / (sequences x splits)), worked out on the device from its lengths (a
// decode graph replays with other lengths). Equal lengths give the choice's shares exactly.
struct BalancedSplit {
  int items = 0;       // grid slots per sequence; 0: not balanced
  int min_blocks = 0;  // the chunk's floor
};
// For an automatic decode choice (num_splits 0) of a launch of `pr.batch` sequences of 16-bit K/V
// (the plan keeps the fp8 KV cache's register tiles on their even split): balanced where there
// are two or more sequences; else {0, 0}.
BalancedSplit balanced_split(const Problem& pr, const SplitDevice& dev);

// Whether a decode launch's lengths differ enough for the split by length to pay: the longest
// sequence has at least kUnequalDecodes (3/2) times the mean key blocks of the launch's `decodes`
// sequences. The split by length costs an item-map kernel (once a step since session 35: the
// layers after the first reuse it) and, where the even split ran unsplit, a combine. Measured
// with bench_serve_attn --decode-spread (16-112 decodes of 1k-2k mean keys, paged 16):
// exponential lengths (longest / mean 3.8-5.8) 15-34% faster by length; uniform 0.1-1.9x the
// mean (longest / mean ~1.9) 9-10% faster at 16 x 2k and 64 x 2k and within 1.2% elsewhere;
// equal lengths +0.1% to +6.3% slower (H100, sessions 34-35,
// bench/results/decode-reuse-pdl-h100-2026-12-05-session35.md). At twice the mean (sessions
// 34-35) the uniform rows went even; 1.5x takes them and leaves equal lengths even.
inline constexpr int64_t kUnequalDecodesNum = 3, kUnequalDecodesDen = 2;
inline bool decodes_unequal(int64_t longest_blocks, int64_t total_blocks, int64_t decodes) {
  return decodes >= 2 &&
         longest_blocks * decodes * kUnequalDecodesDen >= kUnequalDecodesNum * total_blocks;
}

// Bytes of a balanced launch's item map (sm80/fwd_params.h SplitMap) in the workspace: an entry
// of kSplitMapItemBytes an item of the grid, then one of kSplitMapRowBytes a sequence.
inline constexpr size_t kSplitMapItemBytes = 16, kSplitMapRowBytes = 8;
inline size_t split_map_bytes(int64_t sequences, int64_t items) {
  return static_cast<size_t>(sequences * items) * kSplitMapItemBytes +
         static_cast<size_t>(sequences) * kSplitMapRowBytes;
}

}  // namespace flashserve::attention
