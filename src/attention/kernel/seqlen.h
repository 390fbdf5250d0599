// One sequence's lengths and first rows, from the call's length sources: dense tensors (every
// sequence has seqlen rows), varlen ones (cu_seqlens: sequence b is rows cu[b] .. cu[b + 1] - 1)
// and seqused_k (sequence b uses only its first seqused_k[b] keys); and which sequences of its
// range a launch takes. Shared by the sm80 and sm90 kernels.
#pragma once

#include <cstdint>

#include "attention/mask.h"  // FS_HOST_DEVICE

namespace flashserve::attention::kernel {

// Which sequences of its range a launch computes: all, or (a mixed batch's two launches) those
// with at most one query (the decode launch) or those with more (the prefill launch); the plan's
// SeqGroup (attention/cuda/plan.h) has the same values.
enum SeqKind : int32_t { kAllSeqs = 0, kDecodeSeqs = 1, kPrefillSeqs = 2 };

// Whether a sequence with q_len queries belongs to a launch that takes `only`.
FS_HOST_DEVICE bool takes_seq(int32_t only, int q_len) {
  return only == kAllSeqs || (only == kDecodeSeqs) == (q_len <= 1);
}

struct SeqLens {
  int q_start, q_len;   // q_start: the first row of q (0 for dense tensors)
  int k_start, kv_len;  // k_start: the first row of k and v (0 for dense tensors)
};

// cu_seqlens_q / cu_seqlens_k null: dense, seqlen_q / seqlen_k rows per sequence; seqused_k
// null: every row of the sequence's k/v is a key.
FS_HOST_DEVICE SeqLens seq_lens(const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k,
                                const int32_t* seqused_k, int seqlen_q, int seqlen_k, int b) {
  SeqLens s;
  s.q_start = cu_seqlens_q != nullptr ? cu_seqlens_q[b] : 0;
  s.q_len = cu_seqlens_q != nullptr ? cu_seqlens_q[b + 1] - s.q_start : seqlen_q;
  s.k_start = cu_seqlens_k != nullptr ? cu_seqlens_k[b] : 0;
  s.kv_len = cu_seqlens_k != nullptr ? cu_seqlens_k[b + 1] - s.k_start : seqlen_k;
  if (seqused_k != nullptr) s.kv_len = seqused_k[b];
  return s;
}

}  // namespace flashserve::attention::kernel
