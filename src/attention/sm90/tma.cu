#include "tma.h"

namespace flashserve::attention::sm90 {

CUresult encode_tensor_map(const TensorMapSpec& spec, CUtensorMap* out, cudaError_t* entry_error) {
  using Encode =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Encode encode = nullptr;
  static cudaError_t lookup = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    // The 12.0 ABI of the function (unchanged since it appeared in 12.0).
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                     cudaEnableDefault, &found);
    if (e == cudaSuccess && found != cudaDriverEntryPointSuccess) e = cudaErrorSymbolNotFound;
    if (e == cudaSuccess) encode = reinterpret_cast<Encode>(fn);
    return e;
  }();
  *entry_error = lookup;
  if (lookup != cudaSuccess) return CUDA_ERROR_NOT_FOUND;
  cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  return encode(out, spec.dtype, static_cast<cuuint32_t>(spec.rank), const_cast<void*>(spec.base),
                spec.dims, spec.strides, spec.box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                spec.swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace flashserve::attention::sm90
