// What the host passes to the sm80 backward kernels (bwd_kernel.h): the forward's parameters
// (FwdParams: q, k, v, out, lse, their strides, the lengths and the mask, read through SeqInfo
// exactly as the forward reads them) plus the gradients and the fp32 workspace.
#pragma once

#include <cstdint>

#include "fwd_params.h"

namespace flashserve::attention::sm80 {

struct BwdParams {
  FwdParams fwd;  // q, k, v, out (the forward's output), lse (required), lengths, mask, scales

  const void* dout;   // out's layout
  const float* dlse;  // null: 0; else lse's layout
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dlse_batch_stride, dlse_row_stride, dlse_head_stride;

  void* dq;  // q's, k's, v's layouts
  void* dk;
  void* dv;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;

  // Workspace, contiguous fp32: dQ accumulated over the key blocks by atomics, [q_rows][h_q][D]
  // (row = the query's row of q, as SeqInfo::q_row0), and D = rowsum(dout o out) - dlse,
  // [q_rows][h_q].
  float* dq_accum;
  float* delta;
  int64_t q_rows;
  int32_t batch;

  // The call's head dim (of q, k, v and out; the dq accumulator's row length; the kernels of
  // BwdConfig have it as kHeadDim, the padded ones, bwd_kernel.h BwdPaddedConfig, read it here),
  // and the first of the columns of dQ, dK and dV this launch computes (padded kernels past 128
  // columns: a launch computes half of them).
  int32_t head_dim;
  int32_t col0;
};

}  // namespace flashserve::attention::sm80
