// GPU test support: the device copies of an AttentionCase's buffers (tests skip with "skipped: no
// CUDA device" without a device: support/cuda_skip.h).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "support/attention_case.h"
#include "support/cuda_skip.h"

namespace flashserve::testing {

inline constexpr Device kGpu{DeviceType::kCUDA, 0};

// Device copies of every buffer of a case, freed on destruction.
class DeviceCopy {
 public:
  explicit DeviceCopy(AttentionCase& c) : c_(c) {
    for (const auto& b : c.buffers()) {
      void* d = nullptr;
      if (b.bytes) {
        EXPECT_EQ(cudaMalloc(&d, b.bytes), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(d, b.host, b.bytes, cudaMemcpyHostToDevice), cudaSuccess);
      }
      ptrs_.push_back(d);
    }
  }
  ~DeviceCopy() {
    for (void* p : ptrs_) cudaFree(p);
    cudaFree(workspace_);
  }
  // Views of the device copies, with the split-KV workspace the call asks for (so that automatic
  // splitting, num_splits = 0, can split), and at least `at_least` bytes (a plan's).
  AttentionParams params(size_t at_least = 0) {
    AttentionParams p = c_.params(kGpu, ptrs_.data());
    size_t size = 0;
    try {
      size = attention_workspace_size(p);
    } catch (const Error&) {  // a call the kernels refuse: attention_forward names why
    }
    const size_t bytes = std::max(size, at_least);
    if (bytes > workspace_bytes_) {
      cudaFree(workspace_);
      workspace_ = nullptr;
      EXPECT_EQ(cudaMalloc(&workspace_, bytes), cudaSuccess);
      workspace_bytes_ = bytes;
    }
    p.workspace = workspace_;
    p.workspace_bytes = workspace_bytes_;
    return p;
  }
  // Copies out and lse back into the case's host buffers.
  void download() { copy_outputs(cudaMemcpyDeviceToHost); }
  // Copies the case's host out and lse (poisoned again: AttentionCase::poison_outputs) over the
  // device's, for a second run on the same copies.
  void upload_outputs() { copy_outputs(cudaMemcpyHostToDevice); }

 private:
  void copy_outputs(cudaMemcpyKind kind) {
    auto bufs = c_.buffers();
    for (int i : {AttentionCase::kOut, AttentionCase::kLse}) {
      if (!bufs[i].bytes) continue;
      const bool down = kind == cudaMemcpyDeviceToHost;
      EXPECT_EQ(cudaMemcpy(down ? bufs[i].host : ptrs_[i], down ? ptrs_[i] : bufs[i].host,
                           bufs[i].bytes, kind),
                cudaSuccess);
    }
  }

  AttentionCase& c_;
  std::vector<void*> ptrs_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace flashserve::testing
