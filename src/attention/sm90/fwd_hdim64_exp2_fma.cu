// The sm90 forward kernels for head dim 64 with part of the softmax's exponentials on the FMA pipe
// (tile_config.h Exp2Fma, FLASHSERVE_SM90_EXP2_FMA; bf16/fp16, causal or not): run_fwd_hdim's
// a.exp2_fma path, defined here only, so that fwd_hdim64.cu does not instantiate it.
#include "launch_template.h"

namespace flashserve::attention::sm90 {

template <int kHeadDim>
void run_fwd_exp2_fma_hdim(const FwdArgs& a) {
  run_fwd_tile_set<kHeadDim, Exp2Fma>(a);
}
template void run_fwd_exp2_fma_hdim<64>(const FwdArgs&);

}  // namespace flashserve::attention::sm90
