#include "model/kv_cache_dtype.h"

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

}  // namespace flashserve::model
