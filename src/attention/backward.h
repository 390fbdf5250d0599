// Validation of AttentionBackwardParams (backward.cc): the forward's (describe) plus the gradient
// tensors, so that every backend reads one resolved Problem.
#pragma once

#include "attention/problem.h"
#include "flashserve/attention_backward.h"

namespace flashserve::attention {

// describe(params.attn) with lse required and paged K/V refused, then dout, dlse, dq, dk, dv.
// Throws flashserve::Error naming the argument at fault.
Problem describe_backward(const AttentionBackwardParams& params);

}  // namespace flashserve::attention
