// The backward's launches that every family shares (bwd_launch.h): zero_grad (the gradients'
// elements that no backward tile writes are 0), the preprocess (D) and the postprocess (dq from
// the fp32 accumulator). The sm90 backward (sm90/bwd_kernel.h) runs between the same two.
#include <algorithm>

#include "attention/cuda_check.h"
#include "bwd_kernel.h"
#include "bwd_launch.h"

namespace flashserve::attention::sm80 {

void zero_grad(void* data, DType dtype, int rank, const int64_t* shape, const int64_t* stride,
               cudaStream_t stream) {
  // As [d0, d1, d2, d3]: a rank-3 view is one slice of d0 = 1.
  const int64_t d0 = rank == 4 ? shape[0] : 1, d1 = shape[rank - 3], d2 = shape[rank - 2],
                d3 = shape[rank - 1];
  const int64_t s0 = rank == 4 ? stride[0] : 0, s1 = stride[rank - 3], s2 = stride[rank - 2];
  const int64_t n = d0 * d1 * d2 * d3;
  if (n == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535));
  if (dtype == DType::kBFloat16)
    bwd_zero<__nv_bfloat16>
        <<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(data), d1, d2, d3, s0, s1, s2, n);
  else
    bwd_zero<__half>
        <<<blocks, 256, 0, stream>>>(static_cast<__half*>(data), d1, d2, d3, s0, s1, s2, n);
  check_cuda(cudaGetLastError(), "sm80 backward zero launch");
}

namespace {
// row_lanes(head_dim) lanes per (query row, head): grid (rows / rows per block, h_q, batch).
dim3 row_grid(const BwdParams& p, int head_dim, int max_q_len) {
  const int rows = kRowThreads / row_lanes(head_dim);
  return dim3((max_q_len + rows - 1) / rows, p.fwd.h_q, p.batch);
}
}  // namespace

void run_bwd_preprocess(const BwdParams& p, DType dtype, int head_dim, int max_q_len,
                        cudaStream_t stream) {
  if (max_q_len == 0) return;
  if (dtype == DType::kBFloat16)
    bwd_preprocess<__nv_bfloat16>
        <<<row_grid(p, head_dim, max_q_len), kRowThreads, 0, stream>>>(p, head_dim);
  else
    bwd_preprocess<__half>
        <<<row_grid(p, head_dim, max_q_len), kRowThreads, 0, stream>>>(p, head_dim);
  check_cuda(cudaGetLastError(), "backward preprocess launch");
}

void run_bwd_postprocess(const BwdParams& p, DType dtype, int head_dim, int max_q_len,
                         cudaStream_t stream) {
  if (max_q_len == 0) return;
  if (dtype == DType::kBFloat16)
    bwd_postprocess<__nv_bfloat16>
        <<<row_grid(p, head_dim, max_q_len), kRowThreads, 0, stream>>>(p, head_dim);
  else
    bwd_postprocess<__half>
        <<<row_grid(p, head_dim, max_q_len), kRowThreads, 0, stream>>>(p, head_dim);
  check_cuda(cudaGetLastError(), "backward postprocess launch");
}

}  // namespace flashserve::attention::sm80
