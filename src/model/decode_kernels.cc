#include "model/decode_kernels.h"

#include <cstring>
#include <string>

#include "flashserve/error.h"

namespace flashserve::model {

bool env_switch(const char* value, const char* name, bool fallback) {
  if (value == nullptr || *value == '\0') return fallback;
  if (std::strcmp(value, "0") == 0) return false;
  if (std::strcmp(value, "1") == 0) return true;
  throw Error(ErrorKind::kInvalidArgument, name,
              std::string("must be 0 or 1, got \"") + value + "\"");
}

DecodeKernelOptions decode_kernel_options_from_env(const char* gemv, const char* pdl) {
  DecodeKernelOptions o;
  o.gemv = env_switch(gemv, "FLASHSERVE_GEMV", o.gemv);
  o.pdl = env_switch(pdl, "FLASHSERVE_PDL", o.pdl);
  return o;
}

}  // namespace flashserve::model
