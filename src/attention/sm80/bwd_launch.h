// Host entry points of the sm80 backward kernels (bwd_kernel.h), one per head dim and padding (each
// in its own .cu file so the instantiations compile in parallel).
#pragma once

#include <cuda_runtime.h>

#include "bwd_params.h"
#include "flashserve/tensor.h"

namespace flashserve::attention::sm80 {

struct BwdLaunch {
  DType dtype;     // kBFloat16 or kFloat16
  bool has_mask;   // causal or a window side: the masked instantiation
  int max_q_len;   // rows of the pre/postprocess grid
  int max_kv_len;  // grid x of the main kernel: ceil(max_kv_len / block_n)
  int h_kv;
  bool deterministic;  // dq by bwd_dq_kernel (fixed order) instead of atomics
  int smem_per_block;  // the device's opt-in shared memory per block
  cudaStream_t stream;
};

// Runs the preprocess, the main kernel and the postprocess (deterministic: the main kernel
// without dq, then bwd_dq_kernel) on launch.stream; the caller has zeroed dq, dk, dv and the dq
// accumulator.
// Throws flashserve::Error (kUnsupported when the device's shared memory is too small, kCuda when
// a launch fails).
template <int kHeadDim>
void run_bwd(const BwdParams& params, const BwdLaunch& launch);

// The same for a call whose head dim (params.head_dim: a multiple of 8, at most kHeadDim; q's, k's
// and v's alike) is not a compiled one (bwd_kernel.h BwdPaddedConfig): kHeadDim 64, 128 or 256,
// the last in two launches of half the columns of dQ, dK and dV each.
template <int kHeadDim>
void run_bwd_padded(const BwdParams& params, const BwdLaunch& launch);

// D = rowsum(dout o out) - dlse into p.delta (before the main kernel), and dq = scale x
// p.dq_accum rounded to the dtype (after it): the steps around every family's main kernel (the
// sm90 backward's too). Nothing is launched when max_q_len is 0. head_dim: a multiple of 8 (the
// kernels move 8 elements a lane).
void run_bwd_preprocess(const BwdParams& p, DType dtype, int head_dim, int max_q_len,
                        cudaStream_t stream);
void run_bwd_postprocess(const BwdParams& p, DType dtype, int head_dim, int max_q_len,
                         cudaStream_t stream);

// Zeros a gradient view of rank 3 or 4 (contiguous last dimension) on `stream`.
void zero_grad(void* data, DType dtype, int rank, const int64_t* shape, const int64_t* stride,
               cudaStream_t stream);

}  // namespace flashserve::attention::sm80
