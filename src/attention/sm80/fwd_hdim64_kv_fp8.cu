// sm80 forward kernels of head dim 64 over an fp8 (e4m3) paged KV cache (bfloat16 q; decode and
// masked prefill tiles, launch_template.h run_fwd_kv_fp8_impl).
#include "launch_template.h"

namespace flashserve::attention::sm80 {

template <>
void run_fwd_kv_fp8<64>(const FwdParams& params, const FwdLaunch& launch) {
  run_fwd_kv_fp8_impl<64>(params, launch);
}

}  // namespace flashserve::attention::sm80
