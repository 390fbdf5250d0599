// The sm90 float8_e4m3fn forward kernels with part of the softmax's exponentials on the FMA pipe
// (tile_config.h Exp2Fma, FLASHSERVE_SM90_EXP2_FMA; head dims 64, 128 (both key blocks) and 256,
// causal or not): run_fwd_fp8_hdim's a.exp2_fma path, defined here only, so that
// fwd_fp8_hdim{64,128,256}.cu do not instantiate it.
#include "launch_template.h"

namespace flashserve::attention::sm90 {

template <int kHeadDim>
void run_fwd_fp8_exp2_fma_hdim(const FwdArgs& a) {
  run_fwd_fp8_tile_set<kHeadDim, Exp2Fma, false>(a);
}
template void run_fwd_fp8_exp2_fma_hdim<64>(const FwdArgs&);
template void run_fwd_fp8_exp2_fma_hdim<128>(const FwdArgs&);
template void run_fwd_fp8_exp2_fma_hdim<256>(const FwdArgs&);

}  // namespace flashserve::attention::sm90
