// One block per row: the copy (through the mask), then, after a barrier, each listed token once
// (a row's tokens are distinct, so no two threads write one element).
#include "model/cuda/check.h"
#include "model/cuda/logits_adjust.h"

namespace flashserve::model::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    adjust_kernel(const float* __restrict__ logits, float* __restrict__ out, DeviceAdjust a,
                  int64_t vocab) {
  const int64_t row = blockIdx.x;
  const float* l = logits + row * vocab;
  float* o = out + row * vocab;
  const int64_t words = (vocab + 31) / 32;
  const uint32_t* allowed = a.allowed ? a.allowed + row * words : nullptr;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
    o[i] = allowed && !token_allowed(allowed, i) ? -INFINITY : l[i];
  __syncthreads();
  for (int64_t j = a.offsets[row] + threadIdx.x; j < a.offsets[row + 1]; j += blockDim.x) {
    const TokenAdjust t = a.tokens[j];
    if (t.token < vocab) o[t.token] = adjusted_logit(o[t.token], t);
  }
}

}  // namespace

void adjust_logits(const float* logits, float* out, const DeviceAdjust& adjust, int64_t rows,
                   int64_t vocab, cudaStream_t stream) {
  if (rows == 0) return;
  adjust_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, out, adjust, vocab);
  check_launch("adjust_logits");
}

}  // namespace flashserve::model::cuda
