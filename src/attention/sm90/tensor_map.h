// Host side of the sm90 kernels' TMA: the 4-D tensor map of a [batch, seqlen, heads, d] tensor
// (the forward's q, k, v, out and the backward's q, k, v, dout), refused by name where TMA
// cannot describe it.
#pragma once

#include <cstdint>

#include "common/str_cat.h"
#include "flashserve/error.h"
#include "flashserve/tensor.h"
#include "tma.h"

namespace flashserve::attention::sm90 {

// A 4-D map of a [batch, seqlen, heads, d] tensor (d innermost) with boxes of `row_bytes` bytes
// of columns (128: 64 16-bit, 128 float8_e4m3fn or 32 fp32 columns, 128-byte swizzled; 64: the fp8
// tiles' d64 rows, 64-byte swizzled) x `rows` rows of one head of one sequence. Strides are in
// elements.
inline CUtensorMap make_map(const void* base, DType dtype, int batch, int seqlen, int heads, int d,
                            int64_t batch_stride, int64_t row_stride, int64_t head_stride, int rows,
                            const char* name, int row_bytes = 128) {
  TensorMapSpec spec{};
  spec.base = base;
  const int64_t elem = dtype == DType::kFloat8E4M3 ? 1 : dtype == DType::kFloat32 ? 4 : 2;
  spec.dtype = dtype == DType::kFloat8E4M3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
               : dtype == DType::kFloat32  ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
               : dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  spec.rank = 4;
  spec.dims[0] = static_cast<uint64_t>(d);
  spec.dims[1] = static_cast<uint64_t>(seqlen);
  spec.dims[2] = static_cast<uint64_t>(heads);
  spec.dims[3] = static_cast<uint64_t>(batch);
  // A dimension of size 1 is never stepped along: its stride may be anything the caller's view
  // holds (0 included), while TMA wants a positive multiple of 16 bytes.
  const int64_t sizes[3] = {seqlen, heads, batch};
  const int64_t strides[3] = {row_stride, head_stride, batch_stride};
  for (int i = 0; i < 3; ++i) {
    const int64_t bytes = strides[i] * elem;
    spec.strides[i] =
        static_cast<uint64_t>(sizes[i] <= 1 && (bytes <= 0 || bytes % 16) ? 16 : bytes);
  }
  spec.box[0] = static_cast<uint32_t>(row_bytes / elem);
  spec.box[1] = static_cast<uint32_t>(rows);
  spec.box[2] = 1;
  spec.box[3] = 1;
  spec.swizzle = row_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
  CUtensorMap map;
  cudaError_t entry = cudaSuccess;
  const CUresult r = encode_tensor_map(spec, &map, &entry);
  if (entry != cudaSuccess)
    throw Error(ErrorKind::kCuda, "",
                str_cat("cuTensorMapEncodeTiled not found through the driver entry point: ",
                        cudaGetErrorString(entry)));
  if (r != CUDA_SUCCESS)
    throw Error(ErrorKind::kUnsupported, name,
                str_cat("the sm90 kernel's TMA cannot describe this tensor (cuTensorMapEncodeTiled "
                        "error ",
                        static_cast<int>(r), ")"));
  return map;
}

// The fp8 forward's V^T (fp8_vt.h): [batch, h_kv, d, keys] bytes, keys innermost (a multiple of
// 128), boxes of `box_keys` keys (128: 128-byte swizzle; 64: 64-byte) x d rows of one head of one
// sequence.
inline CUtensorMap make_vt_map(const void* vt, int batch, int h_kv, int d, int64_t keys,
                               int box_keys) {
  TensorMapSpec spec{};
  spec.base = vt;
  spec.dtype = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  spec.rank = 4;
  spec.dims[0] = static_cast<uint64_t>(keys);
  spec.dims[1] = static_cast<uint64_t>(d);
  spec.dims[2] = static_cast<uint64_t>(h_kv);
  spec.dims[3] = static_cast<uint64_t>(batch);
  spec.strides[0] = static_cast<uint64_t>(keys);
  spec.strides[1] = static_cast<uint64_t>(keys * d);
  spec.strides[2] = static_cast<uint64_t>(keys * d * h_kv);
  spec.box[0] = static_cast<uint32_t>(box_keys);
  spec.box[1] = static_cast<uint32_t>(d);
  spec.box[2] = 1;
  spec.box[3] = 1;
  spec.swizzle = box_keys == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
  CUtensorMap map;
  cudaError_t entry = cudaSuccess;
  const CUresult r = encode_tensor_map(spec, &map, &entry);
  if (entry != cudaSuccess || r != CUDA_SUCCESS)
    throw Error(ErrorKind::kCuda, "v",
                str_cat("the sm90 fp8 kernel's map of V^T was refused (cuTensorMapEncodeTiled "
                        "error ",
                        static_cast<int>(r), ")"));
  return map;
}

}  // namespace flashserve::attention::sm90
