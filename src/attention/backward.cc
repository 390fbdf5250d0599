// The backward's entry points (flashserve/attention_backward.h): its validation, which extends the
// forward's (describe) with the gradient tensors, and the choice of backend.
#include <string>
#include <utility>

#include "attention/backward.h"

#include "attention/backends.h"
#include "attention/reference/cpu_backward.h"
#include "common/str_cat.h"
#include "flashserve/attention_backward.h"

namespace flashserve {
namespace attention {
namespace {

[[noreturn]] void fail(const std::string& arg, const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, arg, what);
}

// `t` (named `name`) must be a well-formed view shaped like `like` (named `like_name`), of dtype
// `dtype` on `device`.
void check_like(const TensorView& t, const char* name, const TensorView& like,
                const char* like_name, DType dtype, const Device& device) {
  if (!t.defined()) fail(name, "is required");
  check_view(t, name, like.rank);
  for (int i = 0; i < like.rank; ++i)
    if (t.shape[i] != like.shape[i])
      fail(name, str_cat("shape ", shape_string(t), " differs from ", like_name, "'s ",
                         shape_string(like)));
  if (t.dtype != dtype)
    fail(name, str_cat("dtype ", dtype_name(t.dtype), " differs from ", like_name, "'s ",
                       dtype_name(dtype)));
  if (!(t.device == device)) fail(name, "must be on the same device as q");
}

}  // namespace

Problem describe_backward(const AttentionBackwardParams& p) {
  const AttentionParams& a = p.attn;
  const Problem pr = describe(a);
  if (!a.lse.defined())
    fail("lse", "is required: the backward recomputes the probabilities from the forward's LSE");
  if (pr.paged)
    throw Error(ErrorKind::kUnsupported, "block_table",
                "the backward takes dense or varlen K/V, not a paged KV cache");
  if (pr.fp8())  // as FlashAttention-3's fp8 path: forward (inference) only
    throw Error(ErrorKind::kUnsupported, pr.dtype == DType::kFloat8E4M3 ? "q" : "k",
                "float8_e4m3fn inputs have no backward (the fp8 path is forward only)");
  if (pr.kv_dtype != pr.dtype)  // a KV cache's narrower k and v: inference only too
    throw Error(ErrorKind::kUnsupported, "k", "the backward takes k and v of q's dtype");
  check_like(p.dout, "dout", a.out, "out", pr.dtype, pr.device);
  if (p.dlse.defined()) check_like(p.dlse, "dlse", a.lse, "lse", DType::kFloat32, pr.device);
  check_like(p.dq, "dq", a.q, "q", pr.dtype, pr.device);
  check_like(p.dk, "dk", a.k, "k", pr.dtype, pr.device);
  check_like(p.dv, "dv", a.v, "v", pr.dtype, pr.device);

  // The outputs are written while every input is read (and dq, dk, dv by different threads or
  // blocks): no output may share memory with an input, another output or itself.
  const std::pair<const TensorView*, const char*> inputs[] = {{&a.q, "q"},
                                                              {&a.k, "k"},
                                                              {&a.v, "v"},
                                                              {&a.out, "out"},
                                                              {&a.lse, "lse"},
                                                              {&p.dout, "dout"},
                                                              {&p.dlse, "dlse"},
                                                              {&a.cu_seqlens_q, "cu_seqlens_q"},
                                                              {&a.cu_seqlens_k, "cu_seqlens_k"},
                                                              {&a.seqused_k, "seqused_k"}};
  const std::pair<const TensorView*, const char*> outputs[] = {
      {&p.dq, "dq"}, {&p.dk, "dk"}, {&p.dv, "dv"}};
  for (size_t i = 0; i < std::size(outputs); ++i) {
    const auto& [out, name] = outputs[i];
    if (aliases_itself(*out))
      fail(name, "has elements that share memory (a zero or overlapping stride)");
    for (const auto& [in, in_name] : inputs)
      if (in->defined() && overlaps(*out, *in))
        fail(name, str_cat("overlaps ", in_name, " in memory"));
    for (size_t j = 0; j < i; ++j)
      if (overlaps(*out, *outputs[j].first))
        fail(name, str_cat("overlaps ", outputs[j].second, " in memory"));
  }
  return pr;
}

}  // namespace attention

void validate(const AttentionBackwardParams& params) {
  attention::describe_backward(params);
}

void attention_backward(const AttentionBackwardParams& params) {
  const attention::Problem problem = attention::describe_backward(params);
  if (problem.device.type == DeviceType::kCPU) return attention::cpu_backward(params, problem);
#if defined(FLASHSERVE_WITH_CUDA)
  attention::cuda_backward(params, problem);
#else
  attention::refuse_without_cuda("q");
#endif
}

size_t attention_backward_workspace_size(const AttentionBackwardParams& params) {
  const attention::Problem problem = attention::describe_backward(params);
  if (problem.device.type == DeviceType::kCPU) return 0;
#if defined(FLASHSERVE_WITH_CUDA)
  return attention::cuda_backward_workspace_size(params, problem);
#else
  attention::refuse_without_cuda("q");
#endif
}

}  // namespace flashserve
