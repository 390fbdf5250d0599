// What every CUDA entry point of the attention layer shares: the one way of turning a runtime
// status into flashserve::Error (kind kCuda), the device guard, and FLASHSERVE_CHECK_INDICES.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/cuda_device_count.h"
#include "flashserve/attention.h"
#include "flashserve/error.h"

namespace flashserve::attention {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw Error(ErrorKind::kCuda, "", std::string(what) + ": " + cudaGetErrorString(err));
}

// Makes `device` current for the call and restores the caller's device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (const cudaError_t err = cudaGetDevice(&previous_); err != cudaSuccess) {
      cuda_device_count();  // no GPU or no driver: says so
      check_cuda(err, "cudaGetDevice");
    }
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// FLASHSERVE_CHECK_INDICES=1 (any value but empty or "0"): a debugging aid. The kernels trust the
// index tensors in device memory (reading them here would synchronize every call): an entry of
// block_table outside the pool reads out of bounds, and a max_seqlen_q/k below a real length
// leaves rows unwritten or a window unclamped. With the variable set, the index tensors are
// copied to the host (the call synchronizes its stream) and checked entry by entry, as on the
// CPU path, with the same errors.
inline bool check_indices_requested() {
  const char* v = std::getenv("FLASHSERVE_CHECK_INDICES");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

// FLASHSERVE_CHECK_INDICES: copies each defined int32 index view (from its first entry to its
// last; validation checked shapes and strides) into `copies`, points the view at its copy, and
// waits for the copies. The views are those of a host-side duplicate of the call's parameters.
inline void copy_indices_to_host(std::initializer_list<TensorView*> views,
                                 std::vector<std::vector<int32_t>>& copies, cudaStream_t stream) {
  copies.reserve(views.size());  // the views point into the copies: no reallocation
  for (TensorView* t : views) {
    if (!t->defined()) continue;
    int64_t span = t->numel() == 0 ? 0 : 1;
    if (span > 0)
      for (int i = 0; i < t->rank; ++i) span += (t->shape[i] - 1) * t->stride[i];
    copies.emplace_back(static_cast<size_t>(span > 0 ? span : 1));
    if (span > 0)
      check_cuda(cudaMemcpyAsync(copies.back().data(), t->data, span * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, stream),
                 "cudaMemcpyAsync (FLASHSERVE_CHECK_INDICES)");
    t->data = copies.back().data();
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (FLASHSERVE_CHECK_INDICES)");
}

}  // namespace flashserve::attention
