#include <cuda_fp16.h>

#include "flashserve/error.h"
#include "model/cuda/check.h"
#include "model/cuda/convert.h"
#include "model/sampling.h"

namespace flashserve::model::cuda {
namespace {

template <typename T>
__device__ __forceinline__ float as_float(T v);
template <>
__device__ __forceinline__ float as_float(float v) {
  return v;
}
template <>
__device__ __forceinline__ float as_float(__half v) {
  return __half2float(v);
}

template <typename T>
__global__ void convert_kernel(const T* __restrict__ src, __nv_bfloat16* __restrict__ dst,
                               int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    dst[i] = __float2bfloat16_rn(as_float(src[i]));
}

__global__ void fill_kernel(__nv_bfloat16* __restrict__ dst, int64_t n, uint64_t seed, float scale,
                            float offset) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
    const float u = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
    dst[i] = __float2bfloat16_rn(offset + scale * u);
  }
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 132 * 32 ? blocks : 132 * 32);
}

}  // namespace

void convert_to_bf16(const void* src, DType src_dtype, __nv_bfloat16* dst, int64_t n,
                     cudaStream_t stream) {
  if (n == 0) return;
  switch (src_dtype) {
    case DType::kBFloat16:
      check_cuda(cudaMemcpyAsync(dst, src, n * 2, cudaMemcpyDeviceToDevice, stream), "copy bf16");
      return;
    case DType::kFloat16:
      convert_kernel<<<grid_for(n), 256, 0, stream>>>(static_cast<const __half*>(src), dst, n);
      break;
    case DType::kFloat32:
      convert_kernel<<<grid_for(n), 256, 0, stream>>>(static_cast<const float*>(src), dst, n);
      break;
    default:
      throw Error(ErrorKind::kUnsupported, "dtype",
                  std::string("weights of dtype ") + dtype_name(src_dtype) + " cannot be uploaded");
  }
  check_launch("convert_to_bf16");
}

void fill_uniform_bf16(__nv_bfloat16* dst, int64_t n, uint64_t seed, float scale, float offset,
                       cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), 256, 0, stream>>>(dst, n, seed, scale, offset);
  check_launch("fill_uniform_bf16");
}

}  // namespace flashserve::model::cuda
