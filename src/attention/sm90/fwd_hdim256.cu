// The sm90 forward kernels for head dim 256 (bf16/fp16, causal or not).
#include "launch_template.h"

namespace flashserve::attention::sm90 {
template void run_fwd_hdim<256>(const FwdArgs&);
}  // namespace flashserve::attention::sm90
