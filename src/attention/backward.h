// Validation of AttentionBackwardParams (backward.cc): the forward's (describe) plus the gradient
// tensors, so that every backend reads one resolved Problem.
#pragma once

#include "attention/problem.h"
#include "flashserve/attention_backward.h"

namespace flashserve::attention {

// describe(params.attn) with lse required and paged K/V refused, then dout, dlse, dq, dk, dv.
// Throws flashserve::Error naming the argument at fault.
Problem describe_backward(const AttentionBackwardParams& params);

#if defined(FLASHSERVE_WITH_CUDA)
// The CUDA backward (backward_cuda.cu, the sm80 kernels of sm80/bwd_kernel.h): throws kUnsupported
// naming what the kernels lack. Enqueued on params.attn.stream; the workspace is
// params.attn.workspace when given (at least cuda_backward_workspace_size bytes), else a
// stream-ordered allocation.
void cuda_backward(const AttentionBackwardParams& params, const Problem& problem);
size_t cuda_backward_workspace_size(const AttentionBackwardParams& params, const Problem& problem);
#endif

}  // namespace flashserve::attention
