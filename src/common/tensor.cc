#include "flashserve/tensor.h"

#include "flashserve/error.h"

namespace flashserve {

TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device) {
  TensorView t;
  if (shape.size() > static_cast<size_t>(kMaxRank))
    throw Error(ErrorKind::kInvalidArgument, "shape", "rank above 4 is not supported");
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.rank = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.stride[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kFloat8E4M3:
      return 1;
  }
  return 1;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat8E4M3:
      return "float8_e4m3fn";
  }
  return "unknown";
}

std::string shape_string(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

}  // namespace flashserve
