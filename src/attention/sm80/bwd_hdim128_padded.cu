// The sm80 backward kernels of head dim 128 for calls with smaller head dims (padded: bwd_kernel.h
// BwdPaddedConfig).
#include "bwd_launch_template.h"

namespace flashserve::attention::sm80 {

template void run_bwd_padded<128>(const BwdParams& params, const BwdLaunch& launch);

}  // namespace flashserve::attention::sm80
