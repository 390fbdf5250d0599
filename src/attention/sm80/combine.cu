// Host side of the split-KV combine (combine.h).
#include <cuda_runtime.h>

#include "attention/cuda_check.h"
#include "combine.h"
#include "flashserve/error.h"
#include "launch.h"
#include "ptx.h"

namespace flashserve::attention::sm80 {

void run_combine(const FwdParams& params, DType dtype, int head_dim, int batch,
                 cudaStream_t stream) {
  const int64_t warps = params.q_rows * params.h_q;
  const int64_t blocks = (warps + 7) / 8;
  if (blocks == 0) return;
  if (dtype == DType::kBFloat16)
    combine_kernel<__nv_bfloat16><<<blocks, 256, 0, stream>>>(params, batch, head_dim);
  else
    combine_kernel<__half><<<blocks, 256, 0, stream>>>(params, batch, head_dim);
  check_cuda(cudaGetLastError(), "split-KV combine kernel launch");
}

}  // namespace flashserve::attention::sm80
