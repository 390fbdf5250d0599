// Test helpers for the model's GPU tests: a device copy of a host vector and bf16 host conversion;
// the "no CUDA device" skip comes from support/cuda_skip.h, shared with the attention GPU tests.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/half.h"
#include "support/cuda_skip.h"

namespace flashserve::testing {

// Owns device memory holding a copy of a host vector; download() reads it back.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes() ? bytes() : 16), cudaSuccess);
    if (bytes())
      EXPECT_EQ(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit DeviceBuffer(size_t n, T fill = T{}) : DeviceBuffer(std::vector<T>(n, fill)) {}
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return ptr_; }
  template <typename U>
  U* as() const {
    return reinterpret_cast<U*>(ptr_);
  }
  size_t bytes() const { return n_ * sizeof(T); }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (bytes())
      EXPECT_EQ(cudaMemcpy(h.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<bf16_t> random_bf16(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<bf16_t> v(n);
  for (auto& x : v) x = to_bf16(dist(rng));
  return v;
}

inline double f(bf16_t x) {
  return static_cast<double>(to_float(x));
}
inline double round_bf16(double x) {
  return static_cast<double>(to_float(to_bf16(static_cast<float>(x))));
}

// A bf16 result against its float64 reference: within `ulps` units of bf16 rounding (2^-8
// relative) of the reference's magnitude, plus `abs_floor` for values that cancel to near zero.
inline bool bf16_close(double got, double want, double ulps = 1.0, double abs_floor = 1e-6) {
  return std::abs(got - want) <= ulps * std::ldexp(std::abs(want), -8) + abs_floor;
}

}  // namespace flashserve::testing
