// The CPU backward (attention_backward on host tensors) against the float64 reference backward on
// fresh random inputs: out and lse come from our CPU forward, as in a training step; gradients
// are poisoned first; the tolerance is twice the error of the naive backward in the same low
// precision plus a floor (support/compare.h). Also: finite differences of the float64 forward on
// tiny cases, bit-identical reruns (and thread counts), and the backward's validation (the C API's
// face of it: python/tests/test_backward_capi.py).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "flashserve/attention_backward.h"
#include "support/backward_case.h"
#include "support/compare.h"
#include "support/finite_diff.h"

namespace flashserve::testing {
namespace {

using attention::reference::Emulate;

void check_backward(CaseSpec s, bool with_dlse = false) {
  s.seed = seed_for(s.name() + (with_dlse ? "dlse" : ""), 22);
  BackwardCase bc(s, with_dlse);
  bc.run_forward();
  attention_backward(bc.params());
  const auto got = bc.read();
  const auto exact = bc.reference(Emulate::kExact);
  const auto lowp = bc.reference(Emulate::kLowPrecision);
  EXPECT_TRUE(grad_close(got.dq, exact.dq, lowp.dq, s.dtype, "dq")) << s.name();
  EXPECT_TRUE(grad_close(got.dk, exact.dk, lowp.dk, s.dtype, "dk")) << s.name();
  EXPECT_TRUE(grad_close(got.dv, exact.dv, lowp.dv, s.dtype, "dv")) << s.name();
}

// Shapes that cross the tiles' block boundaries (128 keys, 64 query rows) at odd lengths.
std::vector<CaseSpec> shapes() {
  std::vector<CaseSpec> v;
  CaseSpec s;
  s.batch = 2, s.q_lens = {17}, s.kv_lens = {17}, s.h_q = 4, s.h_kv = 4, s.head_dim = 64;
  v.push_back(s);  // plain
  s = {};
  s.q_lens = {33}, s.kv_lens = {161}, s.h_q = 8, s.h_kv = 2, s.head_dim = 64, s.causal = true;
  v.push_back(s);  // GQA 4, causal, q_len < kv_len
  s = {};
  s.q_lens = {70}, s.kv_lens = {33}, s.h_q = 8, s.h_kv = 1, s.head_dim = 32, s.causal = true;
  v.push_back(s);  // MQA (GQA 8), causal with q_len > kv_len: the first 37 rows see no key
  s = {};
  s.q_lens = {129}, s.kv_lens = {300}, s.h_q = 2, s.h_kv = 1, s.head_dim = 128;
  s.window_left = 17, s.window_right = 5;
  v.push_back(s);  // sliding window (keys outside it get zero gradient), d 128
  s = {};
  s.batch = 4, s.q_lens = {5, 0, 131, 17}, s.kv_lens = {9, 7, 140, 0}, s.h_q = 4, s.h_kv = 2;
  s.head_dim = 64, s.causal = true, s.q_layout = QLayout::kVarlen, s.kv_layout = KVLayout::kVarlen;
  v.push_back(s);  // varlen with empty sequences on both sides
  s = {};
  s.batch = 2, s.q_lens = {19}, s.kv_lens = {23}, s.h_q = 3, s.h_kv = 1, s.head_dim = 64;
  s.head_dim_v = 32, s.use_seqused_k = true, s.kv_extra = 5, s.pad = 3, s.window_left = 6;
  v.push_back(s);  // seqused_k (the 5 extra keys get zero gradient), strided views, d_v != d
  s = {};
  s.batch = 2, s.q_lens = {33}, s.kv_lens = {161}, s.h_q = 8, s.h_kv = 2, s.head_dim = 64;
  s.causal = true, s.softcap = 1.5f, s.softmax_scale = 0.5f;
  v.push_back(s);  // softcap bending the scores (the gradient through the tanh), GQA, causal
  s = {};
  s.batch = 3, s.q_lens = {5, 0, 131}, s.kv_lens = {9, 7, 140}, s.h_q = 4, s.h_kv = 2;
  s.head_dim = 64, s.q_layout = QLayout::kVarlen, s.kv_layout = KVLayout::kVarlen;
  s.alibi = 2, s.window_left = 40, s.window_right = 8;
  v.push_back(s);  // ALiBi per sequence and head, both sides of the window
  s = {};
  s.q_lens = {70}, s.kv_lens = {150}, s.h_q = 2, s.h_kv = 1, s.head_dim = 32, s.causal = true;
  s.softcap = 0.8f, s.alibi = 1;
  v.push_back(s);  // both
  return v;
}

std::vector<CaseSpec> cases() {
  std::vector<CaseSpec> all;
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (CaseSpec s : shapes()) {
      s.dtype = dt;
      all.push_back(s);
    }
  return all;
}

class CpuBackward : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuBackward, MatchesFloat64Reference) {
  check_backward(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuBackward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });

TEST(CpuBackwardLse, GradientOfTheLseMatchesTheReference) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    CaseSpec s;
    s.batch = 2, s.q_lens = {21}, s.kv_lens = {45}, s.h_q = 4, s.h_kv = 2, s.head_dim = 32;
    s.causal = true, s.dtype = dt;
    check_backward(s, /*with_dlse=*/true);
  }
}

// Our float32 backward against central differences of the float64 forward, every element of q,
// k and v: ties the whole chain (forward LSE, D, recomputed P, GQA sums) to the definition.
void check_finite_differences(CaseSpec s) {
  s.dtype = DType::kFloat32;
  s.seed = seed_for(s.name(), 2222);
  BackwardCase bc(s);
  bc.run_forward();
  AttentionBackwardParams p = bc.params();
  attention_backward(p);
  const auto g = bc.read();
  const FiniteDiffResult r = finite_diff_check(p.attn, read_all(p.dout), g);
  ASSERT_GT(r.checked, 0);
  ASSERT_GT(r.largest, 0.01) << "gradients too small to test anything";
  // Central differences are accurate to ~1e-6 relative here (see naive_backward_test.cc); our
  // float32 arithmetic adds ~1e-6 more. Dropping dlse's or D's term is an error of ~0.1.
  EXPECT_LE(r.worst, 1e-4 * r.largest) << s.name() << ": " << r.checked << " elements";
}

TEST(CpuBackwardFiniteDifferences, GqaCausalQLongerThanKv) {
  CaseSpec s;
  s.q_lens = {7}, s.kv_lens = {5}, s.h_q = 4, s.h_kv = 2, s.head_dim = 8, s.head_dim_v = 4;
  s.causal = true;
  check_finite_differences(s);
}

// The softcap's gradient (through tanh, at a cap that bends every score) and ALiBi's shift, tied
// to the definition by the same finite differences.
TEST(CpuBackwardFiniteDifferences, SoftcapGqaCausal) {
  CaseSpec s;
  s.q_lens = {6}, s.kv_lens = {9}, s.h_q = 4, s.h_kv = 2, s.head_dim = 8, s.causal = true;
  s.softcap = 0.6f, s.softmax_scale = 0.9f;
  check_finite_differences(s);
}

TEST(CpuBackwardFiniteDifferences, SoftcapAndAlibiVarlenWindow) {
  CaseSpec s;
  s.batch = 2, s.q_lens = {4, 5}, s.kv_lens = {7, 3}, s.h_q = 2, s.h_kv = 1, s.head_dim = 8;
  s.q_layout = QLayout::kVarlen, s.kv_layout = KVLayout::kVarlen;
  s.window_left = 4, s.window_right = 2, s.softcap = 1.2f, s.alibi = 2;
  check_finite_differences(s);
}

TEST(CpuBackwardFiniteDifferences, VarlenWindowWithEmptySequence) {
  CaseSpec s;
  s.batch = 3, s.q_lens = {3, 0, 5}, s.kv_lens = {4, 3, 6}, s.h_q = 2, s.h_kv = 1;
  s.head_dim = 8, s.q_layout = QLayout::kVarlen, s.kv_layout = KVLayout::kVarlen;
  s.window_left = 3, s.window_right = 1;
  check_finite_differences(s);
}

// The CPU path is deterministic by construction (each gradient element is summed in one fixed
// order by one thread): two runs, and runs on 1 and 2 threads, give the same bits.
TEST(CpuBackwardDeterminism, BitIdenticalRunToRunAndAcrossThreadCounts) {
  CaseSpec s;
  s.batch = 2, s.q_lens = {150}, s.kv_lens = {260}, s.h_q = 8, s.h_kv = 2, s.head_dim = 64;
  s.causal = true, s.dtype = DType::kBFloat16, s.seed = 2201;
  BackwardCase bc(s);
  bc.run_forward();
  AttentionBackwardParams p = bc.params();
  p.deterministic = true;
  const int workers = ThreadPool::global().size();
  std::vector<attention::reference::NaiveGrads> runs;
  for (int threads : {workers, workers, 1, 3}) {
    ThreadPool::set_global_workers(threads);
    attention_backward(p);
    runs.push_back(bc.read());
  }
  ThreadPool::set_global_workers(workers);
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_TRUE(runs[i].dq == runs[0].dq) << "run " << i;
    EXPECT_TRUE(runs[i].dk == runs[0].dk) << "run " << i;
    EXPECT_TRUE(runs[i].dv == runs[0].dv) << "run " << i;
  }
}

// ---------------------------------------------------------------- validation

AttentionBackwardParams small(BackwardCase& bc) {
  bc.run_forward();
  return bc.params();
}

CaseSpec small_spec() {
  CaseSpec s;
  s.batch = 2, s.q_lens = {5}, s.kv_lens = {6}, s.h_q = 2, s.h_kv = 1, s.head_dim = 16;
  return s;
}

void expect_error(const AttentionBackwardParams& p, ErrorKind kind, const std::string& arg,
                  const std::string& contains) {
  try {
    attention_backward(p);
    ADD_FAILURE() << "no error; expected " << arg << ": ..." << contains;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_EQ(e.argument(), arg) << e.what();
    EXPECT_NE(std::string(e.what()).find(contains), std::string::npos) << e.what();
  }
}

TEST(CpuBackwardValidation, RefusesEachMalformedArgumentByName) {
  BackwardCase bc(small_spec());
  const AttentionBackwardParams good = small(bc);
  EXPECT_NO_THROW(validate(good));
  EXPECT_EQ(attention_backward_workspace_size(good), 0u);

  AttentionBackwardParams p = good;
  p.attn.lse = {};
  expect_error(p, ErrorKind::kInvalidArgument, "lse", "is required");
  p = good;
  p.dout = {};
  expect_error(p, ErrorKind::kInvalidArgument, "dout", "is required");
  p = good;
  p.dq.shape[1] = 4;
  expect_error(p, ErrorKind::kInvalidArgument, "dq", "differs from q's");
  p = good;
  p.dk.dtype = DType::kFloat16;
  expect_error(p, ErrorKind::kInvalidArgument, "dk", "dtype float16 differs from k's float32");
  p = good;
  p.dv.rank = 3;
  expect_error(p, ErrorKind::kInvalidArgument, "dv", "expected rank 4");
  p = good;
  p.dlse = p.attn.lse;
  p.dlse.dtype = DType::kFloat16;
  expect_error(p, ErrorKind::kInvalidArgument, "dlse", "differs from lse's float32");
  p = good;
  p.dq.data = p.attn.q.data;  // the gradient written over its own input
  expect_error(p, ErrorKind::kInvalidArgument, "dq", "overlaps q");
  p = good;
  p.dv = p.dk;  // dk and dv the same buffer (k and v have the same shape here)
  expect_error(p, ErrorKind::kInvalidArgument, "dv", "overlaps dk");
  p = good;
  p.dq.stride[1] = 0;
  expect_error(p, ErrorKind::kInvalidArgument, "dq", "share memory");
  p = good;
  p.attn.q.rank = 2;  // the forward's own checks come first, with the forward's names
  expect_error(p, ErrorKind::kInvalidArgument, "q", "expected rank 4");
  p = good;
  p.dq.device = {DeviceType::kCUDA, 0};
  expect_error(p, ErrorKind::kInvalidArgument, "dq", "same device");
}

TEST(CpuBackwardValidation, RefusesPagedKv) {
  CaseSpec s = small_spec();
  s.kv_layout = KVLayout::kPaged;
  BackwardCase bc(s);
  expect_error(small(bc), ErrorKind::kUnsupported, "block_table", "paged");
}

}  // namespace
}  // namespace flashserve::testing
