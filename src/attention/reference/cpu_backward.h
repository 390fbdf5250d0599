// The production CPU backward of attention (attention_backward on host tensors): FlashAttention-2's
// recomputation, tiled like the CPU forward (cpu_forward.h), float32 arithmetic on bf16 / fp16 /
// fp32 inputs, multi-threaded.
//
// A preprocess computes D = rowsum(dout o out) - dlse for every query row. Then two passes, each
// over tiles that own their outputs, so that no gradient element is ever summed by two threads
// (no atomics, no reduction whose order depends on scheduling: bit-identical run to run and
// whatever the thread count):
//   dK/dV pass: one tile per (sequence, KV head, block of keys) keeps that block's dK and dV in
//     float32 and walks the query blocks (every query head of the GQA group) that see it:
//       S^T = K Q^T,  P^T = exp2(S^T - lse) (masked: 0),  dV += P^T dO,
//       dP^T = V dO^T,  dS^T = scale P^T o (dP^T - D),  dK += dS^T Q
//   dQ pass: one tile per (sequence, KV head, block of queries), as the forward's tiles, walks
//     the key blocks it sees and recomputes P and dS there:  dQ += dS K.
// The dQ pass recomputes S and dP (7 block products per block pair instead of FlashAttention's
// 5): the price of keeping dq free of atomics on the CPU. Memory is O(tile) per worker plus the
// D vector (one float per query row and head); never O(N^2).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/problem.h"
#include "flashserve/attention_backward.h"

namespace flashserve::attention {

struct CpuBackwardTiling {
  // Keys per block: a dK/dV tile's accumulators (2 x 128 x d floats) and the block's keys and
  // values stay in L2 beside the query tile streaming past.
  static constexpr int64_t kBlockK = 128;
  // Query rows (queries x the group's heads) per block, as the forward's tiles.
  static constexpr int64_t kTileRows = 64;
  static int64_t block_q(int64_t group) { return group >= kTileRows ? 1 : kTileRows / group; }
  static int64_t tile_rows(int64_t group) { return block_q(group) * group; }
};

// Validated params (describe_backward) and their problem: writes params.dq, dk, dv.
void cpu_backward(const AttentionBackwardParams& params, const Problem& problem);

}  // namespace flashserve::attention
