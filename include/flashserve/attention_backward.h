// The backward of the attention contract (flashserve/attention.h): the gradients dq, dk, dv of a
// loss L with respect to q, k and v, given dout = dL/dout of the forward's output and, optionally,
// dlse = dL/dlse of its log-sum-exp. FlashAttention-2's algorithm: S and P are recomputed block
// by block from q, k and the forward's LSE (never an N x N matrix in memory), with
//   D = rowsum(dout o out) - dlse,  dP = dout V^T,  dS = P o (dP - D),
//   dV = P^T dout,  dK = scale dS^T Q,  dQ = scale dS K.
//
// The call is described by the forward's own params (`attn`: q, k, v, out = the forward's output,
// lse = the forward's LSE, required, and the same lengths, mask, scale and GQA), so that a caller
// passes what the forward saw. Layouts:
//   dout  out's shape and q's dtype (any strides with a contiguous last dimension)
//   dq    q's shape and dtype;  dk  k's shape and dtype;  dv  v's shape and dtype
//   dlse  optional float32, lse's shape
// Dense or varlen K/V (with or without seqused_k); paged K/V (block_table) is refused. Every
// element of dq, dk and dv is written: a query row that sees no key (fully masked, or beyond
// cu_seqlens_q[batch]) gets a zero gradient, and so does a key that no query sees (masked out,
// past seqused_k, or in no sequence). GQA/MQA: dk and dv of a KV head are the sums over the
// query heads that share it. attn.num_splits does not apply (the backward never splits) and may
// hold whatever the forward was given.
#pragma once

#include <cstddef>

#include "flashserve/attention.h"

namespace flashserve {

struct AttentionBackwardParams {
  AttentionParams attn;   // the forward's call; its stream and workspace serve this call
  TensorView dout;        // dL/dout
  TensorView dlse;        // optional dL/dlse (float32, lse's shape); absent: 0
  TensorView dq, dk, dv;  // outputs
  // Bit-identical gradients run to run. The CPU path always is (every gradient element is
  // summed in one fixed order by one thread, whatever the thread count), so the flag changes
  // nothing there; on CUDA it replaces dq's fp32 atomics by a dq kernel that sums each element
  // in a fixed order (recomputing the scores a second time).
  bool deterministic = false;
};

// Throws flashserve::Error naming the first argument that breaks the contract: the forward's
// checks (validate(attn), with lse required), then dout, dlse, dq, dk, dv (shapes, dtypes,
// devices; an output may overlap no input nor another output).
void validate(const AttentionBackwardParams& params);

// Validates, then computes dq, dk, dv on the device that holds the tensors.
void attention_backward(const AttentionBackwardParams& params);

// Bytes of device workspace (in attn.workspace) that attention_backward needs (0 when none: the
// CPU path allocates its per-thread scratch itself). Throws what attention_backward would throw.
size_t attention_backward_workspace_size(const AttentionBackwardParams& params);

}  // namespace flashserve
