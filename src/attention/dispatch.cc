// The one place that chooses a backend for a call.
#include "backends.h"

namespace flashserve {

void validate(const AttentionParams& params) {
  attention::describe(params);
}

void attention_forward(const AttentionParams& params) {
  const attention::Problem problem = attention::describe(params);
  if (problem.device.type == DeviceType::kCPU) return attention::cpu_forward(params, problem);
#if defined(FLASHSERVE_WITH_CUDA)
  return attention::cuda_forward(params, problem);
#else
  throw Error(ErrorKind::kUnsupported, "q",
              "is a CUDA tensor, but this flashserve was built without CUDA");
#endif
}

size_t attention_workspace_size(const AttentionParams& params) {
  const attention::Problem problem = attention::describe(params);
  if (problem.device.type == DeviceType::kCPU) return 0;
#if defined(FLASHSERVE_WITH_CUDA)
  return attention::cuda_workspace_size(params, problem);
#else
  return 0;
#endif
}

}  // namespace flashserve
