// A non-owning view of a strided tensor: pointer, element type, shape and strides (in elements),
// and the device that holds the memory. The attention API takes these so that any framework's
// tensor (PyTorch, CuPy, JAX, NumPy through DLPack or the array interfaces) can be passed without a
// copy and without compiling against that framework.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace flashserve {

// kFloat8E4M3 is float8_e4m3fn (src/common/float8.h): attention inputs with descale factors
// (attention.h), on the CPU path until the GPU kernels exist.
enum class DType : int32_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kInt32 = 3,
  kFloat64 = 4,
  kFloat8E4M3 = 5
};

enum class DeviceType : int32_t { kCPU = 0, kCUDA = 1 };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int32_t index = 0;
  bool operator==(const Device&) const = default;
};

inline constexpr int kMaxRank = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device{};
  int32_t rank = 0;
  int64_t shape[kMaxRank] = {0, 0, 0, 0};
  int64_t stride[kMaxRank] = {0, 0, 0, 0};

  bool defined() const { return data != nullptr || rank > 0; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// A contiguous (row-major) view of `data` with the given shape.
TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> shape,
                     Device device = {});

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
std::string shape_string(const TensorView& t);

}  // namespace flashserve
