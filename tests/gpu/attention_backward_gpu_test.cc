// The CUDA backward (the sm80 kernels of src/attention/sm80/bwd_kernel.h) through the public API,
// against the float64 reference backward. Each case runs our CPU forward on the host (out and lse
// as a training step saves them), copies every buffer to the device (gradients poisoned with
// NaN), runs attention_backward there and compares dq, dk, dv by support/compare.h's rule. The
// instantiation named Sanitize is the small subset for compute-sanitizer (with atomics and in
// deterministic mode). Without a CUDA device
// every test skips with "skipped: no CUDA device".
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "flashserve/attention_backward.h"
#include "support/backward_case.h"
#include "support/compare.h"
#include "support/device_copy.h"

namespace flashserve::testing {
namespace {

using attention::reference::Emulate;

// Device copies of a backward case's buffers (the attention's and the gradients'), freed on
// destruction.
class BackwardDevice {
 public:
  explicit BackwardDevice(BackwardCase& c) : c_(c) {
    for (const auto& b : c.attention().buffers()) attn_.push_back(upload(b));
    for (const auto& b : c.grad_buffers()) grads_.push_back(upload(b));
  }
  ~BackwardDevice() {
    for (void* p : attn_) cudaFree(p);
    for (void* p : grads_) cudaFree(p);
  }
  AttentionBackwardParams params() { return c_.params(kGpu, attn_.data(), grads_.data()); }
  void download_grads() {
    const auto bufs = c_.grad_buffers();
    for (int g : {BackwardCase::kDq, BackwardCase::kDk, BackwardCase::kDv})
      if (bufs[g].bytes)
        EXPECT_EQ(cudaMemcpy(bufs[g].host, grads_[g], bufs[g].bytes, cudaMemcpyDeviceToHost),
                  cudaSuccess);
  }

 private:
  static void* upload(const AttentionCase::BufferInfo& b) {
    void* d = nullptr;
    if (b.bytes) {
      EXPECT_EQ(cudaMalloc(&d, b.bytes), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(d, b.host, b.bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
    return d;
  }
  BackwardCase& c_;
  std::vector<void*> attn_, grads_;
};

// Runs the backward on the device; returns the gradients read back.
attention::reference::NaiveGrads run_on_gpu(BackwardCase& bc, bool deterministic = false) {
  BackwardDevice dev(bc);
  AttentionBackwardParams p = dev.params();
  p.deterministic = deterministic;
  attention_backward(p);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download_grads();
  return bc.read();
}

void check_case(CaseSpec s, bool with_dlse = false, bool deterministic = false) {
  s.seed = seed_for(s.name() + (with_dlse ? "dlse" : ""), 2290);
  BackwardCase bc(s, with_dlse);
  bc.run_forward();  // on the host buffers, before they are copied
  const auto got = run_on_gpu(bc, deterministic);
  const auto exact = bc.reference(Emulate::kExact);
  const auto lowp = bc.reference(Emulate::kLowPrecision);
  EXPECT_TRUE(grad_close(got.dq, exact.dq, lowp.dq, s.dtype, "dq")) << s.name();
  EXPECT_TRUE(grad_close(got.dk, exact.dk, lowp.dk, s.dtype, "dk")) << s.name();
  EXPECT_TRUE(grad_close(got.dv, exact.dv, lowp.dv, s.dtype, "dv")) << s.name();
}

CaseSpec spec(DType dt, int64_t d, int64_t batch, int64_t q, int64_t k, int64_t h_q, int64_t h_kv,
              bool causal) {
  CaseSpec s;
  s.dtype = dt, s.head_dim = d, s.batch = batch, s.q_lens = {q}, s.kv_lens = {k};
  s.h_q = h_q, s.h_kv = h_kv, s.causal = causal;
  return s;
}

std::vector<CaseSpec> cases() {
  std::vector<CaseSpec> v;
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true}) {
        v.push_back(spec(dt, d, 2, 1, 1, 2, 2, causal));
        v.push_back(spec(dt, d, 2, 127, 127, 4, 1, causal));  // GQA 4, odd length
        v.push_back(spec(dt, d, 1, 77, 300, 8, 1, causal));   // q_len < kv_len, GQA 8
        v.push_back(spec(dt, d, 1, 300, 77, 2, 2, causal));   // q_len > kv_len: masked rows
        CaseSpec w = spec(dt, d, 1, 200, 257, 2, 1, false);
        w.window_left = 37, w.window_right = causal ? 0 : 11;  // sliding windows
        v.push_back(w);
        CaseSpec var = spec(dt, d, 4, 1, 1, 4, 2, causal);
        var.q_lens = {33, 0, 129, 7}, var.kv_lens = {65, 9, 129, 0};  // empty sequences
        var.q_layout = QLayout::kVarlen, var.kv_layout = KVLayout::kVarlen;
        v.push_back(var);
      }
  return v;
}

class GpuBackward : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(GpuBackward, MatchesFloat64Reference) {
  SKIP_WITHOUT_CUDA();
  check_case(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuBackward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });

// The compute-sanitizer subset: a masked and an unmasked case, one per head dim.
INSTANTIATE_TEST_SUITE_P(Sanitize, GpuBackward,
                         ::testing::Values(spec(DType::kBFloat16, 64, 1, 70, 90, 4, 2, true),
                                           spec(DType::kFloat16, 128, 1, 65, 33, 2, 1, false)),
                         [](const auto& info) { return info.param.name(); });

TEST(GpuBackwardSanitize, DeterministicSmallCase) {
  SKIP_WITHOUT_CUDA();
  check_case(spec(DType::kBFloat16, 64, 1, 70, 90, 4, 2, true), false, /*deterministic=*/true);
}

TEST(GpuBackwardLse, GradientOfTheLse) {
  SKIP_WITHOUT_CUDA();
  check_case(spec(DType::kBFloat16, 64, 2, 45, 61, 4, 2, true), /*with_dlse=*/true);
}

// deterministic = true: dq from the fixed-order dq kernel, as accurate, and the same bits on a
// second run (the atomics' order may differ between runs; this must not).
TEST(GpuBackwardDeterministic, MatchesTheReferenceAndRepeatsBitForBit) {
  SKIP_WITHOUT_CUDA();
  for (bool causal : {false, true}) {
    CaseSpec s = spec(DType::kBFloat16, 128, 2, 150, 222, 8, 2, causal);
    check_case(s, false, /*deterministic=*/true);
    s.seed = 2291;
    BackwardCase bc(s);
    bc.run_forward();
    const auto first = run_on_gpu(bc, true);
    const auto second = run_on_gpu(bc, true);
    EXPECT_TRUE(first.dq == second.dq && first.dk == second.dk && first.dv == second.dv)
        << s.name();
  }
}

TEST(GpuBackwardRefusals, NamesWhatTheKernelsLack) {
  SKIP_WITHOUT_CUDA();
  auto refused = [](CaseSpec s, const char* arg) {
    BackwardCase bc(s);
    bc.run_forward();
    BackwardDevice dev(bc);
    AttentionBackwardParams p = dev.params();
    try {
      attention_backward(p);
      ADD_FAILURE() << "no error; expected " << arg;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
      EXPECT_EQ(e.argument(), arg) << e.what();
    }
  };
  refused(spec(DType::kBFloat16, 256, 1, 9, 9, 2, 2, false), "q");  // head dim
  refused(spec(DType::kFloat32, 64, 1, 9, 9, 2, 2, false), "q");    // dtype
  CaseSpec dv = spec(DType::kBFloat16, 64, 1, 9, 9, 2, 2, false);
  dv.head_dim_v = 32;
  refused(dv, "v");
  CaseSpec capped = spec(DType::kBFloat16, 64, 1, 9, 9, 2, 2, false);
  capped.softcap = 5.0f;  // the forward ran on the CPU, which has it
  refused(capped, "softcap");
  capped.softcap = 0.0f;
  capped.alibi = 2;
  refused(capped, "alibi_slopes");
}

}  // namespace
}  // namespace flashserve::testing
