// CUDA status → flashserve::Error (kind kCuda) for the model's kernels and runner.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashserve/error.h"

namespace flashserve::model::cuda {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Error(ErrorKind::kCuda, "", std::string(what) + ": " + cudaGetErrorString(err));
}

// After a launch: a bad configuration shows here, not at the next synchronizing call.
inline void check_launch(const char* kernel) {
  check_cuda(cudaGetLastError(), kernel);
}

}  // namespace flashserve::model::cuda
