#include "model/decode_kernels.h"

#include "common/env_switch.h"

namespace flashserve::model {

DecodeKernelOptions decode_kernel_options_from_env(const char* gemv, const char* pdl,
                                                   const char* pdl_attention,
                                                   const char* early_weights) {
  DecodeKernelOptions o;
  if (gemv != nullptr && *gemv != '\0')
    o.gemv_rows = env_switch(gemv, "FLASHSERVE_GEMV", true) ? kGemvMaxProductRows : 0;
  o.pdl = env_switch(pdl, "FLASHSERVE_PDL", o.pdl);
  o.pdl_attention = env_switch(pdl_attention, "FLASHSERVE_PDL_ATTENTION", o.pdl_attention);
  o.early_weights = env_switch(early_weights, "FLASHSERVE_EARLY_WEIGHTS", o.early_weights);
  return o;
}

DecodeFusion decode_fusion_from_env(const char* norm, const char* silu) {
  DecodeFusion f;
  f.norm = env_switch(norm, "FLASHSERVE_FUSE_NORM", f.norm);
  f.silu = env_switch(silu, "FLASHSERVE_FUSE_SILU", f.silu);
  return f;
}

}  // namespace flashserve::model
