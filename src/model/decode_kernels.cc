#include "model/decode_kernels.h"

#include <algorithm>

#include "common/env_switch.h"

namespace flashserve::model {

DecodeKernelOptions decode_kernel_options_from_env(const char* gemv, const char* pdl,
                                                   const char* l2_prefetch) {
  DecodeKernelOptions o;
  if (gemv != nullptr && *gemv != '\0')
    o.gemv_rows = env_switch(gemv, "FLASHSERVE_GEMV", true) ? kGemvMaxProductRows : 0;
  o.pdl = env_switch(pdl, "FLASHSERVE_PDL", o.pdl);
  o.l2_prefetch = env_switch(l2_prefetch, "FLASHSERVE_L2_PREFETCH", o.l2_prefetch);
  return o;
}

L2PrefetchBytes l2_prefetch_bytes(int64_t l2_bytes, int64_t o_weight_bytes) {
  L2PrefetchBytes b;
  if (l2_bytes <= 0) return b;
  b.o = std::min(std::max<int64_t>(o_weight_bytes, 0), l2_bytes / 4 * 3);
  b.ahead = l2_bytes / 4;
  return b;
}

DecodeFusion decode_fusion_from_env(const char* norm, const char* silu) {
  DecodeFusion f;
  f.norm = env_switch(norm, "FLASHSERVE_FUSE_NORM", f.norm);
  f.silu = env_switch(silu, "FLASHSERVE_FUSE_SILU", f.silu);
  return f;
}

}  // namespace flashserve::model
