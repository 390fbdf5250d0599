// The CUDA backend of attention_backward: what the backward kernels can run (checked here and
// reported as an Error naming the argument), the workspace they need (fp32 dQ accumulator and D,
// the same for both families), the family (choose_backward_family, attention/cuda/plan.h: the
// sm90 kernel of sm90/bwd_kernel.h on a compute capability 9.0 device of a build with 90a where
// it can run the call, else the sm80 kernels; FLASHSERVE_BWD_KERNEL=auto|sm80|sm90 forces one)
// and the launch. deterministic = true runs on sm80, whose dq kernel sums in a fixed order
// (sm80/bwd_kernel.h's bwd_dq_kernel) instead of dq's atomics.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

#include "attention/backends.h"
#include "attention/backward.h"
#include "attention/cuda/check_aligned.h"
#include "attention/cuda/fwd_params_of.h"
#include "attention/cuda/plan.h"
#include "attention/cuda_check.h"
#include "attention/sm80/bwd_launch.h"
#include "common/str_cat.h"
#if defined(FLASHSERVE_WITH_SM90)
#include "attention/sm90/bwd_launch.h"
#endif

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

// Workspace: the fp32 dQ accumulator [q_rows][h_q][D], the sm90 fused dQ conversion's counters
// [batch][h_kv] (ints; right behind the accumulator, so that one memset zeroes both), D
// [q_rows][h_q], then 16 bytes for the sm90 persistent grid's tile counter (none when there are
// no rows).
struct WorkspaceLayout {
  size_t counters, delta, tile_counter, bytes;  // byte offsets, and the size
  WorkspaceLayout(const AttentionBackwardParams& bp, const Problem& pr) {
    const size_t rows = static_cast<size_t>(q_rows(bp.attn, pr) * pr.h_q);
    counters = align16(rows * pr.head_dim * sizeof(float));
    delta = counters + align16(static_cast<size_t>(pr.batch * pr.h_kv) * sizeof(int));
    tile_counter = delta + align16(rows * sizeof(float));
    bytes = rows == 0 ? 0 : tile_counter + 16;
  }
};
size_t workspace_bytes(const AttentionBackwardParams& bp, const Problem& pr) {
  return WorkspaceLayout(bp, pr).bytes;
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
  check_cuda_head_dims(pr);  // the forward's: multiples of 8 from 32 to 256
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

// Why the sm90 backward cannot run on this device with these tensors, whatever the call's shape
// ("" when it can): a build without sm_90a, a device other than compute capability 9.0, strides
// TMA cannot describe (q, k, v, dout: its tensor maps). The shape's limits are
// sm90_backward_lacks's.
std::string sm90_unavailable(const AttentionBackwardParams& bp, const Problem& pr) {
  if (!cuda_sm90_built())
    return "this build has no sm90 kernels (90a not in FLASHSERVE_CUDA_ARCHS)";
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, pr.device.index),
             "cudaDeviceGetAttribute (compute capability)");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, pr.device.index),
             "cudaDeviceGetAttribute (compute capability)");
  if (major != 9 || minor != 0)
    return str_cat("needs a compute capability 9.0 device, this one is ", major, ".", minor);
  const AttentionParams& a = bp.attn;
  for (const auto& [t, name] : {std::pair{&a.q, "q"}, std::pair{&a.k, "k"}, std::pair{&a.v, "v"},
                                std::pair{&bp.dout, "dout"}})
    if (std::string why = tma_stride_problem(*t, name); !why.empty()) return why;
  return "";
}

// The family that runs the call (FLASHSERVE_BWD_KERNEL and FLASHSERVE_SM90_BWD_D256 read per
// call, so a test or benchmark can set them around one call).
KernelFamily backward_family(const AttentionBackwardParams& bp, const Problem& pr) {
  const FamilyRequest request =
      parse_family_request(std::getenv("FLASHSERVE_BWD_KERNEL"), "FLASHSERVE_BWD_KERNEL");
  const bool d256 = parse_sm90_bwd_d256(std::getenv("FLASHSERVE_SM90_BWD_D256"));
  return choose_backward_family(pr, bp.deterministic, request,
                                request == FamilyRequest::kSm80 ? "" : sm90_unavailable(bp, pr),
                                d256);
}

sm80::BwdParams bwd_params(const AttentionBackwardParams& bp, const Problem& pr, void* workspace,
                           const WorkspaceLayout& layout) {
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
  p.head_dim = static_cast<int32_t>(pr.head_dim);
  p.dq_accum = static_cast<float*>(workspace);
  p.delta = reinterpret_cast<float*>(static_cast<char*>(workspace) + layout.delta);
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
  // Decided before anything is enqueued: a forced family that cannot run the call throws here,
  // as does a malformed FLASHSERVE_SM90_BWD_D256, FLASHSERVE_SM90_BWD_DQ_BULK,
  // FLASHSERVE_SM90_BWD_OVERLAP, FLASHSERVE_SM90_BWD_HEAVY_FIRST, FLASHSERVE_SM90_BWD_PERSISTENT or
  // FLASHSERVE_SM90_BWD_FUSED_DQ (read per call, so that a test or benchmark can set them around
  // one call; only the sm90 kernel has the two dQ paths, the overlapped step, the heaviest-first
  // order, the persistent grid and the fused dQ conversion, sm80 ignores them).
  const KernelFamily family = backward_family(bp, pr);
  [[maybe_unused]] const bool dq_bulk =
      parse_sm90_bwd_dq_bulk(std::getenv("FLASHSERVE_SM90_BWD_DQ_BULK"));
  [[maybe_unused]] const bool overlap =
      parse_sm90_bwd_overlap(std::getenv("FLASHSERVE_SM90_BWD_OVERLAP"), pr.head_dim);
  [[maybe_unused]] const bool heavy_first =
      parse_sm90_bwd_heavy_first(std::getenv("FLASHSERVE_SM90_BWD_HEAVY_FIRST"));
  [[maybe_unused]] const bool fused_dq =
      parse_sm90_bwd_fused_dq(std::getenv("FLASHSERVE_SM90_BWD_FUSED_DQ"));
  const cudaStream_t stream = static_cast<cudaStream_t>(bp.attn.stream);
  const WorkspaceLayout layout(bp, pr);
  const size_t bytes = layout.bytes;
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

  const sm80::BwdParams p = bwd_params(bp, pr, workspace, layout);
  const bool masked = p.fwd.window_left >= 0 || p.fwd.window_right >= 0;
  // Still before anything is enqueued (a malformed value throws here; Free returns the scratch).
  [[maybe_unused]] const bool persistent = parse_sm90_bwd_persistent(
      std::getenv("FLASHSERVE_SM90_BWD_PERSISTENT"), pr.head_dim, masked, pr.max_kv_len);
  // The launches below write every element of dq (the postprocess, or the deterministic dq kernel:
  // each row of each sequence) and of dk and dv (the main kernels: each key of each sequence) when
  // the batch is dense, without seqused_k, and both lengths are positive; zeroing them first
  // is then a pass over 3 gradients for nothing (bwd_zero's 64-bit index arithmetic per element:
  // a fixed cost per call, kernel-notes session 19). Varlen rows of no sequence, keys past
  // seqused_k and the empty cases are written by nothing else.
  const bool every_element_written = workspace != nullptr && !pr.varlen_q && !pr.varlen_k &&
                                     !pr.seqused && pr.max_q_len > 0 && pr.max_kv_len > 0;
  if (!every_element_written)
    for (const TensorView* g : {&bp.dq, &bp.dk, &bp.dv})
      sm80::zero_grad(g->data, g->dtype, g->rank, g->shape, g->stride, stream);
  if (workspace == nullptr) return;
  if (!bp.deterministic)  // deterministic: bwd_dq_kernel writes dq, no accumulator
    check_cuda(cudaMemsetAsync(p.dq_accum, 0, layout.delta, stream),
               "cudaMemsetAsync (backward dq accumulator and counters)");
  if (family == KernelFamily::kSm90) {
#if defined(FLASHSERVE_WITH_SM90)
    sm90::BwdArgs args{};
    args.dtype = pr.dtype;
    args.masked = masked;
    args.dq_bulk = dq_bulk;
    args.overlap = overlap;
    args.heavy_first = heavy_first;
    args.persistent = persistent;
    // The order's sections (two waves of CTAs, half of L2) and the persistent grid's CTAs.
    if (heavy_first || persistent) {
      check_cuda(cudaDeviceGetAttribute(&args.sms, cudaDevAttrMultiProcessorCount, pr.device.index),
                 "cudaDeviceGetAttribute (multiprocessors)");
      int l2 = 0;
      check_cuda(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, pr.device.index),
                 "cudaDeviceGetAttribute (L2 size)");
      args.l2_bytes = l2;
    }
    // The persistent grid's tile counter, after D (WorkspaceLayout); the launch zeroes it.
    args.tile_counter = reinterpret_cast<int*>(static_cast<char*>(workspace) + layout.tile_counter);
    // The fused dQ conversion's counters (zeroed with the accumulator above): dense batches only,
    // where every key block of every sequence has keys (run_bwd_hdim decides whether the call's
    // grid can take it).
    if (fused_dq && !pr.varlen_q && !pr.varlen_k && !pr.seqused)
      args.dq_counters = reinterpret_cast<int*>(static_cast<char*>(workspace) + layout.counters);
    args.batch = static_cast<int>(pr.batch);
    args.h_kv = static_cast<int>(pr.h_kv);
    args.q_rows = static_cast<int>(bp.attn.q.shape[pr.varlen_q ? 0 : 1]);
    args.kv_rows = static_cast<int>(bp.attn.k.shape[pr.varlen_k ? 0 : 1]);
    args.max_q_len = static_cast<int>(pr.max_q_len);
    args.max_kv_len = static_cast<int>(pr.max_kv_len);
    args.stream = stream;
    sm90::run_bwd(p, args, static_cast<int>(pr.head_dim));
    return;
#endif
  }
  sm80::BwdLaunch launch{};
  launch.dtype = pr.dtype;
  launch.has_mask = masked;
  launch.max_q_len = static_cast<int>(pr.max_q_len);
  launch.max_kv_len = static_cast<int>(pr.max_kv_len);
  launch.h_kv = static_cast<int>(pr.h_kv);
  launch.deterministic = bp.deterministic;
  launch.smem_per_block = smem_per_block(pr.device.index);
  launch.stream = stream;
  // 64 and 128 have kernels of their own; any other head dim runs on the padded kernels of the
  // next of 64, 128 and 256 (past 128 in two launches of half the columns each).
  if (pr.head_dim == 64)
    sm80::run_bwd<64>(p, launch);
  else if (pr.head_dim == 128)
    sm80::run_bwd<128>(p, launch);
  else if (pr.head_dim < 64)
    sm80::run_bwd_padded<64>(p, launch);
  else if (pr.head_dim < 128)
    sm80::run_bwd_padded<128>(p, launch);
  else
    sm80::run_bwd_padded<256>(p, launch);
}

}  // namespace flashserve::attention
