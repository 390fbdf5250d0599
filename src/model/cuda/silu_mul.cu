#include <string>

#include "common/pdl.cuh"
#include "flashserve/error.h"
#include "model/cuda/check.h"
#include "model/cuda/silu_mul.h"
#include "model/cuda/vec.cuh"

namespace flashserve::model::cuda {
namespace {

// A flat grid over 8-element vectors of the output: pure streaming, 16-byte accesses.
__global__ void silu_mul_kernel(const __nv_bfloat16* __restrict__ gu,
                                __nv_bfloat16* __restrict__ out, int64_t n_vecs, int64_t row_vecs) {
  pdl::wait_for_producer();  // gu is the kernel before's output
  pdl::release_dependents();
  for (int64_t v = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; v < n_vecs;
       v += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = v / row_vecs, c = (v % row_vecs) * kVec;
    const int64_t inter = row_vecs * kVec;
    float g[kVec], u[kVec];
    load8(gu + t * 2 * inter + c, g);
    load8(gu + t * 2 * inter + inter + c, u);
#pragma unroll
    for (int i = 0; i < kVec; ++i) g[i] = g[i] / (1.0f + __expf(-g[i])) * u[i];
    store8(out + t * inter + c, g);
  }
}

}  // namespace

void silu_mul(const __nv_bfloat16* gate_up, __nv_bfloat16* out, int64_t n_tokens,
              int64_t intermediate, cudaStream_t stream, bool pdl) {
  if (intermediate % kVec != 0)
    throw Error(ErrorKind::kUnsupported, "intermediate_size",
                "must be a multiple of 8, got " + std::to_string(intermediate));
  const int64_t n_vecs = n_tokens * intermediate / kVec;
  if (n_vecs == 0) return;
  const int threads = 256;
  int64_t blocks = (n_vecs + threads - 1) / threads;
  if (blocks > 132 * 16) blocks = 132 * 16;
  check_cuda(pdl::launch(pdl, silu_mul_kernel, dim3(static_cast<unsigned>(blocks)), dim3(threads),
                         0, stream, gate_up, out, n_vecs, intermediate / kVec),
             "silu_mul");
}

}  // namespace flashserve::model::cuda
