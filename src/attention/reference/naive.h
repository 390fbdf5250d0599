// Float64 naive attention: materialises S = scale * Q K^T (then softcap and ALiBi, score_mod.h)
// and P = softmax(S) for every (sequence, head), so it is O(N^2) in memory. For tests only: it is
// the reference every kernel is checked against.
#pragma once

#include <cstdint>
#include <vector>

#include "flashserve/attention.h"

namespace flashserve::attention::reference {

// Rows are the query rows of q in order: dense b * seqlen_q + t, varlen cu_seqlens_q[b] + t.
// A varlen row of q that belongs to no sequence (at or past cu_seqlens_q[batch]) is NaN in both
// vectors: the contract says nothing about it, and comparisons skip it.
struct NaiveOutput {
  std::vector<double> out;  // [rows, h_q, head_dim_v]
  std::vector<double> lse;  // [rows, h_q], natural log; -inf for a row that sees no key
  int64_t rows = 0, h_q = 0, head_dim_v = 0;
};

// e4m3 inputs (attention.h) are read dequantised: each code's value times its descale factor,
// in float64 for kExact (the oracle of every fp8 test), in float32 for the emulations.
enum class Emulate {
  kExact,         // float64 throughout, on the inputs as stored
  kLowPrecision,  // what a naive kernel in the input dtype computes: S and softmax in float32,
                  // P rounded to the input dtype before P V, out rounded to the input dtype
                  // (an e4m3 q: as kFp8Kernel; e4m3 k and v beside a float q: P and out in q's)
  kFp8Kernel,     // what FlashAttention-3's fp8 kernel computes, from any inputs (e4m3 ones, or
                  // values already quantised and dequantised elsewhere): over blocks of
                  // kFp8BlockK keys with a running max m, S = scale q.k in float32, P = 2^8
                  // exp(S - m) (FA3 scales P into e4m3's range by a fixed 2^8) rounded to e4m3
                  // before P V, the row sum from the unrounded P, the float32 accumulator rescaled
                  // when m grows, out = accumulator / sum rounded to bfloat16 (FA3's fp8 output)
};

// The key block of kFp8Kernel's online softmax: which P are rounded against which running max.
// FA3's fp8 tiles take 128 to 224 keys per block; the error does not depend on the choice beyond
// the rare P whose rounding the max changes.
inline constexpr int64_t kFp8BlockK = 128;

// Computes attention for params (CPU tensors; params.out and params.lse are not touched; every
// feature of the contract: varlen, paged KV, GQA, causal, window, seqused_k). Validates params.
NaiveOutput naive_forward(const AttentionParams& params, Emulate mode = Emulate::kExact);

// Backward of dense or varlen attention (no paging): given dout with q's layout and head_dim_v
// (and optionally dlse, float32 shaped like params.lse: the gradient of the loss with respect to
// the LSE), returns dq, dk, dv shaped like q, k, v (contiguous, as doubles, the row order above;
// k/v rows are b * seqlen_k + j, or cu_seqlens_k[b] + j). A query row or key that no sequence
// uses has a zero gradient. kExact computes in float64; kLowPrecision emulates a naive kernel in
// the input dtype (float32 arithmetic; P, O, dS and the gradients rounded to the dtype) and sets
// the tolerance of the kernels' tests, as naive_forward's does.
struct NaiveGrads {
  std::vector<double> dq, dk, dv;
};
NaiveGrads naive_backward(const AttentionParams& params, const TensorView& dout,
                          Emulate mode = Emulate::kExact, const TensorView& dlse = {});

}  // namespace flashserve::attention::reference
