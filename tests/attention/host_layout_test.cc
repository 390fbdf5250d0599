// HostLayout's addressing against offsets written out from the layouts of attention.h. The CPU
// forward and the float64 reference both address memory through HostLayout, so comparing one with
// the other cannot catch a wrong offset that still lands on live data (another sequence's keys, a
// page of the wrong row); this test can.
#include "attention/problem.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/attention_case.h"

namespace flashserve::testing {
namespace {

void check_layout(const CaseSpec& spec) {
  AttentionCase c(spec);
  const AttentionParams p = c.params();
  const attention::Problem pr = attention::describe(p);
  const attention::HostLayout L(p, pr);
  const int64_t B = spec.batch, P = spec.pad;
  const int64_t qs = spec.head_dim + P, os = spec.dv() + P;  // strides between heads
  const int64_t ks = spec.head_dim + P, vs = spec.dv() + P;
  const bool varlen_q = spec.q_layout == QLayout::kVarlen;
  const int32_t* table = p.block_table.ptr<const int32_t>();
  const int64_t pages_per_seq = p.block_table.shape[1];

  int64_t q_row = 0, kv_row = 0;  // first row of sequence b in q and in varlen k
  ASSERT_EQ(L.q_rows(), c.q_rows());
  for (int64_t b = 0; b < B; ++b) {
    ASSERT_EQ(L.q_len(b), spec.q_len(b)) << "b " << b;
    ASSERT_EQ(L.kv_len(b), spec.kv_len(b)) << "b " << b;
    for (int64_t t = 0; t < spec.q_len(b); ++t) {
      const int64_t row = varlen_q ? q_row + t : b * spec.q_len(0) + t;
      EXPECT_EQ(L.q_row(b, t), row);
      for (int64_t h = 0; h < spec.h_q; ++h) {
        EXPECT_EQ(L.q_offset(b, t, h), (row * spec.h_q + h) * qs) << b << " " << t << " " << h;
        EXPECT_EQ(L.out_offset(b, t, h), (row * spec.h_q + h) * os) << b << " " << t << " " << h;
        const int64_t lse =
            varlen_q ? h * c.q_rows() + row : (b * spec.h_q + h) * spec.q_len(0) + t;
        EXPECT_EQ(L.lse_offset(b, t, h), lse) << b << " " << t << " " << h;
      }
    }
    const int64_t kv_stored = spec.kv_len(b) + (spec.use_seqused_k ? spec.kv_extra : 0);
    for (int64_t j = 0; j < spec.kv_len(b); ++j) {
      int64_t slot = 0;  // the token row of key j in k and v viewed as [slots, h_kv, dim]
      switch (spec.kv_layout) {
        case KVLayout::kDense:
          slot = b * p.k.shape[1] + j;
          break;
        case KVLayout::kVarlen:
          slot = kv_row + j;
          break;
        case KVLayout::kPaged:
          slot =
              table[b * pages_per_seq + j / spec.page_size] * spec.page_size + j % spec.page_size;
          break;
      }
      for (int64_t h = 0; h < spec.h_kv; ++h) {
        EXPECT_EQ(L.k_offset(b, j, h), (slot * spec.h_kv + h) * ks) << b << " " << j << " " << h;
        EXPECT_EQ(L.v_offset(b, j, h), (slot * spec.h_kv + h) * vs) << b << " " << j << " " << h;
      }
    }
    q_row += spec.q_len(b);
    kv_row += kv_stored;
  }
}

CaseSpec spec(QLayout q, KVLayout kv) {
  CaseSpec s;
  s.batch = 3;
  s.q_lens = q == QLayout::kDense ? std::vector<int64_t>{4} : std::vector<int64_t>{3, 0, 5};
  s.kv_lens = kv == KVLayout::kDense ? std::vector<int64_t>{11} : std::vector<int64_t>{9, 2, 20};
  s.h_q = 4;
  s.h_kv = 2;
  s.head_dim = 8;
  s.head_dim_v = 6;
  s.pad = 3;  // head rows of different strides for q, k, v and out
  s.q_layout = q;
  s.kv_layout = kv;
  s.page_size = 4;
  s.seed = seed_for(s.name());
  return s;
}

TEST(HostLayout, EveryLayoutMatchesTheContract) {
  for (QLayout q : {QLayout::kDense, QLayout::kVarlen})
    for (KVLayout kv : {KVLayout::kDense, KVLayout::kVarlen, KVLayout::kPaged}) {
      SCOPED_TRACE(spec(q, kv).name());
      check_layout(spec(q, kv));
    }
}

TEST(HostLayout, SequsedKWithExtraStoredKeys) {
  for (KVLayout kv : {KVLayout::kDense, KVLayout::kVarlen}) {
    CaseSpec s = spec(QLayout::kVarlen, kv);
    s.kv_lens = {9, 2, 20};
    s.use_seqused_k = true;
    s.kv_extra = 5;
    SCOPED_TRACE(s.name());
    check_layout(s);
  }
}

}  // namespace
}  // namespace flashserve::testing
