// The one place that chooses a backend for a call, and the plan/run form of a call.
#include <string>
#include <vector>

#include "backends.h"
#include "common/str_cat.h"

namespace flashserve {

namespace attention {

// What a plan holds: the problem it was made for (run checks that its params match) and, on CUDA,
// the launches.
struct PlanState {
  Problem problem;
  int64_t q_shape0 = 0;  // rows of q (varlen) or batch (dense): the step's shape
  Plan plan;
};

namespace {

[[noreturn]] void plan_mismatch(const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, "plan",
              "params do not match the plan (" + what + "); plan the step again");
}

// The host lengths of a step as the plan reads them; unknown (empty) when q is varlen and no host
// cu_seqlens_q is given.
[[maybe_unused]] HostLengths host_lengths(const AttentionParams& params, const Problem& pr,
                                          const AttentionLengths& given) {
  HostLengths lens;
  if (given.for_replay && ((pr.varlen_q && given.cu_seqlens_q == nullptr) || !given.kv_lens))
    throw Error(ErrorKind::kInvalidArgument, "lengths",
                "a plan for replay (for_replay) needs the host cu_seqlens_q and kv_lens");
  lens.widen = given.for_replay;
  if (pr.varlen_q && given.cu_seqlens_q == nullptr) return lens;
  lens.q_start.resize(pr.batch + 1);
  for (int64_t b = 0; b <= pr.batch; ++b)
    lens.q_start[b] = pr.varlen_q ? int64_t{given.cu_seqlens_q[b]} : b * params.q.shape[1];
  lens.kv_len.resize(pr.batch);
  for (int64_t b = 0; b < pr.batch; ++b) {
    const int64_t q_len = lens.q_start[b + 1] - lens.q_start[b];
    const int64_t kv = given.kv_lens ? int64_t{given.kv_lens[b]} : pr.max_kv_len;
    if (q_len < 0 || q_len > pr.max_q_len)
      throw Error(ErrorKind::kInvalidArgument, "lengths",
                  str_cat("cu_seqlens_q gives sequence ", b, " ", q_len,
                          " queries; max_seqlen_q is ", pr.max_q_len));
    if (kv < 0 || kv > pr.max_kv_len)
      throw Error(
          ErrorKind::kInvalidArgument, "lengths",
          str_cat("kv_lens gives sequence ", b, " ", kv, " keys; max_seqlen_k is ", pr.max_kv_len));
    lens.kv_len[b] = kv;
  }
  return lens;
}

// On CUDA, float8_e4m3fn q, k and v go to the plan (the sm90 fp8 forward, behind
// FLASHSERVE_FP8_ATTENTION: cuda/plan.h fp8_plan, which refuses what it lacks by name), and so do
// an e4m3 k and v beside a 16-bit q (an fp8 KV cache: sm80's fp8 KV kernels, behind
// FLASHSERVE_CUDA_FP8_KV: cuda/plan.h fp8_kv_lacks). K and V of another dtype than q's
// otherwise (a float32 q over a bf16 cache) run on the CPU path only.
void refuse_fp8_on_cuda(const Problem& pr) {
  if (pr.device.type == DeviceType::kCPU) return;
  if (pr.kv_dtype == DType::kFloat8E4M3) return;
  if (pr.kv_dtype != pr.dtype)
    throw Error(ErrorKind::kUnsupported, "k",
                str_cat("a ", dtype_name(pr.kv_dtype), " k and v beside a ", dtype_name(pr.dtype),
                        " q run on the CPU path only"));
}

}  // namespace
}  // namespace attention

void validate(const AttentionParams& params) {
  attention::describe(params);
}

void attention_forward(const AttentionParams& params) {
  const attention::Problem problem = attention::describe(params);
  if (problem.device.type == DeviceType::kCPU) return attention::cpu_forward(params, problem);
  attention::refuse_fp8_on_cuda(problem);
#if defined(FLASHSERVE_WITH_CUDA)
  return attention::cuda_forward(params, problem);
#else
  attention::refuse_without_cuda("q");
#endif
}

size_t attention_workspace_size(const AttentionParams& params) {
  const attention::Problem problem = attention::describe(params);
  if (problem.device.type == DeviceType::kCPU) return 0;
  attention::refuse_fp8_on_cuda(problem);
#if defined(FLASHSERVE_WITH_CUDA)
  return attention::cuda_workspace_size(params, problem);
#else
  attention::refuse_without_cuda("q");
#endif
}

AttentionPlan::AttentionPlan() = default;

size_t AttentionPlan::workspace_bytes() const {
  return state_ ? state_->plan.workspace_bytes : 0;
}

std::string AttentionPlan::summary() const {
  if (!state_) return "no plan";
  if (state_->problem.device.type == DeviceType::kCPU) return "CPU tiled path";
  return state_->plan.summary();
}

std::string AttentionPlan::replay_key() const {
  if (!state_ || state_->problem.device.type == DeviceType::kCPU) return "";
  return attention::replay_key(state_->plan);
}

AttentionPlan plan_attention(const AttentionParams& params, const AttentionLengths& lengths) {
  auto state = std::make_shared<attention::PlanState>();
  state->problem = attention::describe(params);
  state->q_shape0 = params.q.shape[0];
  const attention::Problem& pr = state->problem;
  attention::refuse_fp8_on_cuda(pr);
  if (pr.device.type != DeviceType::kCPU) {
#if defined(FLASHSERVE_WITH_CUDA)
    state->plan =
        attention::cuda_plan(params, pr, attention::host_lengths(params, pr, lengths), true);
#else
    attention::refuse_without_cuda("q");
#endif
  }
  AttentionPlan plan;
  plan.state_ = std::move(state);
  return plan;
}

void run_attention(const AttentionPlan& plan, const AttentionParams& params,
                   const AttentionRunOptions& options) {
  if (!plan.state_)
    throw Error(ErrorKind::kInvalidArgument, "plan", "is empty: make it with plan_attention");
  const attention::Problem pr = attention::describe(params);
  const attention::Problem& planned = plan.state_->problem;
  using attention::plan_mismatch;
  if (pr.device.type != planned.device.type || pr.device.index != planned.device.index)
    plan_mismatch("device");
  if (pr.dtype != planned.dtype || pr.kv_dtype != planned.kv_dtype) plan_mismatch("dtype");
  if (pr.batch != planned.batch || params.q.shape[0] != plan.state_->q_shape0)
    plan_mismatch("batch or rows of q");
  if (pr.h_q != planned.h_q || pr.h_kv != planned.h_kv || pr.head_dim != planned.head_dim ||
      pr.head_dim_v != planned.head_dim_v)
    plan_mismatch("heads or head dim");
  if (pr.varlen_q != planned.varlen_q || pr.varlen_k != planned.varlen_k ||
      pr.paged != planned.paged || pr.page_size != planned.page_size)
    plan_mismatch("layout");
  if (pr.max_q_len != planned.max_q_len || pr.max_kv_len != planned.max_kv_len)
    plan_mismatch("max_seqlen_q or max_seqlen_k");
  if (pr.mask.left != planned.mask.left || pr.mask.right != planned.mask.right ||
      pr.num_splits != planned.num_splits)
    plan_mismatch("mask or num_splits");
  if (pr.score_mod.softcap != planned.score_mod.softcap ||
      pr.score_mod.has_alibi() != planned.score_mod.has_alibi())
    plan_mismatch("softcap or alibi_slopes");
  if (options.reuse_step_state && params.workspace == nullptr && plan.workspace_bytes() > 0)
    throw Error(ErrorKind::kInvalidArgument, "workspace",
                "is null, so there is no step state to reuse (reuse_step_state needs the "
                "workspace an earlier run of this plan wrote it into)");
  if (pr.device.type == DeviceType::kCPU) return attention::cpu_forward(params, pr);
#if defined(FLASHSERVE_WITH_CUDA)
  attention::cuda_run(plan.state_->plan, params, pr, options);
#endif
}

}  // namespace flashserve
