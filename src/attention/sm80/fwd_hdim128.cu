// sm80 forward kernels for head dim 128 (bf16 and fp16, with and without a mask).
#include "launch_template.h"

namespace flashserve::attention::sm80 {

template <>
void run_fwd<128>(const FwdParams& params, const FwdLaunch& launch) {
  run_fwd_impl<128>(params, launch);
}

}  // namespace flashserve::attention::sm80
