// The sm90 float8_e4m3fn forward kernels for head dim 64 (causal or not), and V^T's pre-pass.
#include "launch_template.h"

namespace flashserve::attention::sm90 {
template void run_fwd_fp8_hdim<64>(const FwdArgs&);
}  // namespace flashserve::attention::sm90
