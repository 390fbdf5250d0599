// Whether a CUDA device is there: GPU tests skip without one, with "skipped: no CUDA device".
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace flashserve::testing {

inline bool have_cuda_device() {
  static const bool have = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  }();
  return have;
}

#define SKIP_WITHOUT_CUDA()                                             \
  do {                                                                  \
    if (!have_cuda_device()) GTEST_SKIP() << "skipped: no CUDA device"; \
  } while (0)

}  // namespace flashserve::testing
