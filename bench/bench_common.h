// What the CUDA benchmarks share besides CUDA_OK: random 16-bit inputs (and as e4m3), the device
// check, the median kernel time of repeated calls; and (cli_args.h) their command lines.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "cli_args.h"
#include "cuda_ok.h"

// Uniform values in [-1, 1) from a counter hash, as 16-bit floats (bf16 or fp16 bits).
// (static: each benchmark is one translation unit.)
static __global__ void fill_random(uint16_t* x, int64_t n, uint32_t seed, bool bf16 = true) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    const float f = (h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    x[i] =
        bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(f)) : __half_as_ushort(__float2half_rn(f));
  }
}

// x (bf16 bits) as e4m3 codes of x * scale (saturating): fill_random's values as fp8 inputs.
static __global__ void to_e4m3(const uint16_t* x, uint8_t* y, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float f = __bfloat162float(__ushort_as_bfloat16(x[i])) * scale;
    y[i] = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
  }
}

// Device 0's properties, or false after printing "<program>: skipped: no CUDA device".
inline bool cuda_device_or_skip(const char* program, cudaDeviceProp* prop) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("%s: skipped: no CUDA device\n", program);
    return false;
  }
  CUDA_OK(cudaGetDeviceProperties(prop, 0));
  return true;
}

// Median time in ms of `iters` calls of fn, each bracketed by its own pair of events.
// pause_ms of idle time come first: the H200 runs at its power cap (throttle reason "SW power cap"
// during the grid), and the clock it settles to lags behind the power drawn in the preceding
// second; a pause gives every shape, here and in sdpa_compare.py, a comparable start.
template <typename Fn>
float median_ms(Fn&& fn, int warmup, int iters, int pause_ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  for (int i = 0; i < warmup; ++i) fn();
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) CUDA_OK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    CUDA_OK(cudaEventRecord(ev[2 * i]));
    fn();
    CUDA_OK(cudaEventRecord(ev[2 * i + 1]));
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) CUDA_OK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) CUDA_OK(cudaEventDestroy(e));
  std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
  return ms[iters / 2];
}
