// What cp.async needs of every tensor a CUDA kernel loads tiles of: the base pointer and every
// row stride 16-byte aligned (a multiple of 8 16-bit elements). Dimensions of size 1 have no
// meaningful stride. The forward dispatch and the backward both check their tensors here.
#pragma once

#include <cstdint>
#include <string>

#include "common/str_cat.h"
#include "flashserve/error.h"
#include "flashserve/tensor.h"

namespace flashserve::attention {

// Throws kUnsupported naming `name`; `user` ("the CUDA kernels", "the CUDA backward") says who
// needs the alignment.
inline void check_aligned(const TensorView& t, const char* name, const char* user) {
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    throw Error(ErrorKind::kUnsupported, name,
                str_cat("data pointer must be 16-byte aligned for ", user));
  const int64_t elem = static_cast<int64_t>(dtype_size(t.dtype));
  for (int i = 0; i + 1 < t.rank; ++i)
    if (t.shape[i] > 1 && (t.stride[i] * elem) % 16 != 0)
      throw Error(ErrorKind::kUnsupported, name,
                  str_cat("stride ", t.stride[i], " of dimension ", i,
                          " must be a multiple of 16 bytes for ", user));
}

// Why TMA (the sm90 kernels' tensor maps) cannot describe `t`'s strides, or "": every dimension
// but the last that is stepped along (size > 1) needs a positive stride below 2^40 bytes (the
// 16-byte multiple is check_aligned's). Shared by the forward's and the backward's sm90 checks.
inline std::string tma_stride_problem(const TensorView& t, const char* name) {
  for (int i = 0; i + 1 < t.rank; ++i)
    if (t.shape[i] > 1 && (t.stride[i] <= 0 || t.stride[i] >= (int64_t{1} << 39)))
      return str_cat(name, "'s stride ", t.stride[i], " of dimension ", i,
                     " (TMA needs positive strides below 2^40 bytes)");
  return "";
}

}  // namespace flashserve::attention
