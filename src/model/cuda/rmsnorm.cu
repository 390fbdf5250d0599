#include "common/pdl.cuh"
#include "flashserve/error.h"
#include "model/cuda/check.h"
#include "model/cuda/reduce.cuh"
#include "model/cuda/rmsnorm.h"
#include "model/cuda/vec.cuh"

namespace flashserve::model::cuda {
namespace {

// One block per output row; the row stays in registers between the sum of squares and the scaling
// (at most kMaxVecs 16-byte vectors per thread), so the residual is read once and written once.
constexpr int kMaxVecs = 4;

__global__ void add_rmsnorm_kernel(const __nv_bfloat16* __restrict__ delta,
                                   __nv_bfloat16* __restrict__ residual,
                                   const __nv_bfloat16* __restrict__ weight,
                                   __nv_bfloat16* __restrict__ out,
                                   const int32_t* __restrict__ rows, int64_t hidden, float eps) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  float x[kMaxVecs][kVec], w[kMaxVecs][kVec];
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int64_t c = (static_cast<int64_t>(j) * blockDim.x + threadIdx.x) * kVec;
    if (c < hidden) load8(weight + c, w[j]);  // no kernel writes the weight: read before the wait
  }
  pdl::wait_for_producer();
  pdl::release_dependents();
  const int64_t src = rows ? rows[r] : r;
  __nv_bfloat16* res = residual + src * hidden;
  const __nv_bfloat16* del = delta ? delta + src * hidden : nullptr;
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int64_t c = (static_cast<int64_t>(j) * blockDim.x + threadIdx.x) * kVec;
    if (c < hidden) {
      load8(res + c, x[j]);
      if (del) {
        float d[kVec];
        load8(del + c, d);
#pragma unroll
        for (int i = 0; i < kVec; ++i) x[j][i] += d[i];
        round8(x[j]);  // the residual stream is bf16
        store8(res + c, x[j]);
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) ss += x[j][i] * x[j][i];
    }
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / static_cast<float>(hidden) + eps);
#pragma unroll
  for (int j = 0; j < kMaxVecs; ++j) {
    const int64_t c = (static_cast<int64_t>(j) * blockDim.x + threadIdx.x) * kVec;
    if (c < hidden) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) x[j][i] *= inv;
      round8(x[j]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) x[j][i] *= w[j][i];
      store8(out + r * hidden + c, x[j]);
    }
  }
}

}  // namespace

void add_rmsnorm(const __nv_bfloat16* delta, __nv_bfloat16* residual, const __nv_bfloat16* weight,
                 __nv_bfloat16* out, const int32_t* rows, int64_t n_rows, int64_t hidden, float eps,
                 cudaStream_t stream, bool pdl) {
  if (hidden % kVec != 0 || hidden > int64_t{kMaxVecs} * 1024 * kVec)
    throw Error(ErrorKind::kUnsupported, "hidden",
                "must be a multiple of 8 and at most 32768, got " + std::to_string(hidden));
  if (n_rows == 0) return;
  const int64_t vecs = hidden / kVec;
  int64_t threads = (vecs + kMaxVecs - 1) / kMaxVecs;
  threads = ((threads + 31) / 32) * 32;
  check_cuda(pdl::launch(pdl, add_rmsnorm_kernel, dim3(static_cast<unsigned>(n_rows)),
                         dim3(static_cast<unsigned>(threads)), 0, stream, delta, residual, weight,
                         out, rows, hidden, eps),
             "add_rmsnorm");
}

}  // namespace flashserve::model::cuda
