#include "model/decode_kernels.h"

#include "common/env_switch.h"

namespace flashserve::model {

DecodeKernelOptions decode_kernel_options_from_env(const char* gemv, const char* pdl) {
  DecodeKernelOptions o;
  o.gemv = env_switch(gemv, "FLASHSERVE_GEMV", o.gemv);
  o.pdl = env_switch(pdl, "FLASHSERVE_PDL", o.pdl);
  return o;
}

}  // namespace flashserve::model
