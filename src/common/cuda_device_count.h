// The number of CUDA devices, for every layer's CUDA code (include only where CUDA is built).
#pragma once

#include <cuda_runtime.h>

#include "flashserve/error.h"

namespace flashserve {

// Without a GPU or its driver, Error(kUnsupported, "device", "no CUDA device") rather than the
// runtime's "driver version is insufficient".
inline int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the status the failed query left
    throw Error(ErrorKind::kUnsupported, "device", "no CUDA device");
  }
  return count;
}

}  // namespace flashserve
