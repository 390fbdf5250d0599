// The sm80 backward kernels at head dim 64 (bwd_launch_template.h).
#include "bwd_launch_template.h"

namespace flashserve::attention::sm80 {

template void run_bwd<64>(const BwdParams& params, const BwdLaunch& launch);

}  // namespace flashserve::attention::sm80
