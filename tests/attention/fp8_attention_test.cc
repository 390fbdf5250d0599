// float8_e4m3fn attention (attention.h, "FP8") on the CPU path and in the reference:
//  - the CPU path on e4m3 K/V beside a float32/fp16/bf16 q (an fp8 KV cache) and on e4m3 q, k, v
//    with per-(sequence, KV head) descale factors, against the float64 reference on the
//    dequantised inputs (the oracle), over dense, varlen and paged layouts, GQA, causal, windows;
//  - the emulation of FlashAttention-3's fp8 kernel (Emulate::kFp8Kernel) within the error bound
//    derived from e4m3's rounding (below), the bound the GPU kernel's tests build on;
//  - what is refused by name: mismatched dtypes, misplaced or misshapen descales, e4m3 on a CUDA
//    device (until the GPU kernels exist) and in the backward.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention/problem.h"
#include "flashserve/attention_backward.h"
#include "support/attention_case.h"
#include "support/compare.h"
#include "support/scoped_env.h"

namespace flashserve::testing {
namespace {

using attention::reference::Emulate;
using attention::reference::naive_forward;

CaseSpec base(std::vector<int64_t> q, std::vector<int64_t> k, Fp8 fp8) {
  CaseSpec s;
  s.batch = static_cast<int64_t>(std::max(q.size(), k.size()));
  s.q_lens = std::move(q);
  s.kv_lens = std::move(k);
  s.h_q = 2;
  s.h_kv = 2;
  s.head_dim = 64;
  s.fp8 = fp8;
  return s;
}

std::vector<CaseSpec> cases() {
  std::vector<CaseSpec> v;
  for (Fp8 fp8 : {Fp8::kKV, Fp8::kQKV}) {
    v.push_back(base({17}, {127}, fp8));
    v.push_back(with(base({127}, {127}, fp8), [](CaseSpec& s) { s.causal = true; }));
    v.push_back(with(base({1}, {1000}, fp8), [](CaseSpec& s) {  // a decode, GQA 4
      s.h_q = 8;
      s.h_kv = 2;
      s.head_dim = 128;
    }));
    v.push_back(with(base({33}, {300}, fp8), [](CaseSpec& s) {  // windows, d256, no descales
      s.head_dim = 256;
      s.window_left = 40;
      s.window_right = 3;
      s.descales = false;
    }));
    // Paged (pages of 16) with varlen q, a zero-length sequence and GQA 8: the serving layout.
    v.push_back(with(base({5, 0, 17, 1}, {40, 3, 300, 129}, fp8), [](CaseSpec& s) {
      s.q_layout = QLayout::kVarlen;
      s.kv_layout = KVLayout::kPaged;
      s.h_q = 16;
      s.h_kv = 2;
      s.causal = true;
    }));
    v.push_back(with(base({9, 30}, {70, 30}, fp8), [](CaseSpec& s) {  // varlen K/V, d128
      s.q_layout = QLayout::kVarlen;
      s.kv_layout = KVLayout::kVarlen;
      s.head_dim = 128;
      s.causal = true;
    }));
  }
  // An fp8 cache under 16-bit queries (out in q's dtype).
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    v.push_back(with(base({1, 17}, {200, 64}, Fp8::kKV), [&](CaseSpec& s) {
      s.dtype = dt;
      s.q_layout = QLayout::kVarlen;
      s.kv_layout = KVLayout::kPaged;
      s.h_q = 8;
      s.h_kv = 2;
      s.head_dim = 128;
      s.causal = true;
    }));
  return v;
}

class Fp8CpuForward : public ::testing::TestWithParam<CaseSpec> {};

// The CPU path computes in float32 on the dequantised inputs (code x descale), so the float64
// reference on those inputs is its oracle and the usual rule applies: twice the error of a naive
// kernel in q's precision plus the output dtype's floor. For e4m3 q the output is bfloat16 and
// the path's own error is that rounding (2^-9 relative) plus float32 noise: the bfloat16 floor
// alone (4e-3 x |out|max) bounds it, so the exact result stands in for the naive one there.
TEST_P(Fp8CpuForward, MatchesTheFloat64ReferenceOnTheDequantisedInputs) {
  CaseSpec s = GetParam();
  s.seed = seed_for(s.name());
  AttentionCase c(s);
  const auto exact = c.exact();
  const auto lowp = s.fp8 == Fp8::kQKV ? exact : c.lowp();
  const AttentionParams p = c.params();
  attention_forward(p);
  const auto actual = read_output(p);
  EXPECT_TRUE(attention_close(actual, exact, lowp, s.out_dtype())) << "seed " << s.seed;
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8CpuForward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });

// Emulate::kFp8Kernel against float64 on the same (dequantised) inputs, element by element,
// within the bound its rounding steps imply. With p_j = 2^8 exp(s_j - m) (m the running max; the
// final row sum l >= 2^8, the max key's own term), rounding p_j to e4m3 errs by at most 2^-4 p_j
// (normal) or 2^-10 (subnormal), so the output, sum_j round(p_j) v_j / l, errs by at most
//   (2^-4 + 2^-10 n_k / 2^8) max|v|
// plus the float32 scores' error (summing D products: |dS| <= gamma_D sum_d |scale q_d k_d|, which
// moves each weight by a factor within exp(+-2 |dS|)) times max|v|, the float32 sums over n_k keys
// of P V and of the row sum (each within n_k 2^-24 of its magnitude), and bfloat16's rounding of
// the output (2^-9 |out|).
TEST(Fp8Emulation, WithinTheBoundE4m3RoundingImplies) {
  for (const CaseSpec& spec : cases()) {
    if (spec.fp8 != Fp8::kQKV) continue;
    CaseSpec s = spec;
    s.seed = seed_for(s.name(), 23);
    AttentionCase c(s);
    const AttentionParams p = c.params();
    const auto exact = naive_forward(p, Emulate::kExact);
    const auto emul = naive_forward(p, Emulate::kFp8Kernel);
    const attention::Problem pr = attention::describe(p);
    const attention::HostLayout L(p, pr);
    const double gamma = s.head_dim * 0x1p-24 / (1 - s.head_dim * 0x1p-24);
    double worst_ratio = 0;
    for (int64_t b = 0; b < pr.batch; ++b)
      for (int64_t hk = 0; hk < pr.h_kv; ++hk) {
        const int64_t n_k = L.kv_len(b);
        const double kd = attention::HostLayout::descale(p.k_descale, b, hk);
        const double vd = attention::HostLayout::descale(p.v_descale, b, hk);
        const double qd = attention::HostLayout::descale(p.q_descale, b, hk);
        double vmax = 0;
        for (int64_t j = 0; j < n_k; ++j)
          for (int64_t d = 0; d < pr.head_dim_v; ++d)
            vmax = std::max(
                vmax, std::abs(vd * load_float(p.v.data, L.v_offset(b, j, hk) + d, p.v.dtype)));
        for (int64_t h = hk * (pr.h_q / pr.h_kv); h < (hk + 1) * (pr.h_q / pr.h_kv); ++h)
          for (int64_t t = 0; t < L.q_len(b); ++t) {
            double dot_abs = 0;  // max_j sum_d |scale q_d k_jd|
            for (int64_t j = 0; j < n_k; ++j) {
              double a = 0;
              for (int64_t d = 0; d < pr.head_dim; ++d)
                a += std::abs(pr.scale * qd *
                              load_float(p.q.data, L.q_offset(b, t, h) + d, p.q.dtype) * kd *
                              load_float(p.k.data, L.k_offset(b, j, hk) + d, p.k.dtype));
              dot_abs = std::max(dot_abs, a);
            }
            const double score_err = std::expm1(2 * gamma * dot_abs);
            const int64_t row = (L.q_row(b, t) * pr.h_q + h) * pr.head_dim_v;
            for (int64_t d = 0; d < pr.head_dim_v; ++d) {
              const double e = exact.out[row + d], got = emul.out[row + d];
              const double bound = (0x1p-4 + 0x1p-18 * n_k + score_err) * vmax +
                                   0x1p-9 * std::abs(got) + (2 * n_k * 0x1p-24 + 1e-6) * vmax;
              ASSERT_LE(std::abs(got - e), bound)
                  << s.name() << " seed " << s.seed << " b " << b << " t " << t << " h " << h
                  << " d " << d << ": emulated " << got << ", exact " << e;
              worst_ratio = std::max(worst_ratio, std::abs(got - e) / bound);
            }
          }
      }
    std::cout << s.name() << ": largest error / bound " << worst_ratio << "\n";
  }
}

// One visible key: P is 2^8 exactly (an e4m3 value) and the output is that key's value rounded
// to bfloat16, in the emulation and on the CPU path alike.
TEST(Fp8Emulation, OneKeyGivesItsValue) {
  CaseSpec s = base({1}, {1}, Fp8::kQKV);
  s.seed = seed_for(s.name(), 1);
  AttentionCase c(s);
  const AttentionParams p = c.params();
  const auto emul = naive_forward(p, Emulate::kFp8Kernel);
  attention_forward(p);
  const auto cpu = read_output(p);
  for (int64_t h = 0; h < s.h_q; ++h)  // h_q = h_kv: query head h reads KV head h
    for (int64_t d = 0; d < s.head_dim; ++d) {
      const float vd = attention::HostLayout::descale(p.v_descale, 0, h);
      const float v = vd * load_float(p.v.data, h * s.head_dim + d, p.v.dtype);
      EXPECT_EQ(emul.out[h * s.head_dim + d], to_float(to_bf16(v)));
      EXPECT_EQ(cpu.out[h * s.head_dim + d], to_float(to_bf16(v)));
    }
}

// The e4m3 dtype's rules, each refused naming the argument at fault.
class Fp8Validation : public ::testing::Test {
 protected:
  void SetUp() override {
    CaseSpec s = base({4}, {8}, Fp8::kQKV);
    c_ = std::make_unique<AttentionCase>(s);
  }
  static std::string refusal(const AttentionParams& p, ErrorKind* kind = nullptr) {
    try {
      validate(p);
    } catch (const Error& e) {
      if (kind) *kind = e.kind();
      return e.argument() + ": " + e.what();
    }
    return "accepted";
  }
  std::unique_ptr<AttentionCase> c_;
};

TEST_F(Fp8Validation, Dtypes) {
  AttentionParams p = c_->params();
  EXPECT_EQ(refusal(p), "accepted");
  std::vector<float> out32(p.out.numel());
  AttentionParams q = p;
  q.out.data = out32.data();
  q.out.dtype = DType::kFloat32;
  EXPECT_NE(refusal(q).find("out: "), std::string::npos) << refusal(q);
  EXPECT_NE(refusal(q).find("a float8_e4m3fn q gives a bfloat16 out"), std::string::npos);
  q = p;
  q.v.dtype = DType::kBFloat16;  // e4m3 k beside a bf16 v
  EXPECT_NE(refusal(q).find("v: "), std::string::npos) << refusal(q);
}

TEST_F(Fp8Validation, Descales) {
  AttentionParams p = c_->params();
  std::vector<float> ds(4, 1.0f);
  AttentionParams q = p;
  q.k_descale = make_view(ds.data(), DType::kFloat32, {2, 2});  // batch is 1
  EXPECT_NE(refusal(q).find("k_descale: "), std::string::npos) << refusal(q);
  EXPECT_NE(refusal(q).find("is not [batch, h_kv] = [1, 2]"), std::string::npos) << refusal(q);
  q = p;
  q.v_descale = make_view(ds.data(), DType::kInt32, {1, 2});
  EXPECT_NE(refusal(q).find("v_descale: "), std::string::npos) << refusal(q);

  // A descale beside a tensor that is not e4m3.
  CaseSpec s = base({4}, {8}, Fp8::kKV);
  AttentionCase kv(s);
  q = kv.params();
  EXPECT_EQ(refusal(q), "accepted");
  q.q_descale = make_view(ds.data(), DType::kFloat32, {1, 2});
  EXPECT_EQ(refusal(q).rfind("q_descale: ", 0), 0u) << refusal(q);
  EXPECT_NE(refusal(q).find("applies to a float8_e4m3fn q, not a float32 one"), std::string::npos);
}

// What reaches CUDA of e4m3: an e4m3 k and v beside a 16-bit q (an fp8 KV cache) goes to sm80's
// fp8 KV kernels, which are off until FLASHSERVE_CUDA_FP8_KV=1: refused by every entry point
// naming k and saying so (this case's float32 q would be refused next, by the kernels' dtype
// check); all-e4m3 q, k, v go to the sm90 fp8 forward, which FLASHSERVE_FP8_ATTENTION=0 turns
// off, and its refusal then says how to turn it on, naming q; a value of either switch other
// than 0 or 1 is refused naming the variable. All before anything reads device memory (the
// pointers here are never dereferenced: with FLASHSERVE_FP8_ATTENTION unset an all-e4m3 call
// would run, so that case is left out). In a build without CUDA every CUDA tensor is refused
// naming q.
TEST_F(Fp8Validation, RefusedOnCuda) {
  for (Fp8 fp8 : {Fp8::kKV, Fp8::kQKV})
    for (const char* fp8_switch : {static_cast<const char*>(nullptr), "0", "yes"}) {
#if defined(FLASHSERVE_WITH_CUDA)
      if (fp8 == Fp8::kQKV && fp8_switch == nullptr) continue;  // on by default: it would run
#endif
      ScopedEnv env(fp8 == Fp8::kKV ? "FLASHSERVE_CUDA_FP8_KV" : "FLASHSERVE_FP8_ATTENTION",
                    fp8_switch);
      AttentionCase kv(base({4}, {8}, fp8));
      std::vector<void*> fake;
      for (const auto& b : kv.buffers()) fake.push_back(b.bytes ? b.host : nullptr);
      const AttentionParams p = kv.params(Device{DeviceType::kCUDA, 0}, fake.data());
      std::string arg = fp8 == Fp8::kQKV ? "q" : "k";
      std::string what = fp8 == Fp8::kQKV ? "set FLASHSERVE_FP8_ATTENTION=1 to turn it on"
                                          : "set FLASHSERVE_CUDA_FP8_KV=1 to turn them on";
      ErrorKind kind = ErrorKind::kUnsupported;
#if defined(FLASHSERVE_WITH_CUDA)
      if (fp8_switch != nullptr && std::string(fp8_switch) == "yes") {
        arg = fp8 == Fp8::kQKV ? "FLASHSERVE_FP8_ATTENTION" : "FLASHSERVE_CUDA_FP8_KV";
        what = "must be 0 or 1, got \"yes\"";
        kind = ErrorKind::kInvalidArgument;
      }
#else
      arg = "q";
      what = "built without CUDA";
#endif
      auto expect_refused = [&](auto&& call, const char* entry) {
        try {
          call();
          ADD_FAILURE() << entry << " accepted an e4m3 CUDA tensor";
        } catch (const Error& e) {
          EXPECT_EQ(e.kind(), kind) << entry << ": " << e.what();
          EXPECT_EQ(e.argument(), arg) << entry;
          EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
      };
      expect_refused([&] { attention_forward(p); }, "attention_forward");
      expect_refused([&] { plan_attention(p); }, "plan_attention");
      expect_refused([&] { (void)attention_workspace_size(p); }, "attention_workspace_size");
    }
}

// A float32 q over a 16-bit k and v (the CPU runner's bf16 cache): the CPU path runs it against
// the reference; CUDA refuses it by name, and v must be k's dtype.
TEST(NarrowerKv, Bf16KvBesideFloat32QOnTheCpuPathOnly) {
  for (DType kv : {DType::kBFloat16, DType::kFloat16}) {
    const int64_t n_q = 9, n_k = 40, h = 2, d = 64;
    std::mt19937_64 rng(seed_for(dtype_name(kv), 5));
    std::normal_distribution<float> normal;
    std::vector<float> q(n_q * h * d), out(n_q * h * d);
    std::vector<uint16_t> k(n_k * h * d), v(n_k * h * d);
    for (float& x : q) x = normal(rng);
    for (auto* t : {&k, &v})
      for (size_t i = 0; i < t->size(); ++i) store_float(t->data(), i, kv, normal(rng));
    AttentionParams p;
    p.q = make_view(q.data(), DType::kFloat32, {1, n_q, h, d});
    p.k = make_view(k.data(), kv, {1, n_k, h, d});
    p.v = make_view(v.data(), kv, {1, n_k, h, d});
    p.out = make_view(out.data(), DType::kFloat32, {1, n_q, h, d});
    p.causal = true;
    const auto exact = naive_forward(p, Emulate::kExact);
    const auto lowp = naive_forward(p, Emulate::kLowPrecision);
    attention_forward(p);
    EXPECT_TRUE(attention_close(read_output(p), exact, lowp, DType::kFloat32));

    AttentionParams bad = p;
    bad.v.dtype = DType::kFloat32;
    try {
      validate(bad);
      ADD_FAILURE() << "v of another dtype than k accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "v") << e.what();
    }
    AttentionParams cuda = p;
    for (TensorView* t : {&cuda.q, &cuda.k, &cuda.v, &cuda.out}) t->device = {DeviceType::kCUDA, 0};
    try {
      attention_forward(cuda);
      ADD_FAILURE() << "a 16-bit k beside a float32 q accepted on CUDA";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("CPU path only"), std::string::npos) << e.what();
    }
  }
}

TEST_F(Fp8Validation, NoBackward) {
  const AttentionParams p = c_->params();
  AttentionBackwardParams bp;
  bp.attn = p;
  std::vector<float> lse(p.q.shape[2] * p.q.shape[1] * p.q.shape[0]);
  bp.attn.lse = make_view(lse.data(), DType::kFloat32, {p.q.shape[0], p.q.shape[2], p.q.shape[1]});
  bp.dout = p.out;
  try {
    attention_backward(bp);
    ADD_FAILURE() << "the backward accepted e4m3 inputs";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("no backward"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flashserve::testing
