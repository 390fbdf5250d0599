// The CUDA backend of attention_backward: what the sm80 backward kernels can run (checked here and
// reported as an Error naming the argument), the workspace they need (fp32 dQ accumulator and D),
// and their launch. deterministic = true replaces dq's atomics by a dq kernel that sums in a
// fixed order (sm80/bwd_kernel.h's bwd_dq_kernel).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "attention/backward.h"
#include "attention/cuda/check_aligned.h"
#include "attention/cuda/fwd_params_of.h"
#include "attention/cuda/plan.h"
#include "attention/cuda_check.h"
#include "attention/sm80/bwd_launch.h"
#include "common/str_cat.h"

namespace flashserve::attention {
namespace {

[[noreturn]] void unsupported(const std::string& arg, const std::string& what) {
  throw Error(ErrorKind::kUnsupported, arg, what);
}

int64_t q_rows(const AttentionParams& a, const Problem& pr) {
  return pr.varlen_q ? a.q.shape[0] : pr.batch * a.q.shape[1];
}

size_t align16(size_t n) {
  return (n + 15) / 16 * 16;
}

// Workspace: the fp32 dQ accumulator [q_rows][h_q][D], then D [q_rows][h_q].
size_t workspace_bytes(const AttentionBackwardParams& bp, const Problem& pr) {
  const size_t rows = static_cast<size_t>(q_rows(bp.attn, pr) * pr.h_q);
  return align16(rows * pr.head_dim * sizeof(float)) + align16(rows * sizeof(float));
}

int smem_per_block(int device) {
  int smem = 0;
  check_cuda(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute (shared memory per block)");
  return smem;
}

void check_supported(const AttentionBackwardParams& bp, const Problem& pr) {
  refuse_score_mods(pr.score_mod, "the CUDA backward yet (the CPU path has it)");
  int major = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, pr.device.index),
             "cudaDeviceGetAttribute (compute capability)");
  if (major < 8) unsupported("q", "the CUDA backward needs compute capability 8.0 or newer");
  if (pr.dtype != DType::kBFloat16 && pr.dtype != DType::kFloat16)
    unsupported("q", str_cat("dtype ", dtype_name(pr.dtype),
                             " is not supported by the CUDA backward (bfloat16, float16)"));
  if (pr.head_dim != 64 && pr.head_dim != 128)
    unsupported("q", str_cat("head_dim ", pr.head_dim,
                             " is not supported by the CUDA backward yet (64, 128)"));
  if (pr.head_dim_v != pr.head_dim)
    unsupported("v", str_cat("head_dim ", pr.head_dim_v, " differs from q's ", pr.head_dim,
                             "; the CUDA backward needs them equal"));
  const AttentionParams& a = bp.attn;
  const std::pair<const TensorView*, const char*> tiles[] = {
      {&a.q, "q"},        {&a.k, "k"},    {&a.v, "v"},    {&a.out, "out"},
      {&bp.dout, "dout"}, {&bp.dq, "dq"}, {&bp.dk, "dk"}, {&bp.dv, "dv"}};
  for (const auto& [t, name] : tiles) check_aligned(*t, name, "the CUDA backward");
  if (pr.max_q_len + pr.max_kv_len > INT32_MAX / 2)
    unsupported("q", "sequences past 2^30 tokens are not supported by the CUDA backward");
  if (pr.batch > 65535 || pr.h_q > 65535)
    unsupported("q", "batch and heads must each be at most 65535 for the CUDA backward");
}

sm80::BwdParams bwd_params(const AttentionBackwardParams& bp, const Problem& pr, void* workspace) {
  const AttentionParams& a = bp.attn;
  sm80::BwdParams p{};
  p.fwd = fwd_params(a, pr);  // the forward's recomputation: the forward's parameters
  p.dout = bp.dout.data;
  row_strides(bp.dout, pr.varlen_q, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
  if (bp.dlse.defined()) {
    p.dlse = bp.dlse.ptr<const float>();
    lse_strides(bp.dlse, pr.varlen_q, p.dlse_batch_stride, p.dlse_row_stride, p.dlse_head_stride);
  }
  p.dq = bp.dq.data;
  p.dk = bp.dk.data;
  p.dv = bp.dv.data;
  row_strides(bp.dq, pr.varlen_q, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  row_strides(bp.dk, pr.varlen_k, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  row_strides(bp.dv, pr.varlen_k, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  p.q_rows = q_rows(a, pr);
  p.batch = static_cast<int32_t>(pr.batch);
  const size_t rows = static_cast<size_t>(p.q_rows * pr.h_q);
  p.dq_accum = static_cast<float*>(workspace);
  p.delta = reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                     align16(rows * pr.head_dim * sizeof(float)));
  return p;
}

}  // namespace

size_t cuda_backward_workspace_size(const AttentionBackwardParams& bp, const Problem& pr) {
  DeviceGuard guard(pr.device.index);
  check_supported(bp, pr);
  return workspace_bytes(bp, pr);
}

void cuda_backward(const AttentionBackwardParams& bp, const Problem& pr) {
  DeviceGuard guard(pr.device.index);
  check_supported(bp, pr);
  const cudaStream_t stream = static_cast<cudaStream_t>(bp.attn.stream);
  const size_t bytes = workspace_bytes(bp, pr);
  void* workspace = bp.attn.workspace;
  void* scratch = nullptr;
  if (pr.batch == 0 || bytes == 0) {
    workspace = nullptr;  // nothing to launch (zero_grad below still clears any keys)
  } else if (workspace == nullptr) {
    check_cuda(cudaMallocAsync(&scratch, bytes, stream), "cudaMallocAsync (backward workspace)");
    workspace = scratch;
  } else if (bp.attn.workspace_bytes < bytes || reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    throw Error(
        ErrorKind::kInvalidArgument, "workspace",
        str_cat("the backward needs ", bytes, " bytes of 16-byte aligned device workspace, got ",
                bp.attn.workspace_bytes));
  }
  struct Free {  // stream-ordered, also when a launch throws
    void* ptr;
    cudaStream_t stream;
    ~Free() {
      if (ptr != nullptr) cudaFreeAsync(ptr, stream);
    }
  } free_scratch{scratch, stream};

  const sm80::BwdParams p = bwd_params(bp, pr, workspace);
  for (const TensorView* g : {&bp.dq, &bp.dk, &bp.dv})
    sm80::zero_grad(g->data, g->dtype, g->rank, g->shape, g->stride, stream);
  if (workspace == nullptr) return;
  if (!bp.deterministic)  // deterministic: bwd_dq_kernel writes dq, no accumulator
    check_cuda(
        cudaMemsetAsync(p.dq_accum, 0, p.q_rows * pr.h_q * pr.head_dim * sizeof(float), stream),
        "cudaMemsetAsync (backward dq accumulator)");
  sm80::BwdLaunch launch{};
  launch.dtype = pr.dtype;
  launch.has_mask = p.fwd.window_left >= 0 || p.fwd.window_right >= 0;
  launch.max_q_len = static_cast<int>(pr.max_q_len);
  launch.max_kv_len = static_cast<int>(pr.max_kv_len);
  launch.h_kv = static_cast<int>(pr.h_kv);
  launch.deterministic = bp.deterministic;
  launch.smem_per_block = smem_per_block(pr.device.index);
  launch.stream = stream;
  if (pr.head_dim == 64)
    sm80::run_bwd<64>(p, launch);
  else
    sm80::run_bwd<128>(p, launch);
}

}  // namespace flashserve::attention
