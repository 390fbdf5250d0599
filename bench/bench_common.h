// What the CUDA benchmarks share besides CUDA_OK: the median kernel time of repeated calls and
// the comma-separated integer lists of their command lines.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "cuda_ok.h"

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

// "4096,8192" -> {4096, 8192}.
inline std::vector<int> parse_int_list(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}
