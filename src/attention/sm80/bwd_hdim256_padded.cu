// The sm80 backward kernels of head dim 256 for head dims 136-256 (padded, in two launches of half
// the output columns each: bwd_kernel.h BwdPaddedConfig).
#include "bwd_launch_template.h"

namespace flashserve::attention::sm80 {

template void run_bwd_padded<256>(const BwdParams& params, const BwdLaunch& launch);

}  // namespace flashserve::attention::sm80
