// A real device fault for the server's GPU test: a kernel that stores through a null pointer, so
// that the context gets cudaErrorIllegalAddress, a sticky error every later CUDA call returns.
#include <cuda_runtime.h>

#include "server_gpu/device_fault.h"

namespace flashserve::testing {
namespace {

__global__ void store_through(int* p) {
  p[threadIdx.x] = 1;
}

}  // namespace

void launch_illegal_store(void* stream) {
  // The pointer is a kernel argument, so the store cannot be proved invalid and left out.
  store_through<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(nullptr);
}

}  // namespace flashserve::testing
