// The paged KV cache's element type (--kv-cache-dtype, as vLLM spells it):
//   auto         the runner's own type: bfloat16 on the CUDA runner, float32 on the CPU runner
//   bf16         bfloat16 (also "bfloat16")
//   fp8          float8_e4m3fn (also "fp8_e4m3"): half of bf16's bytes, so twice the tokens in
//                the same memory. Each K and V element is stored as e4m3(x / scale) with a static
//                scale per (layer, KV head), K and V apart, and read back as code x scale by the
//                attention (its k_descale / v_descale). The scales default to 1.0, vLLM's default
//                when a checkpoint carries no calibrated k_scale / v_scale; values past 448 x scale
//                saturate to +-448 x scale (common/float8.h: e4m3 has no infinity, and a NaN
//                would poison every row that reads the key).
// vLLM's fp8_e5m2 is refused by name: FlashAttention-3's fp8 path and our kernels are e4m3.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashserve::model {

enum class KvCacheDtype { kAuto, kBf16, kFp8E4M3 };

// Parses a --kv-cache-dtype value; Error(kInvalidArgument, "kv_cache_dtype") names what is
// accepted (and why fp8_e5m2 is not).
KvCacheDtype parse_kv_cache_dtype(const std::string& value);
const char* kv_cache_dtype_name(KvCacheDtype dtype);  // "auto", "bf16", "fp8_e4m3"

// Bytes of one cached element on a runner whose own KV type has `auto_bytes` (2 on the GPU, 4 on
// the CPU).
int64_t kv_cache_element_bytes(KvCacheDtype dtype, int64_t auto_bytes);

// What a runner's KV pool stores: the dtype and, for fp8, the scales of K and V per
// (layer, KV head) (empty: 1.0 everywhere).
struct KvCacheConfig {
  KvCacheDtype dtype = KvCacheDtype::kAuto;
  std::vector<float> k_scales, v_scales;  // [layers * kv_heads], or empty
};

// Checks a runner's KvCacheConfig for `pairs` (layer, KV head) pairs: scales only beside an fp8
// cache, either none or one per pair, each a positive normal float. Error(kInvalidArgument,
// "kv_cache") naming what is wrong. Both runners' set_kv_cache call it.
void check_kv_cache_config(const KvCacheConfig& kv, size_t pairs);

// Whether the CUDA runner takes an fp8 cache by default (FLASHSERVE_CUDA_FP8_KV unset): off. On
// the H200 it is correct but its decode attention takes 2.2x bf16's time (docs/fp8.md): twice the
// tokens for slower steps is a trade the user opts into, until the kernels stage the codes
// asynchronously. Must agree with the attention layer's kFp8KvCacheByDefault
// (attention/cuda/plan.h), which gates the kernels themselves;
// KvCacheDtype.CudaSwitchAgreesWithTheKernels checks it.
inline constexpr bool kCudaFp8KvCacheByDefault = false;

// FLASHSERVE_CUDA_FP8_KV (`value`; null: unset), strictly: unset or empty
// kCudaFp8KvCacheByDefault, "1" on, "0" off, anything else Error(kInvalidArgument) naming the
// variable.
bool cuda_fp8_kv_cache_enabled(const char* value);

// For --device cuda with an fp8 cache while the switch is off: Error(kUnsupported,
// "kv_cache_dtype") saying how to turn it on. Nothing otherwise. The CLI, load_model and the
// CUDA runner's set_kv_cache call it, so the refusal is the same wherever it is met.
void refuse_cuda_fp8_kv_cache_if_off(KvCacheDtype dtype, const char* value);

}  // namespace flashserve::model
