// Properties of the float64 reference itself, checked against facts that do not come from it.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attention/mask.h"
#include "attention/problem.h"

#include "support/attention_case.h"
#include "support/compare.h"

namespace flashserve::testing {
namespace {

using attention::reference::Emulate;
using attention::reference::naive_forward;

// With one key visible per query, the output is that key's value row exactly.
TEST(NaiveReference, SingleVisibleKeyCopiesValue) {
  CaseSpec s;
  s.q_lens = {9};
  s.kv_lens = {9};
  s.head_dim = 16;
  s.causal = true;
  s.window_left = 0;  // query t sees exactly key t
  s.seed = seed_for("single");
  AttentionCase c(s);
  const auto p = c.params();
  const auto o = naive_forward(p);
  for (int64_t t = 0; t < 9; ++t) {
    for (int64_t d = 0; d < 16; ++d)
      EXPECT_EQ(o.out[t * 16 + d], load_float(p.v.data, t * p.v.stride[1] + d, p.v.dtype));
    // lse of a single score is the score itself.
    double dot = 0;
    for (int64_t d = 0; d < 16; ++d)
      dot += double(load_float(p.q.data, t * p.q.stride[1] + d, p.q.dtype)) *
             load_float(p.k.data, t * p.k.stride[1] + d, p.k.dtype);
    EXPECT_NEAR(o.lse[t], dot * (1.0 / std::sqrt(16.0f)), 1e-12);
  }
}

// The mask rule of the contract, enumerated by hand (bottom-right alignment).
TEST(Mask, BottomRightCausalAndWindows) {
  attention::Mask causal{-1, 0};
  // 3 queries, 5 keys: query t sits at position 2 + t.
  EXPECT_EQ(causal.first_key(0, 3, 5), 0);
  EXPECT_EQ(causal.last_key(0, 3, 5), 2);
  EXPECT_EQ(causal.last_key(2, 3, 5), 4);
  // 5 queries, 3 keys: queries 0 and 1 sit before every key and see nothing.
  EXPECT_GT(causal.first_key(1, 5, 3), causal.last_key(1, 5, 3));
  EXPECT_EQ(causal.last_key(2, 5, 3), 0);
  attention::Mask window{2, 1};  // keys p-2 .. p+1
  EXPECT_EQ(window.first_key(3, 6, 6), 1);
  EXPECT_EQ(window.last_key(3, 6, 6), 4);
  EXPECT_EQ(window.last_key(5, 6, 6), 5);  // clamped to kv_len - 1
  EXPECT_TRUE(window.visible(3, 1, 6, 6));
  EXPECT_FALSE(window.visible(3, 0, 6, 6));
  EXPECT_FALSE(window.visible(3, 5, 6, 6));
  attention::Mask none{};
  EXPECT_EQ(none.first_key(0, 4, 9), 0);
  EXPECT_EQ(none.last_key(0, 4, 9), 8);
}

// Dense copies of one sequence of a paged, varlen case, as a batch-1 dense call.
struct DenseCopy {
  std::vector<float> q, k, v, out;  // moved with the struct: the views stay valid
  AttentionParams p;
};

DenseCopy dense_copy(const AttentionParams& src, int64_t b, int64_t repeat_kv = 1) {
  const attention::Problem pr = attention::describe(src);
  const attention::HostLayout L(src, pr);
  const int64_t nq = L.q_len(b), nk = L.kv_len(b), D = pr.head_dim, Dv = pr.head_dim_v;
  const int64_t hkv = pr.h_kv * repeat_kv;
  DenseCopy c;
  c.q.resize(nq * pr.h_q * D);
  c.k.resize(nk * hkv * D);
  c.v.resize(nk * hkv * Dv);
  for (int64_t t = 0; t < nq; ++t)
    for (int64_t h = 0; h < pr.h_q; ++h)
      for (int64_t d = 0; d < D; ++d)
        c.q[(t * pr.h_q + h) * D + d] =
            load_float(src.q.data, L.q_offset(b, t, h) + d, src.q.dtype);
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t h = 0; h < hkv; ++h) {  // head h of the copy is head h / repeat of the source
      for (int64_t d = 0; d < D; ++d)
        c.k[(j * hkv + h) * D + d] =
            load_float(src.k.data, L.k_offset(b, j, h / repeat_kv) + d, src.k.dtype);
      for (int64_t d = 0; d < Dv; ++d)
        c.v[(j * hkv + h) * Dv + d] =
            load_float(src.v.data, L.v_offset(b, j, h / repeat_kv) + d, src.v.dtype);
    }
  c.out.assign(nq * pr.h_q * Dv, 0.0f);
  c.p = src;
  c.p.q = make_view(c.q.data(), DType::kFloat32, {1, nq, pr.h_q, D});
  c.p.k = make_view(c.k.data(), DType::kFloat32, {1, nk, hkv, D});
  c.p.v = make_view(c.v.data(), DType::kFloat32, {1, nk, hkv, Dv});
  c.p.out = make_view(c.out.data(), DType::kFloat32, {1, nq, pr.h_q, Dv});
  c.p.lse = {};
  c.p.cu_seqlens_q = c.p.cu_seqlens_k = c.p.seqused_k = c.p.block_table = {};
  return c;
}

// Paged + varlen addressing gives exactly what the same numbers give laid out densely, sequence
// by sequence; and GQA gives exactly what repeating each KV head for its group gives.
TEST(NaiveReference, PagedVarlenGqaEqualsDensePerSequence) {
  CaseSpec s;
  s.batch = 3;
  s.q_lens = {4, 7, 2};
  s.kv_lens = {30, 7, 17};
  s.h_q = 6;
  s.h_kv = 2;
  s.head_dim = 16;
  s.head_dim_v = 8;
  s.q_layout = QLayout::kVarlen;
  s.kv_layout = KVLayout::kPaged;
  s.page_size = 4;
  s.causal = true;
  s.window_left = 9;
  s.pad = 2;
  s.seed = seed_for("layouts");
  AttentionCase c(s);
  const AttentionParams p = c.params();
  for (auto mode : {Emulate::kExact, Emulate::kLowPrecision}) {
    const auto all = naive_forward(p, mode);
    int64_t row0 = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t repeat : {1, 3}) {  // 3: every query head gets its own copy of its KV head
        const DenseCopy d = dense_copy(p, b, repeat);
        const auto one = naive_forward(d.p, mode);
        for (size_t i = 0; i < one.out.size(); ++i)
          ASSERT_EQ(one.out[i], all.out[row0 * s.h_q * s.dv() + i]) << "b " << b << " i " << i;
        for (size_t i = 0; i < one.lse.size(); ++i)
          ASSERT_EQ(one.lse[i], all.lse[row0 * s.h_q + i]) << "b " << b << " i " << i;
      }
      row0 += s.q_len(b);
    }
  }
}

// The low-precision emulation differs from exact by about its dtype's rounding, no more.
TEST(NaiveReference, LowPrecisionErrorMatchesDtype) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    CaseSpec s;
    s.q_lens = {33};
    s.kv_lens = {200};
    s.h_q = 2;
    s.h_kv = 1;
    s.dtype = dt;
    s.seed = seed_for("lowp", static_cast<uint64_t>(dt));
    AttentionCase c(s);
    const auto e = c.exact(), l = c.lowp();
    double err = 0, mag = 0;
    for (size_t i = 0; i < e.out.size(); ++i) {
      err = std::max(err, std::abs(e.out[i] - l.out[i]));
      mag = std::max(mag, std::abs(e.out[i]));
    }
    // float32: accumulation over 200 keys and 64 dims; half types: rounding of P and out dominate.
    const double bound = dt == DType::kFloat32   ? 64 * 6e-8
                         : dt == DType::kFloat16 ? 8 * 4.9e-4
                                                 : 8 * 3.9e-3;
    EXPECT_GT(err, 0.0) << dtype_name(dt);  // it does emulate something
    EXPECT_LT(err, bound * mag) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace flashserve::testing
