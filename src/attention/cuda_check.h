// The CUDA backend's one way of turning a runtime status into flashserve::Error (kind kCuda).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashserve/error.h"

namespace flashserve::attention {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Error(ErrorKind::kCuda, "", std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace flashserve::attention
