// sm80 forward kernels of head dim 256 for calls with smaller head dims (padded: bf16 and fp16,
// decode and masked prefill tiles, launch_template.h run_fwd_padded_impl).
#include "launch_template.h"

namespace flashserve::attention::sm80 {

template <>
void run_fwd_padded<256>(const FwdParams& params, const FwdLaunch& launch) {
  run_fwd_padded_impl<256>(params, launch);
}

}  // namespace flashserve::attention::sm80
