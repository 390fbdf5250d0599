// cpu_forward (the tiled online-softmax CPU path) against the float64 reference, one named test per
// shape. Every case also checks that nothing outside the output rows was written (out's padding and
// rows of no sequence keep their NaN poison) and that two runs give bit-identical results.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attention/backends.h"
#include "attention/reference/cpu_forward.h"
#include "attention/reference/cpu_gemm.h"
#include "support/attention_case.h"
#include "support/compare.h"

namespace flashserve::testing {
namespace {

CaseSpec base(std::vector<int64_t> q, std::vector<int64_t> k) {
  CaseSpec s;
  s.batch = static_cast<int64_t>(std::max(q.size(), k.size()));
  s.q_lens = std::move(q);
  s.kv_lens = std::move(k);
  s.h_q = 2;
  s.h_kv = 2;
  s.head_dim = 64;
  return s;
}

std::vector<CaseSpec> cases() {
  std::vector<CaseSpec> v;
  // Odd lengths, square.
  for (int64_t n : {1, 17, 127}) v.push_back(base({n}, {n}));
  v.push_back(with(base({1000}, {1000}), [](CaseSpec& s) { s.h_q = s.h_kv = 1; }));
  v.push_back(with(base({1000}, {1000}), [](CaseSpec& s) {
    s.h_q = s.h_kv = 1;
    s.causal = true;
    s.dtype = DType::kBFloat16;
  }));
  // q_len < kv_len (decode and chunked prefill) and q_len > kv_len.
  v.push_back(base({1}, {1000}));
  v.push_back(with(base({17}, {1000}), [](CaseSpec& s) { s.causal = true; }));
  v.push_back(with(base({127}, {17}), [](CaseSpec& s) { s.batch = 2; }));
  v.push_back(with(base({127}, {17}), [](CaseSpec& s) { s.causal = true; }));  // masked rows
  // GQA ratios 4 and 8, MQA.
  for (int64_t ratio : {4, 8})
    v.push_back(with(base({17}, {127}), [&](CaseSpec& s) {
      s.h_kv = 2;
      s.h_q = 2 * ratio;
      s.causal = true;
    }));
  v.push_back(with(base({33}, {80}), [](CaseSpec& s) {
    s.h_q = 8;
    s.h_kv = 1;
    s.dtype = DType::kFloat16;
  }));
  v.push_back(with(base({1}, {300}), [](CaseSpec& s) {  // decode with a group of 16 > tile rows
    s.batch = 3;
    s.h_q = 16 * 2;
    s.h_kv = 2;
  }));
  // Head dims 128, 256, an odd one, and head_dim_v != head_dim.
  for (int64_t d : {128, 256, 80})
    v.push_back(with(base({17}, {127}), [&](CaseSpec& s) {
      s.head_dim = d;
      s.causal = d == 80;
    }));
  v.push_back(with(base({9}, {70}), [](CaseSpec& s) {
    s.head_dim = 48;
    s.head_dim_v = 24;
  }));
  // Paged KV, page sizes 1, 16, 256, with varlen q and a zero-length sequence.
  for (int64_t ps : {1, 16, 256})
    v.push_back(with(base({5, 0, 17, 1}, {40, 3, 300, 129}), [&](CaseSpec& s) {
      s.q_layout = QLayout::kVarlen;
      s.kv_layout = KVLayout::kPaged;
      s.page_size = ps;
      s.h_q = 4;
      s.h_kv = 2;
      s.causal = true;
      s.dtype = ps == 16 ? DType::kFloat16 : ps == 256 ? DType::kBFloat16 : DType::kFloat32;
    }));
  v.push_back(with(base({17}, {100}), [](CaseSpec& s) {  // paged with dense q
    s.batch = 2;
    s.kv_lens = {100, 33};
    s.kv_layout = KVLayout::kPaged;
    s.page_size = 16;
  }));
  // Varlen q and k, zero-length sequences (a sequence with keys but no queries and one with
  // queries but no keys, whose rows are fully masked).
  v.push_back(with(base({5, 0, 17, 3}, {40, 3, 17, 0}), [](CaseSpec& s) {
    s.q_layout = QLayout::kVarlen;
    s.kv_layout = KVLayout::kVarlen;
    s.h_q = 6;
    s.h_kv = 3;
  }));
  // seqused_k with dense and varlen KV (keys past it are NaN poison).
  v.push_back(with(base({7}, {50}), [](CaseSpec& s) {
    s.batch = 2;
    s.kv_lens = {50, 21};
    s.use_seqused_k = true;
    s.kv_extra = 9;
    s.causal = true;
  }));
  v.push_back(with(base({7, 2}, {50, 21}), [](CaseSpec& s) {
    s.q_layout = QLayout::kVarlen;
    s.kv_layout = KVLayout::kVarlen;
    s.use_seqused_k = true;
    s.kv_extra = 5;
  }));
  // Sliding windows, causal and not.
  v.push_back(with(base({127}, {127}), [](CaseSpec& s) {
    s.causal = true;
    s.window_left = 8;
  }));
  v.push_back(with(base({64}, {200}), [](CaseSpec& s) {
    s.window_left = 16;
    s.window_right = 4;
  }));
  v.push_back(with(base({40}, {90}), [](CaseSpec& s) { s.window_right = 3; }));
  v.push_back(with(base({100}, {30}), [](CaseSpec& s) {  // windows that miss the keys entirely
    s.window_left = 5;
    s.window_right = 0;
  }));
  v.push_back(with(base({20}, {20}), [](CaseSpec& s) {  // only the diagonal
    s.window_left = 0;
    s.window_right = 0;
    s.dtype = DType::kFloat16;
  }));
  // fp16 / bf16 on a general shape; strided views; no lse; custom scale.
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    v.push_back(with(base({33}, {129}), [&](CaseSpec& s) {
      s.dtype = dt;
      s.h_q = 4;
      s.h_kv = 1;
    }));
  v.push_back(with(base({17}, {127}), [](CaseSpec& s) {
    s.pad = 8;
    s.h_q = 4;
    s.causal = true;
  }));
  v.push_back(with(base({5, 30}, {60, 31}), [](CaseSpec& s) {
    s.pad = 3;
    s.q_layout = QLayout::kVarlen;
    s.kv_layout = KVLayout::kPaged;
    s.dtype = DType::kBFloat16;
  }));
  v.push_back(with(base({17}, {64}), [](CaseSpec& s) {
    s.with_lse = false;
    s.softmax_scale = 0.5f;
  }));
  // Tile edges of the block products (CpuTiling: 128 rows x 256 keys): lengths one either side
  // of a tile and of a key block, causal diagonals that cut a block, windows that straddle two
  // blocks, and a GQA group of 8 (16 queries x 8 heads per tile).
  for (int64_t n : {255, 257, 513})
    v.push_back(with(base({n}, {n}), [&](CaseSpec& s) {
      s.h_q = s.h_kv = 1;
      s.causal = n != 257;
      s.dtype = n == 513 ? DType::kBFloat16 : DType::kFloat32;
    }));
  v.push_back(with(base({129}, {767}), [](CaseSpec& s) {
    s.h_q = 8;
    s.h_kv = 1;
    s.causal = true;
    s.window_left = 300;  // the window starts inside one key block and ends in the next
    s.dtype = DType::kBFloat16;
  }));
  v.push_back(with(base({300}, {300}), [](CaseSpec& s) {
    s.h_q = 16;
    s.h_kv = 2;
    s.causal = true;
    s.head_dim = 128;
    s.window_left = 200;
    s.window_right = 0;
  }));
  v.push_back(
      with(base({130, 0, 257}, {600, 5, 257}), [](CaseSpec& s) {  // paged, blocks cross pages
        s.q_layout = QLayout::kVarlen;
        s.kv_layout = KVLayout::kPaged;
        s.page_size = 16;
        s.h_q = 4;
        s.h_kv = 1;
        s.causal = true;
        s.dtype = DType::kBFloat16;
      }));
  v.push_back(with(base({1, 64}, {1025, 1000}), [](CaseSpec& s) {  // decode-like, odd key tails
    s.q_layout = QLayout::kVarlen;
    s.kv_layout = KVLayout::kVarlen;
    s.h_q = 8;
    s.h_kv = 2;
    s.head_dim = 128;
    s.head_dim_v = 64;
  }));
  // Score modifiers (score_mod.h): softcap small enough to bend the scores (normal q, k give
  // scaled scores of about N(0, 1); a scale of 1 makes them N(0, d)), ALiBi per head and per
  // sequence and head, each with the masks, layouts, GQA, split-KV and tile edges above.
  v.push_back(with(base({17}, {17}), [](CaseSpec& s) { s.softcap = 0.7f; }));
  v.push_back(with(base({127}, {127}), [](CaseSpec& s) {
    s.softcap = 5.0f;
    s.softmax_scale = 1.0f;
    s.causal = true;
    s.dtype = DType::kBFloat16;
  }));
  v.push_back(with(base({17}, {127}), [](CaseSpec& s) {
    s.h_q = 8;
    s.h_kv = 2;
    s.softcap = 1.5f;
    s.causal = true;
    s.window_left = 20;
    s.dtype = DType::kFloat16;
  }));
  v.push_back(with(base({5, 0, 17, 1}, {40, 3, 300, 129}), [](CaseSpec& s) {
    s.q_layout = QLayout::kVarlen;
    s.kv_layout = KVLayout::kPaged;
    s.h_q = 4;
    s.h_kv = 2;
    s.causal = true;
    s.softcap = 2.0f;
    s.alibi = 2;
    s.dtype = DType::kBFloat16;
  }));
  v.push_back(with(base({1}, {1000}), [](CaseSpec& s) {
    s.batch = 2;
    s.h_q = 8;
    s.h_kv = 2;
    s.softcap = 1.0f;
    s.alibi = 1;
    s.num_splits = 3;
  }));
  v.push_back(with(base({257}, {513}), [](CaseSpec& s) {
    s.h_q = s.h_kv = 1;
    s.softcap = 3.0f;
    s.softmax_scale = 0.5f;
    s.window_left = 16;
    s.window_right = 4;
  }));
  v.push_back(with(base({33}, {80}), [](CaseSpec& s) {
    s.h_q = 6;
    s.h_kv = 2;
    s.alibi = 1;
    s.causal = true;
  }));
  v.push_back(with(base({7, 30}, {50, 21}), [](CaseSpec& s) {  // bias both sides of p
    s.q_layout = QLayout::kVarlen;
    s.kv_layout = KVLayout::kVarlen;
    s.alibi = 2;
    s.dtype = DType::kFloat16;
  }));
  v.push_back(with(base({17}, {300}), [](CaseSpec& s) {
    s.pad = 5;
    s.h_q = 4;
    s.softcap = 0.5f;
    s.alibi = 1;
    s.window_left = 100;
    s.head_dim = 128;
    s.dtype = DType::kBFloat16;
  }));
  return v;
}

class CpuForward : public ::testing::TestWithParam<CaseSpec> {};

// Elements of out's buffer that the contract lets the kernel write.
int64_t addressed_out_elements(const AttentionParams& p) {
  const attention::Problem pr = attention::describe(p);
  const attention::HostLayout L(p, pr);
  int64_t n = 0;
  for (int64_t b = 0; b < pr.batch; ++b) n += L.q_len(b) * pr.h_q * pr.head_dim_v;
  return n;
}

void check_against_reference(CaseSpec s) {
  s.seed = seed_for(s.name());
  AttentionCase c(s);
  const auto exact = c.exact();
  const auto lowp = c.lowp();
  const AttentionParams p = c.params();
  attention_forward(p);
  const auto actual = read_output(p);
  expect_attention_close(actual, exact, lowp, s.dtype);

  // Nothing but the output rows was written: every other element of out keeps its NaN.
  const auto bufs = c.buffers();
  const size_t esz = dtype_size(s.dtype);
  const int64_t total = static_cast<int64_t>(bufs[AttentionCase::kOut].bytes / esz);
  int64_t nan = 0;
  for (int64_t i = 0; i < total; ++i)
    nan += std::isnan(load_float(bufs[AttentionCase::kOut].host, i, s.dtype));
  EXPECT_EQ(nan, total - addressed_out_elements(p));

  // A second run on the same inputs gives the same bits (a difference would be a race).
  auto bytes_of = [&](AttentionCase::Buffer i) {
    return std::vector<std::byte>(bufs[i].host, bufs[i].host + bufs[i].bytes);
  };
  const auto out1 = bytes_of(AttentionCase::kOut), lse1 = bytes_of(AttentionCase::kLse);
  c.poison_outputs();
  attention_forward(p);
  EXPECT_TRUE(out1 == bytes_of(AttentionCase::kOut)) << "out differs between two runs";
  EXPECT_TRUE(lse1 == bytes_of(AttentionCase::kLse)) << "lse differs between two runs";
}

TEST_P(CpuForward, MatchesFloat64Reference) {
  check_against_reference(GetParam());
}

// The same cases on the portable kernels (what a CPU without AVX-512 runs).
TEST_P(CpuForward, MatchesFloat64ReferencePortable) {
  attention::force_cpu_isa(attention::CpuIsa::kPortable);
  check_against_reference(GetParam());
  attention::force_cpu_isa(attention::CpuIsa::kAvx512Bf16);  // back to the best the CPU has
}

// bf16 cases with the block products in bf16 pairs (P rounded to bf16), where the CPU has them.
TEST_P(CpuForward, MatchesFloat64ReferenceBf16Pairs) {
  if (GetParam().dtype != DType::kBFloat16) GTEST_SKIP() << "bf16 cases only";
  if (attention::cpu_isa() != attention::CpuIsa::kAvx512Bf16)
    GTEST_SKIP() << "this CPU lacks AVX512-BF16";
  const bool before = attention::cpu_bf16_pairs();
  attention::cpu_use_bf16_pairs(true);
  attention::cpu_use_amx(false);  // AMX takes precedence
  check_against_reference(GetParam());
  attention::cpu_use_amx(true);
  attention::cpu_use_bf16_pairs(before);
}

// The same cases on the AVX-512 kernels without AMX or bf16 pairs (bf16 blocks converted to
// float32): MatchesFloat64Reference runs bf16 on AMX where the machine has it.
TEST_P(CpuForward, MatchesFloat64ReferenceAvx512) {
  attention::force_cpu_isa(attention::CpuIsa::kAvx512);
  if (attention::cpu_isa() != attention::CpuIsa::kAvx512) {
    attention::force_cpu_isa(attention::CpuIsa::kAvx512Bf16);
    GTEST_SKIP() << "this CPU lacks AVX-512";
  }
  check_against_reference(GetParam());
  attention::force_cpu_isa(attention::CpuIsa::kAvx512Bf16);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuForward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });

// Rows that see no key: out exactly 0 and lse exactly -inf, never NaN, in every dtype.
TEST(CpuForwardMasked, FullyMaskedRowsAreZeroWithLseMinusInf) {
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    CaseSpec s = base({12, 4, 3}, {5, 0, 9});
    s.q_layout = QLayout::kVarlen;
    s.kv_layout = KVLayout::kVarlen;
    s.causal = true;  // sequence 0: queries 0..6 see nothing; sequence 1: no keys at all
    s.window_left = 1;
    s.dtype = dt;
    s.seed = seed_for(s.name());
    AttentionCase c(s);
    const AttentionParams p = c.params();
    attention_forward(p);
    const auto o = read_output(p);
    int64_t masked = 0;
    const int64_t rows_masked[] = {0, 1, 2, 3, 4, 5, 6, 12, 13, 14, 15};
    for (int64_t row : rows_masked)
      for (int64_t h = 0; h < s.h_q; ++h) {
        EXPECT_EQ(o.lse[row * s.h_q + h], -INFINITY) << "row " << row;
        for (int64_t d = 0; d < s.dv(); ++d) EXPECT_EQ(o.out[(row * s.h_q + h) * s.dv() + d], 0.0);
        ++masked;
      }
    EXPECT_EQ(masked, 11 * s.h_q);
    // The others are finite.
    for (int64_t row : {7, 8, 11, 16, 18})
      EXPECT_TRUE(std::isfinite(o.lse[row * s.h_q])) << "row " << row;
  }
}

}  // namespace
}  // namespace flashserve::testing
