// The sm90 backward kernels for head dim 128 (bf16/fp16, masked or not).
#include "bwd_launch_template.h"

namespace flashserve::attention::sm90 {
template void run_bwd_hdim<128>(const sm80::BwdParams&, const BwdArgs&);
}  // namespace flashserve::attention::sm90
