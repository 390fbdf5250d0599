// Weight preparation on the device: conversion of fp16/fp32 checkpoint tensors to bf16, and the
// random bf16 weights the benchmark uses instead of a 14.5 GB file.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "flashserve/tensor.h"

namespace flashserve::model::cuda {

// dst[i] = bf16(src[i]) for src of dtype kFloat16, kFloat32 or kBFloat16 (a copy).
void convert_to_bf16(const void* src, DType src_dtype, __nv_bfloat16* dst, int64_t n,
                     cudaStream_t stream);

// dst[i] = offset + scale * (a uniform in [-1, 1) from a hash of (seed, i)): reproducible for a
// seed whatever the launch shape.
void fill_uniform_bf16(__nv_bfloat16* dst, int64_t n, uint64_t seed, float scale, float offset,
                       cudaStream_t stream);

}  // namespace flashserve::model::cuda
