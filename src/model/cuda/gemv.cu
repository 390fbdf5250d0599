#include <algorithm>
#include <map>
#include <mutex>
#include <string>

#include "flashserve/error.h"
#include "model/cuda/check.h"
#include "model/cuda/gemv.h"
#include "model/cuda/pdl.cuh"
#include "model/cuda/reduce.cuh"
#include "model/cuda/vec.cuh"

namespace flashserve::model::cuda {
namespace {

constexpr int kWarps = 8;   // output rows per block
constexpr int kUnroll = 4;  // kWarpPerRow: 16-byte loads of w in flight per lane

template <int M, bool kFloatOut>
__device__ __forceinline__ void store_row(void* y, int64_t n, int64_t row, const float (&acc)[M],
                                          const __nv_bfloat16* bias) {
  const float b = bias ? __bfloat162float(bias[row]) : 0.0f;
#pragma unroll
  for (int i = 0; i < M; ++i) {
    if constexpr (kFloatOut)
      static_cast<float*>(y)[i * n + row] = acc[i] + b;
    else
      static_cast<__nv_bfloat16*>(y)[i * n + row] = __float2bfloat16_rn(acc[i] + b);
  }
}

template <int M, bool kFloatOut>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                const __nv_bfloat16* __restrict__ bias, void* __restrict__ y, int64_t n,
                int64_t k) {
  wait_for_producer();
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t{kWarps} + (threadIdx.x >> 5);
  if (row >= n) return;
  const __nv_bfloat16* wr = w + row * k;
  float acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0.0f;
  constexpr int64_t kStep = 32 * kVec;  // elements of a row one warp pass covers
  int64_t c = int64_t{lane} * kVec;
  // Main loop: kUnroll independent 16-byte loads of w per lane before their first use.
  for (; c + (kUnroll - 1) * kStep < k; c += kUnroll * kStep) {
    float wv[kUnroll][kVec];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load8(wr + c + u * kStep, wv[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int i = 0; i < M; ++i) {
        float xv[kVec];
        load8(x + i * k + c + u * kStep, xv);
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[i] = fmaf(wv[u][e], xv[e], acc[i]);
      }
  }
  for (; c < k; c += kStep) {
    float wv[kVec];
    load8(wr + c, wv);
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float xv[kVec];
      load8(x + i * k + c, xv);
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[i] = fmaf(wv[e], xv[e], acc[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = warp_sum(acc[i]);
  if (lane == 0) store_row<M, kFloatOut>(y, n, row, acc, bias);
}

// ---- kStreaming: w read once, 16 loads of 16 bytes in flight per lane ----------------------

// A weight chunk read once: no L1 allocation (x, read by every warp, keeps L1 to itself).
__device__ __forceinline__ uint4 load_weights(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// A warp's share of the product: its output rows r = first, first + stride, ... below n, each
// the dot product of R rows of w (2 for gemv_silu: the gate row r and the up row r + n) with the
// M rows of x. The warp's loads form one stream over its rows: each lane holds G 16-byte chunks
// of each of the R rows per group, two groups in flight (16 chunks per lane), and the next row's
// loads are in flight while a row's sum is reduced and stored.
template <int R>
struct RowStream {
  static constexpr int G = 8 / R;
  static constexpr int64_t kGroup = G * 32;  // chunks of a row one group covers
  const uint4* w;                            // [R * n rows of `chunks` 16-byte chunks]
  int64_t n, chunks, first, stride;
  int lane;

  struct Cursor {
    int64_t row, group;  // the output row and the group of its chunks
  };

  __device__ __forceinline__ void advance(Cursor& c, int64_t groups) const {
    if (++c.group == groups) c.group = 0, c.row += stride;
  }

  __device__ __forceinline__ void fetch(uint4 (&buf)[R][G], const Cursor& c) const {
#pragma unroll
    for (int u = 0; u < G; ++u) {
      const int64_t j = c.group * kGroup + u * 32 + lane;
#pragma unroll
      for (int r = 0; r < R; ++r)
        buf[r][u] =
            c.row < n && j < chunks ? load_weights(w + (r * n + c.row) * chunks + j) : uint4{};
    }
  }

  template <int M>
  __device__ __forceinline__ void consume(const uint4 (&buf)[R][G], const Cursor& c,
                                          const __nv_bfloat16* x, int64_t k,
                                          float (&acc)[R][M]) const {
#pragma unroll
    for (int u = 0; u < G; ++u) {
      const int64_t j = c.group * kGroup + u * 32 + lane;
      if (j >= chunks) break;
#pragma unroll
      for (int i = 0; i < M; ++i) {
        float xv[kVec];
        load8(x + i * k + j * kVec, xv);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const Bf16x8 wv = reinterpret_cast<const Bf16x8&>(buf[r][u]);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 w2 = __bfloat1622float2(wv.h[e]);
            acc[r][i] = fmaf(w2.x, xv[2 * e], acc[r][i]);
            acc[r][i] = fmaf(w2.y, xv[2 * e + 1], acc[r][i]);
          }
        }
      }
    }
  }

  // done(row, acc) for each of the warp's rows, acc[r][i] summed over the warp (every lane).
  template <int M, typename Done>
  __device__ __forceinline__ void run(const __nv_bfloat16* x, int64_t k, Done done) const {
    const int64_t groups = (chunks + kGroup - 1) / kGroup;
    Cursor fetched{first, 0}, used{first, 0};
    uint4 a[R][G], b[R][G];
    fetch(a, fetched);
    advance(fetched, groups);
    fetch(b, fetched);
    advance(fetched, groups);
    wait_for_producer();  // x is the kernel before's output; w is not
    release_dependents();
    float acc[R][M];
    auto reset = [&] {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < M; ++i) acc[r][i] = 0.0f;
    };
    auto step = [&](uint4(&buf)[R][G]) {
      consume<M>(buf, used, x, k, acc);
      fetch(buf, fetched);  // past the warp's last row: nothing loaded
      advance(fetched, groups);
      if (used.group == groups - 1) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < M; ++i) acc[r][i] = warp_sum(acc[r][i]);
        done(used.row, acc);
        reset();
      }
      advance(used, groups);
    };
    reset();
#pragma unroll 1
    while (used.row < n) {
      step(a);
      if (used.row >= n) break;
      step(b);
    }
  }
};

// One wave of blocks: every warp streams its rows (RowStream) from the start to the end.
template <int M, bool kFloatOut>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_stream_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                       const __nv_bfloat16* __restrict__ bias, void* __restrict__ y, int64_t n,
                       int64_t k) {
  const RowStream<1> s{reinterpret_cast<const uint4*>(w),
                       n,
                       k / kVec,
                       blockIdx.x * int64_t{kWarps} + (threadIdx.x >> 5),
                       int64_t{gridDim.x} * kWarps,
                       static_cast<int>(threadIdx.x & 31)};
  s.run<M>(x, k, [&](int64_t row, const float(&acc)[1][M]) {
    if (s.lane == 0) store_row<M, kFloatOut>(y, n, row, acc[0], bias);
  });
}

template <int M>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_silu_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                     __nv_bfloat16* __restrict__ act, int64_t inter, int64_t k) {
  const RowStream<2> s{reinterpret_cast<const uint4*>(w),
                       inter,
                       k / kVec,
                       blockIdx.x * int64_t{kWarps} + (threadIdx.x >> 5),
                       int64_t{gridDim.x} * kWarps,
                       static_cast<int>(threadIdx.x & 31)};
  s.run<M>(x, k, [&](int64_t row, const float(&acc)[2][M]) {
    if (s.lane != 0) return;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      // silu_mul's arithmetic on the bf16 values gemv would have written.
      const float g = __bfloat162float(__float2bfloat16_rn(acc[0][i]));
      const float u = __bfloat162float(__float2bfloat16_rn(acc[1][i]));
      act[i * inter + row] = __float2bfloat16_rn(g / (1.0f + __expf(-g)) * u);
    }
  });
}

// The streaming kernels' grid: the blocks of one wave on this device (as many as fit on every SM
// at once), fewer when the product has fewer rows than that wave has warps.
unsigned wave_blocks(const void* kernel, int64_t rows) {
  static std::mutex mutex;
  static std::map<const void*, int> per_sm;  // blocks of a kernel one SM holds
  int device = 0, sms = 0, blocks = 0;
  check_cuda(cudaGetDevice(&device), "gemv device");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SMs");
  {
    const std::lock_guard<std::mutex> lock(mutex);
    auto it = per_sm.find(kernel);
    if (it == per_sm.end()) {
      check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kWarps * 32, 0),
                 "gemv occupancy");
      it = per_sm.emplace(kernel, blocks).first;
    }
    blocks = it->second;
  }
  const int64_t wave = int64_t{blocks} * sms;
  return static_cast<unsigned>(std::min(wave, (rows + kWarps - 1) / kWarps));
}

template <int M>
void launch(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, void* y,
            bool y_float32, int64_t n, int64_t k, cudaStream_t stream, GemvConfig c) {
  if (n == 0) return;
  const bool stream_kernel = c.kernel == GemvKernel::kStreaming;
  auto* kernel = y_float32 ? (stream_kernel ? gemv_stream_kernel<M, true> : gemv_kernel<M, true>)
                           : (stream_kernel ? gemv_stream_kernel<M, false> : gemv_kernel<M, false>);
  const dim3 blocks(stream_kernel ? wave_blocks(reinterpret_cast<const void*>(kernel), n)
                                  : static_cast<unsigned>((n + kWarps - 1) / kWarps));
  check_cuda(cuda::launch(c.pdl, kernel, blocks, dim3(kWarps * 32), 0, stream, x, w, bias, y, n, k),
             "gemv");
}

template <int M>
void launch_silu(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* act, int64_t inter,
                 int64_t k, cudaStream_t stream, bool pdl) {
  if (inter == 0) return;
  const dim3 blocks(wave_blocks(reinterpret_cast<const void*>(gemv_silu_kernel<M>), inter));
  check_cuda(cuda::launch(pdl, gemv_silu_kernel<M>, blocks, dim3(kWarps * 32), 0, stream, x, w, act,
                          inter, k),
             "gemv_silu");
}

void check_rows(int64_t m, const char* what) {
  if (m > kGemvMaxRows)
    throw Error(ErrorKind::kInternal, "m", std::string(what) + " takes at most 4 rows");
}

}  // namespace

void gemv(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, void* y,
          bool y_float32, int64_t m, int64_t n, int64_t k, cudaStream_t stream, GemvConfig config) {
  check_rows(m, "gemv");
  switch (m) {
    case 0:
      return;
    case 1:
      return launch<1>(x, w, bias, y, y_float32, n, k, stream, config);
    case 2:
      return launch<2>(x, w, bias, y, y_float32, n, k, stream, config);
    case 3:
      return launch<3>(x, w, bias, y, y_float32, n, k, stream, config);
    default:
      return launch<4>(x, w, bias, y, y_float32, n, k, stream, config);
  }
}

void gemv_silu(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up, __nv_bfloat16* act,
               int64_t m, int64_t inter, int64_t k, cudaStream_t stream, bool pdl) {
  check_rows(m, "gemv_silu");
  switch (m) {
    case 0:
      return;
    case 1:
      return launch_silu<1>(x, w_gate_up, act, inter, k, stream, pdl);
    case 2:
      return launch_silu<2>(x, w_gate_up, act, inter, k, stream, pdl);
    case 3:
      return launch_silu<3>(x, w_gate_up, act, inter, k, stream, pdl);
    default:
      return launch_silu<4>(x, w_gate_up, act, inter, k, stream, pdl);
  }
}

}  // namespace flashserve::model::cuda
