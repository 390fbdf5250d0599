// zero_grad (bwd_launch.h): the gradients' elements that no backward tile writes are 0.
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

}  // namespace flashserve::attention::sm80
