#include <string>

#include "common/pdl.cuh"
#include "flashserve/error.h"
#include "model/cuda/check.h"
#include "model/cuda/fused_gemv.h"
#include "model/cuda/gemv.h"
#include "model/cuda/gemv_pass.cuh"
#include "model/cuda/reduce.cuh"
#include "model/cuda/vec.cuh"
#include "model/decode_kernels.h"

namespace flashserve::model::cuda {

// The runner's rule for which steps fuse (decode_kernels.h, plain C++) names these limits itself.
static_assert(kGemvMaxRows == kGemvMaxProductRows && kFusedNormMaxHidden == kFusedNormMaxColumns);

namespace {

constexpr int kWarps = 8;   // output columns per block, as gemv.cu
constexpr int kUnroll = 4;  // 16-byte loads of each weight row in flight per lane, as gemv.cu
constexpr int kThreads = kWarps * 32;
// add_rmsnorm's layout: up to 4 vectors of 8 per thread, at most 1024 threads there; here 256.
constexpr int kNormVecs = 4;

enum class Epilogue { kStore, kResidual, kSiluMul };

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// RMSNorm of x's M rows into shared memory (bf16 [M][k]) by the whole block, as add_rmsnorm
// computes it with no delta: the threads below add_rmsnorm's count take its vectors (vector
// j * threads + t) and the rest add zeros, so the block sum adds the same partials in the same
// order and the normalized rows are add_rmsnorm's bit for bit.
template <int M>
__device__ void normalize_rows(const FusedGemvArgs& a, __nv_bfloat16* xs, float* scratch) {
  const int64_t vecs = a.k / kVec;
  int norm_threads = static_cast<int>((vecs + kNormVecs - 1) / kNormVecs);
  norm_threads = (norm_threads + 31) / 32 * 32;
  const int t = threadIdx.x;
  // The row stays bf16 in registers between the two passes (converted where used), and the
  // weight is read in the second: float copies of both, held across the block sum, doubled the
  // kernel's registers and halved the blocks an SM holds.
#pragma unroll
  for (int i = 0; i < M; ++i) {
    Bf16x8 xr[kNormVecs];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kNormVecs; ++j) {
      const int64_t c = (static_cast<int64_t>(j) * norm_threads + t) * kVec;
      if (t < norm_threads && c < a.k) {
        xr[j] = *reinterpret_cast<const Bf16x8*>(a.x + i * a.k + c);
        float x[kVec];
        unpack8(xr[j], x);
#pragma unroll
        for (int e = 0; e < kVec; ++e) ss += x[e] * x[e];
      }
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / static_cast<float>(a.k) + a.eps);
#pragma unroll
    for (int j = 0; j < kNormVecs; ++j) {
      const int64_t c = (static_cast<int64_t>(j) * norm_threads + t) * kVec;
      if (t < norm_threads && c < a.k) {
        float x[kVec], wf[kVec];
        unpack8(xr[j], x);
        load8(a.norm_weight + c, wf);
#pragma unroll
        for (int e = 0; e < kVec; ++e) x[e] *= inv;
        round8(x);
#pragma unroll
        for (int e = 0; e < kVec; ++e) x[e] *= wf[e];
        store8(xs + i * a.k + c, x);
      }
    }
  }
  __syncthreads();
}

// acc[r][i] += w[r] . x[i] over one pass of kUnroll vectors of each weight row: every row's loads
// first (8 in flight per lane for silu's gate and up rows), then each row's fma_pass as gemv.cu's.
template <int kRows, int M>
__device__ __forceinline__ void accumulate_pass(const __nv_bfloat16* const (&wr)[kRows],
                                                const __nv_bfloat16* x, int64_t k, int64_t c,
                                                float (&acc)[kRows][M]) {
  Bf16x8 wraw[kRows][kUnroll];  // kept bf16 until used: half the registers of floats
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wraw[r][u] = load_raw8(wr[r] + c + u * kGemvStep);
#pragma unroll
  for (int r = 0; r < kRows; ++r) fma_pass<kUnroll, M>(wraw[r], x, k, c, acc[r]);
}

template <int M, bool kNorm, Epilogue kEpi>
__global__ void __launch_bounds__(kThreads) fused_gemv_kernel(const FusedGemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];  // kNorm: the normalized rows
  __shared__ float scratch[32];
  constexpr int kRows = kEpi == Epilogue::kSiluMul ? 2 : 1;  // weight rows per column
  const int lane = threadIdx.x & 31;
  const int64_t col = blockIdx.x * int64_t{kWarps} + (threadIdx.x >> 5);
  const bool has_col = col < a.n;
  const int64_t k = a.k;
  const __nv_bfloat16* wr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) wr[r] = a.w + (col + r * a.n) * k;
  // The first pass of the weights is asked of L2 before the wait (no kernel writes them), so that
  // their latency overlaps the producer's tail and the norm prologue. A prefetch rather than
  // loads into registers: held across the prologue, those cost the norm variants a third of
  // their occupancy (or spills).
  int64_t c = int64_t{lane} * kVec;
  if (has_col)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (c + u * kGemvStep < k) prefetch_l2(wr[r] + c + u * kGemvStep);
  pdl::wait_for_producer();
  pdl::release_dependents();
  const __nv_bfloat16* x = a.x;
  if constexpr (kNorm) {
    auto* xs = reinterpret_cast<__nv_bfloat16*>(smem);
    normalize_rows<M>(a, xs, scratch);  // every thread: it has block barriers
    x = xs;
  }
  if (!has_col) return;
  float acc[kRows][M];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.0f;
  for (; c + (kUnroll - 1) * kGemvStep < k; c += kUnroll * kGemvStep)
    accumulate_pass<kRows, M>(wr, x, k, c, acc);
  for (; c < k; c += kGemvStep) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float wv[kVec];
      load8(wr[r] + c, wv);
      fma_vec<M>(wv, x, k, c, acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = warp_sum(acc[r][i]);
  if (lane != 0) return;
  // gemv.cu rounds acc + bias (+0 without one): the same sums, so the same bits (signed zeros too).
  const float b = a.bias ? __bfloat162float(a.bias[col]) : 0.0f;
#pragma unroll
  for (int i = 0; i < M; ++i) {
    __nv_bfloat16* y = a.y + i * a.n + col;
    if constexpr (kEpi == Epilogue::kStore) {
      *y = __float2bfloat16_rn(acc[0][i] + b);
    } else if constexpr (kEpi == Epilogue::kResidual) {
      // add_rmsnorm's add: the bf16 product added to the bf16 stream in float32, rounded once.
      const float d = __bfloat162float(__float2bfloat16_rn(acc[0][i] + b));
      *y = __float2bfloat16_rn(__bfloat162float(*y) + d);
    } else {
      // silu_mul's formula on the bf16 gate and up values the unfused GEMV would have written.
      const float g = __bfloat162float(__float2bfloat16_rn(acc[0][i] + b));
      const float u = __bfloat162float(__float2bfloat16_rn(acc[1][i] + b));
      *y = __float2bfloat16_rn(g / (1.0f + __expf(-g)) * u);
    }
  }
}

template <int M, bool kNorm, Epilogue kEpi>
void launch_one(const FusedGemvArgs& a, cudaStream_t stream, bool pdl) {
  auto* kernel = fused_gemv_kernel<M, kNorm, kEpi>;
  const size_t smem = kNorm ? static_cast<size_t>(M * a.k) * sizeof(__nv_bfloat16) : 0;
  // 4 rows of 8192 take 64 KiB, past the 48 KiB a launch gets without asking.
  if (smem > size_t{48} << 10)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem)),
               "fused_gemv shared memory");
  const dim3 blocks(static_cast<unsigned>((a.n + kWarps - 1) / kWarps));
  check_cuda(pdl::launch(pdl, kernel, blocks, dim3(kThreads), smem, stream, a), "fused_gemv");
}

template <int M, bool kNorm>
void launch_epilogue(const FusedGemvArgs& a, cudaStream_t stream, bool pdl) {
  if (a.silu) return launch_one<M, kNorm, Epilogue::kSiluMul>(a, stream, pdl);
  if (a.add_to_y) return launch_one<M, kNorm, Epilogue::kResidual>(a, stream, pdl);
  launch_one<M, kNorm, Epilogue::kStore>(a, stream, pdl);
}

template <int M>
void launch_rows(const FusedGemvArgs& a, cudaStream_t stream, bool pdl) {
  if (a.norm_weight) return launch_epilogue<M, true>(a, stream, pdl);
  launch_epilogue<M, false>(a, stream, pdl);
}

}  // namespace

void fused_gemv(const FusedGemvArgs& a, cudaStream_t stream, bool pdl) {
  if (a.m > kGemvMaxRows || a.k % kVec != 0 || a.k <= 0)
    throw Error(ErrorKind::kUnsupported, "fused_gemv",
                "takes at most 4 rows and k a positive multiple of 8, got m=" +
                    std::to_string(a.m) + " k=" + std::to_string(a.k));
  if (a.norm_weight && a.k > kFusedNormMaxHidden)
    throw Error(ErrorKind::kUnsupported, "hidden",
                "a fused norm takes at most 8192 columns, got " + std::to_string(a.k));
  if ((a.silu || a.add_to_y) && (a.bias || (a.silu && a.add_to_y)))
    throw Error(ErrorKind::kUnsupported, "fused_gemv",
                "silu and add_to_y take no bias and not each other");
  if (a.n == 0) return;
  switch (a.m) {
    case 0:
      return;
    case 1:
      return launch_rows<1>(a, stream, pdl);
    case 2:
      return launch_rows<2>(a, stream, pdl);
    case 3:
      return launch_rows<3>(a, stream, pdl);
    default:
      return launch_rows<4>(a, stream, pdl);
  }
}

}  // namespace flashserve::model::cuda
