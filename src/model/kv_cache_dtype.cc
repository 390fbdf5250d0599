#include "model/kv_cache_dtype.h"

#include <cmath>
#include <limits>

#include "common/env_switch.h"
#include "flashserve/error.h"

namespace flashserve::model {

KvCacheDtype parse_kv_cache_dtype(const std::string& v) {
  if (v == "auto") return KvCacheDtype::kAuto;
  if (v == "bf16" || v == "bfloat16") return KvCacheDtype::kBf16;
  if (v == "fp8" || v == "fp8_e4m3") return KvCacheDtype::kFp8E4M3;
  if (v == "fp8_e5m2")
    throw Error(ErrorKind::kInvalidArgument, "kv_cache_dtype",
                "'fp8_e5m2' is not supported: the fp8 KV cache is e4m3 (fp8, fp8_e4m3), the "
                "format FlashAttention-3's fp8 path reads");
  throw Error(ErrorKind::kInvalidArgument, "kv_cache_dtype",
              "'" + v + "' is not one of auto, bf16, bfloat16, fp8, fp8_e4m3");
}

const char* kv_cache_dtype_name(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kBf16:
      return "bf16";
    case KvCacheDtype::kFp8E4M3:
      return "fp8_e4m3";
    default:
      return "auto";
  }
}

int64_t kv_cache_element_bytes(KvCacheDtype d, int64_t auto_bytes) {
  switch (d) {
    case KvCacheDtype::kBf16:
      return 2;
    case KvCacheDtype::kFp8E4M3:
      return 1;
    default:
      return auto_bytes;
  }
}

void check_kv_cache_config(const KvCacheConfig& kv, size_t n) {
  for (const auto* s : {&kv.k_scales, &kv.v_scales}) {
    if (!s->empty() && kv.dtype != KvCacheDtype::kFp8E4M3)
      throw Error(ErrorKind::kInvalidArgument, "kv_cache",
                  "scales apply to an fp8 cache, not a " +
                      std::string(kv_cache_dtype_name(kv.dtype)) + " one");
    if (!s->empty() && s->size() != n)
      throw Error(ErrorKind::kInvalidArgument, "kv_cache",
                  std::to_string(s->size()) + " scales given for " + std::to_string(n) +
                      " (layer, KV head) pairs");
    for (float x : *s)
      if (!(std::isfinite(x) && x >= std::numeric_limits<float>::min()))
        throw Error(ErrorKind::kInvalidArgument, "kv_cache",
                    "a scale must be a positive normal float, got " + std::to_string(x));
  }
}

bool cuda_fp8_kv_cache_enabled(const char* value) {
  return env_switch(value, "FLASHSERVE_CUDA_FP8_KV", kCudaFp8KvCacheByDefault);
}

void refuse_cuda_fp8_kv_cache_if_off(KvCacheDtype dtype, const char* value) {
  if (dtype != KvCacheDtype::kFp8E4M3 || cuda_fp8_kv_cache_enabled(value)) return;
  throw Error(ErrorKind::kUnsupported, "kv_cache_dtype",
              "fp8 on cuda: the CUDA fp8 KV cache is off by default (twice the tokens, but its "
              "attention is slower than bf16's for now: docs/fp8.md); set "
              "FLASHSERVE_CUDA_FP8_KV=1 to turn it on (or use auto or bf16, or --device cpu)");
}

}  // namespace flashserve::model
