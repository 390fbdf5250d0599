// The backends that dispatch chooses between. Each takes validated params and the resolved problem.
#pragma once

#include "cuda/plan.h"
#include "flashserve/attention.h"
#include "flashserve/error.h"
#include "problem.h"

namespace flashserve::attention {

// CPU: tiled online softmax, multi-threaded (reference/cpu_forward.cc).
void cpu_forward(const AttentionParams& params, const Problem& problem);

#if !defined(FLASHSERVE_WITH_CUDA)
// A CUDA tensor (`argument`) reaching a build without CUDA: every entry point refuses it alike.
[[noreturn]] inline void refuse_without_cuda(const char* argument) {
  throw Error(ErrorKind::kUnsupported, argument,
              "is a CUDA tensor, but this flashserve was built without CUDA");
}
#endif

#if defined(FLASHSERVE_WITH_CUDA)
// CUDA: the sm80 kernels (FlashAttention-2 style, sm80/) and, when built with 90a, the Hopper
// kernel (sm90/), chosen per call by cuda_dispatch.cu. Throws kUnsupported for combinations it
// lacks.
void cuda_forward(const AttentionParams& params, const Problem& problem);
size_t cuda_workspace_size(const AttentionParams& params, const Problem& problem);
// The plan of a call from host-side lengths (cuda/plan.h), and its run (no host sync, no
// allocation when the workspace holds plan.workspace_bytes).
Plan cuda_plan(const AttentionParams& params, const Problem& problem, const HostLengths& lens,
               bool workspace_available);
void cuda_run(const Plan& plan, const AttentionParams& params, const Problem& problem,
              const AttentionRunOptions& options);
// Whether this build holds the sm90 kernels (90a among FLASHSERVE_CUDA_ARCHS):
// FLASHSERVE_KERNEL=sm90 can run only then.
bool cuda_sm90_built();
#endif

}  // namespace flashserve::attention
