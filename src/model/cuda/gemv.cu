#include "common/pdl.cuh"
#include "flashserve/error.h"
#include "model/cuda/check.h"
#include "model/cuda/gemv.h"
#include "model/cuda/gemv_pass.cuh"
#include "model/cuda/reduce.cuh"
#include "model/cuda/vec.cuh"

namespace flashserve::model::cuda {
namespace {

constexpr int kWarps = 8;   // output rows per block
constexpr int kUnroll = 4;  // 16-byte loads of w in flight per lane

// early: the lane's first pass of w is loaded before the wait for the producer (no kernel writes
// the weights), so that under programmatic dependent launch the blocks scheduled while the kernel
// before still runs already have their first loads in flight; the main loop then starts one pass
// later, and the sums are the same either way. Off by default (measured no gain: decode_kernels.h).
template <int M, bool kFloatOut>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                const __nv_bfloat16* __restrict__ bias, void* __restrict__ y, int64_t n, int64_t k,
                bool early) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t{kWarps} + (threadIdx.x >> 5);
  const bool active = row < n;
  const __nv_bfloat16* wr = w + (active ? row : 0) * k;
  int64_t c = int64_t{lane} * kVec;
  Bf16x8 first[kUnroll];
  const bool peel = early && active && c + (kUnroll - 1) * kGemvStep < k;
  if (peel)
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) first[u] = load_raw8(wr + c + u * kGemvStep);
  pdl::wait_for_producer();  // x is the kernel before's output
  pdl::release_dependents();
  if (!active) return;
  float acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0.0f;
  if (peel) {
    fma_pass<kUnroll, M>(first, x, k, c, acc);
    c += kUnroll * kGemvStep;
  }
  // Main loop: kUnroll independent 16-byte loads of w per lane before their first use.
  for (; c + (kUnroll - 1) * kGemvStep < k; c += kUnroll * kGemvStep) {
    Bf16x8 wraw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wraw[u] = load_raw8(wr + c + u * kGemvStep);
    fma_pass<kUnroll, M>(wraw, x, k, c, acc);
  }
  for (; c < k; c += kGemvStep) {
    float wv[kVec];
    load8(wr + c, wv);
    fma_vec<M>(wv, x, k, c, acc);
  }
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = warp_sum(acc[i]);
  if (lane == 0) {
    const float b = bias ? __bfloat162float(bias[row]) : 0.0f;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if constexpr (kFloatOut)
        static_cast<float*>(y)[i * n + row] = acc[i] + b;
      else
        static_cast<__nv_bfloat16*>(y)[i * n + row] = __float2bfloat16_rn(acc[i] + b);
    }
  }
}

template <int M>
void launch(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, void* y,
            bool y_float32, int64_t n, int64_t k, cudaStream_t stream, bool pdl, bool early) {
  if (n == 0) return;
  const dim3 blocks(static_cast<unsigned>((n + kWarps - 1) / kWarps));
  check_cuda(pdl::launch(pdl, y_float32 ? gemv_kernel<M, true> : gemv_kernel<M, false>, blocks,
                         dim3(kWarps * 32), 0, stream, x, w, bias, y, n, k, early),
             "gemv");
}

}  // namespace

void gemv(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, void* y,
          bool y_float32, int64_t m, int64_t n, int64_t k, cudaStream_t stream, bool pdl,
          bool early) {
  if (m > kGemvMaxRows) throw Error(ErrorKind::kInternal, "m", "gemv takes at most 4 rows");
  switch (m) {
    case 0:
      return;
    case 1:
      launch<1>(x, w, bias, y, y_float32, n, k, stream, pdl, early);
      break;
    case 2:
      launch<2>(x, w, bias, y, y_float32, n, k, stream, pdl, early);
      break;
    case 3:
      launch<3>(x, w, bias, y, y_float32, n, k, stream, pdl, early);
      break;
    default:
      launch<4>(x, w, bias, y, y_float32, n, k, stream, pdl, early);
      break;
  }
}

}  // namespace flashserve::model::cuda
