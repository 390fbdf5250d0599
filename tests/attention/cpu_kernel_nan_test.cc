// The NaN/infinity rule (docs/hardening.md) on every block-product kernel of the CPU path, forced
// one at a time: the portable loops, AVX-512 float32 (bf16 and fp16 converted), bf16 pairs
// (vdpbf16ps) and AMX tiles. CpuNan runs only what the dispatch picks on this machine (AMX for
// bf16 here), so each kernel's handling of NaN, +inf and -inf scores, rows that see no key, and
// the stale rows of whole AMX tiles is checked here against the float64 reference, over dense,
// varlen and paged layouts, GQA/MQA, windows and split-KV.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "attention/reference/cpu_amx.h"
#include "attention/reference/cpu_forward.h"
#include "attention/reference/cpu_gemm.h"
#include "common/half.h"
#include "support/compare.h"
#include "support/nan_cases.h"

namespace flashserve::testing {
namespace {

using attention::CpuIsa;

enum class Kernel { kPortable, kAvx512, kBf16Pairs, kAmx };

const char* kernel_name(Kernel k) {
  return k == Kernel::kPortable    ? "Portable"
         : k == Kernel::kAvx512    ? "Avx512"
         : k == Kernel::kBf16Pairs ? "Bf16Pairs"
                                   : "Amx";
}

// Forces one kernel for the lifetime of the guard (then back to the defaults: the best ISA, AMX
// on, pairs as they were). `skip` says why this machine or case cannot run it.
class ForceKernel {
 public:
  ForceKernel(Kernel k, const CaseSpec& s) : pairs_before_(attention::cpu_bf16_pairs()) {
    const bool bf16 = s.dtype == DType::kBFloat16;
    switch (k) {
      case Kernel::kPortable:
        attention::force_cpu_isa(CpuIsa::kPortable);
        break;
      case Kernel::kAvx512:
        attention::force_cpu_isa(CpuIsa::kAvx512);
        if (attention::cpu_isa() != CpuIsa::kAvx512) skip = "this CPU lacks AVX-512";
        break;
      case Kernel::kBf16Pairs:
        attention::cpu_use_amx(false);
        attention::cpu_use_bf16_pairs(true);
        if (!bf16) skip = "bf16 only";
        if (attention::cpu_isa() != CpuIsa::kAvx512Bf16) skip = "this CPU lacks AVX512-BF16";
        break;
      case Kernel::kAmx:
        attention::cpu_use_amx(true);
        if (!bf16 || s.head_dim % 32 != 0 || s.dv() % 32 != 0) skip = "bf16, head dims % 32";
        if (!attention::cpu_amx()) skip = "this CPU or OS lacks AMX-BF16";
        break;
    }
  }
  ~ForceKernel() {
    attention::force_cpu_isa(CpuIsa::kAvx512Bf16);  // capped to what the CPU has
    attention::cpu_use_amx(true);
    attention::cpu_use_bf16_pairs(pairs_before_);
  }
  std::string skip;

 private:
  bool pairs_before_;
};

// The shared NaN cases (dense/paged, GQA/MQA, windows, split-KV) plus varlen ones: sequences of
// different lengths (one empty), a causal window, split-KV over a varlen batch, an odd page size,
// head dim 32 (one AMX tile deep) with GQA 8 (tile rows not a multiple of 32), and -inf scores.
std::vector<NanCase> cases() {
  std::vector<NanCase> v = nan_cases({DType::kFloat32, DType::kFloat16, DType::kBFloat16});
  std::vector<CaseSpec> shapes;
  {
    CaseSpec s;
    s.batch = 3, s.q_lens = {5, 0, 40}, s.kv_lens = {9, 3, 300}, s.h_q = 4, s.h_kv = 2;
    s.head_dim = 64, s.q_layout = QLayout::kVarlen, s.kv_layout = KVLayout::kVarlen;
    s.causal = true, s.window_left = 20;
    shapes.push_back(s);
  }
  {
    CaseSpec s;
    s.batch = 2, s.q_lens = {1, 3}, s.kv_lens = {700, 290}, s.h_q = 8, s.h_kv = 1;
    s.head_dim = 32, s.q_layout = QLayout::kVarlen, s.kv_layout = KVLayout::kVarlen;
    s.num_splits = 3;
    shapes.push_back(s);
  }
  {
    CaseSpec s;
    s.batch = 2, s.q_lens = {33, 7}, s.kv_lens = {61, 100}, s.h_q = 8, s.h_kv = 8;
    s.head_dim = 128, s.head_dim_v = 64, s.q_layout = QLayout::kVarlen;
    s.kv_layout = KVLayout::kPaged, s.page_size = 7, s.causal = true;
    shapes.push_back(s);
  }
  for (const CaseSpec& shape : shapes)
    for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
      for (Poison p : {Poison::kNanQ, Poison::kNanK, Poison::kOverflow, Poison::kNegInf}) {
        if (dt == DType::kFloat16 && (p == Poison::kOverflow || p == Poison::kNegInf)) continue;
        NanCase c{shape, p};
        c.spec.dtype = dt;
        c.spec.seed = seed_for(c.name());
        v.push_back(c);
      }
  // -inf scores on the shared shapes too.
  for (NanCase c : nan_cases({DType::kFloat32, DType::kBFloat16}))
    if (c.poison == Poison::kOverflow) {
      c.poison = Poison::kNegInf;
      c.spec.seed = seed_for(c.name());
      v.push_back(c);
    }
  return v;
}

class CpuKernelNan : public ::testing::TestWithParam<std::tuple<Kernel, NanCase>> {};

TEST_P(CpuKernelNan, RowsThatSeeAPoisonedInputAreNanAndTheRestMatch) {
  const auto& [kernel, nc] = GetParam();
  ForceKernel force(kernel, nc.spec);
  if (!force.skip.empty()) GTEST_SKIP() << force.skip;
  expect_nan_rule(
      nc,
      [](AttentionCase& c) {
        c.poison_outputs();
        attention_forward(c.params());
        return read_output(c.params());
      },
      kernel_name(kernel));
}

// Every case on every kernel that takes its dtype (bf16 pairs and AMX are bf16 kernels).
std::vector<std::tuple<Kernel, NanCase>> kernel_cases() {
  std::vector<std::tuple<Kernel, NanCase>> v;
  for (const NanCase& c : cases())
    for (Kernel k : {Kernel::kPortable, Kernel::kAvx512, Kernel::kBf16Pairs, Kernel::kAmx})
      if (c.spec.dtype == DType::kBFloat16 || k == Kernel::kPortable || k == Kernel::kAvx512)
        v.emplace_back(k, c);
  return v;
}

std::string kernel_case_name(Kernel k, const std::string& name) {
  return std::string(kernel_name(k)) + "_" + name;
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuKernelNan, ::testing::ValuesIn(kernel_cases()),
                         [](const auto& info) {
                           return kernel_case_name(std::get<0>(info.param),
                                                   std::get<1>(info.param).name());
                         });

// Extreme finite inputs on every kernel: one head with q scaled by 1e30 and k by 1e-30 (float32
// and bf16 hold both; the scores stay O(1)), one with subnormal keys (AMX reads them as zero:
// the scores differ from the reference by less than 1e-70), one with q = -0.0 (every score 0:
// uniform attention). No NaN, no -inf, and the reference's result.
class CpuKernelExtreme : public ::testing::TestWithParam<std::tuple<Kernel, CaseSpec>> {};

TEST_P(CpuKernelExtreme, HugeSubnormalAndNegativeZeroInputsMatchTheReference) {
  const auto& [kernel, spec] = GetParam();
  ForceKernel force(kernel, spec);
  if (!force.skip.empty()) GTEST_SKIP() << force.skip;
  AttentionCase c(spec);
  const AttentionParams p = c.params();
  const attention::Problem pr = attention::describe(p);
  const attention::HostLayout L(p, pr);
  const int64_t G = pr.h_q / pr.h_kv;
  const bool wide = spec.dtype != DType::kFloat16;  // 1e30 is inf in fp16: 1e2 and 1e-2 there
  const float big = wide ? 1e30f : 1e2f;
  const float tiny = spec.dtype == DType::kFloat32    ? 1.4e-45f  // float32's least subnormal
                     : spec.dtype == DType::kBFloat16 ? 9.2e-41f  // bf16's least subnormal
                                                      : 6.0e-8f;  // fp16's
  for (int64_t b = 0; b < pr.batch; ++b) {
    for (int64_t t = 0; t < L.q_len(b); ++t)
      for (int64_t d = 0; d < pr.head_dim; ++d) {
        const int64_t o0 = L.q_offset(b, t, 0) + d;  // head 0 (KV head 0)
        store_float(p.q.data, o0, p.q.dtype, load_float(p.q.data, o0, p.q.dtype) * big);
        store_float(p.q.data, L.q_offset(b, t, 2 * G) + d, p.q.dtype, -0.0f);  // KV head 2
      }
    for (int64_t j = 0; j < L.kv_len(b); ++j)
      for (int64_t d = 0; d < pr.head_dim; ++d) {
        const int64_t o0 = L.k_offset(b, j, 0) + d;
        store_float(p.k.data, o0, p.k.dtype, load_float(p.k.data, o0, p.k.dtype) / big);
        const float sign = (j + d) % 3 == 0 ? -1.0f : (j + d) % 3 == 1 ? 1.0f : 0.0f;
        store_float(p.k.data, L.k_offset(b, j, 1) + d, p.k.dtype, sign * tiny * (1 + d % 3));
      }
  }
  const NaiveOutput exact = c.exact(), lowp = c.lowp();
  c.poison_outputs();
  attention_forward(p);
  const NaiveOutput actual = read_output(p);
  for (size_t r = 0; r < actual.lse.size(); ++r)
    ASSERT_TRUE(std::isfinite(actual.lse[r])) << "row " << r / pr.h_q << " head " << r % pr.h_q;
  expect_attention_close(actual, exact, lowp, spec.dtype);
}

std::vector<std::tuple<Kernel, CaseSpec>> extreme_cases() {
  std::vector<std::tuple<Kernel, CaseSpec>> v;
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (int layout = 0; layout < 2; ++layout) {
      CaseSpec s;
      s.batch = 2, s.q_lens = {19}, s.kv_lens = {300}, s.h_q = 6, s.h_kv = 3, s.head_dim = 64;
      s.dtype = dt, s.causal = layout == 0;
      if (layout == 1) s.kv_layout = KVLayout::kPaged, s.page_size = 16, s.num_splits = 2;
      s.seed = seed_for(s.name());
      for (Kernel k : {Kernel::kPortable, Kernel::kAvx512, Kernel::kBf16Pairs, Kernel::kAmx})
        if (dt == DType::kBFloat16 || k == Kernel::kPortable || k == Kernel::kAvx512)
          v.emplace_back(k, s);
    }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuKernelExtreme, ::testing::ValuesIn(extreme_cases()),
                         [](const auto& info) {
                           return kernel_case_name(std::get<0>(info.param),
                                                   std::get<1>(info.param).name());
                         });

}  // namespace
}  // namespace flashserve::testing
