// The plan of an fp8 KV cache's call on CUDA (e4m3 K/V beside a bfloat16 q; src/attention/cuda/
// plan.h fp8_kv_lacks, and choose_kernel's kv_fp8), without a GPU: the switch and its default,
// the routing to sm80's fp8 KV kernels (decode tiles, masked prefill tiles whatever the mask,
// never sm90, the same splits as bf16), and every refusal by name.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "attention/cuda/plan.h"
#include "flashserve/error.h"
#include "model/kv_cache_dtype.h"
#include "support/plan_step.h"

namespace flashserve::testing {
namespace {

using attention::FamilyRequest;
using attention::HostLengths;
using attention::make_plan;
using attention::Plan;
using attention::PlanContext;
using attention::Problem;

using Step = PlanStep;

// A varlen, causal, 32/8-head d128 step over a paged e4m3 cache, the switch on, a device where
// sm90 could run (so that the tests see the routing, not sm90's absence).
Step step(const std::vector<std::pair<int64_t, int64_t>>& seqs, int64_t d = 128) {
  Step s = plan_step(seqs, d);
  s.pr.dtype = DType::kBFloat16;
  s.pr.kv_dtype = DType::kFloat8E4M3;
  s.pr.out_dtype = DType::kBFloat16;
  s.ctx.sm90_unavailable = "";
  s.ctx.fp8_kv_cache = true;
  return s;
}

std::string refusal(const Step& s) {
  try {
    make_plan(s.pr, s.ctx, s.lens);
    return "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
    return e.argument() + ": " + e.what();
  }
}

TEST(PlanKvFp8, SwitchIsStrictAndOffByDefault) {
  EXPECT_FALSE(attention::kFp8KvCacheByDefault) << "on before its first device run?";
  EXPECT_EQ(attention::parse_fp8_kv_cache(nullptr), attention::kFp8KvCacheByDefault);
  EXPECT_EQ(attention::parse_fp8_kv_cache(""), attention::kFp8KvCacheByDefault);
  EXPECT_TRUE(attention::parse_fp8_kv_cache("1"));
  EXPECT_FALSE(attention::parse_fp8_kv_cache("0"));
  for (const char* bad : {"on", "true", "2", " 1"}) {
    try {
      attention::parse_fp8_kv_cache(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_EQ(e.argument(), "FLASHSERVE_CUDA_FP8_KV");
    }
  }
  // The model layer reads the same variable for the runner, the engine and the CLI: the two
  // defaults move together.
  EXPECT_EQ(model::kCudaFp8KvCacheByDefault, attention::kFp8KvCacheByDefault);
}

// FLASHSERVE_KV_FP8_REGISTER (the decode tiles converting the codes at operand load): strict,
// on by default (session 23's device run: 0.58-0.61x bf16's decode time), and carried into the
// decode launches only (the masked prefill tiles keep the widening), their summary, their replay
// key and their splits (choose_splits' fp8_codes); nothing else of the plan moves with it.
TEST(PlanKvFp8, RegisterSwitchIsStrictOnByDefaultAndCarriedToDecodesOnly) {
  EXPECT_TRUE(attention::kKvFp8RegisterByDefault);
  EXPECT_EQ(attention::parse_kv_fp8_register(nullptr), attention::kKvFp8RegisterByDefault);
  EXPECT_EQ(attention::parse_kv_fp8_register(""), attention::kKvFp8RegisterByDefault);
  EXPECT_TRUE(attention::parse_kv_fp8_register("1"));
  EXPECT_FALSE(attention::parse_kv_fp8_register("0"));
  for (const char* bad : {"on", "true", "2", " 1", "1 ", "01"}) {
    try {
      attention::parse_kv_fp8_register(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_EQ(e.argument(), "FLASHSERVE_KV_FP8_REGISTER");
    }
  }
  EXPECT_EQ(PlanContext{}.kv_fp8_register, attention::kKvFp8RegisterByDefault);
  for (int64_t d : {64, 128, 256}) {
    // Decodes of several lengths and a chunk: a decode launch and a prefill launch.
    Step s = step({{1, 500}, {1, 4096}, {64, 64 + 100}, {1, 37}}, d);
    s.ctx.kv_fp8_register = false;
    const Plan off = make_plan(s.pr, s.ctx, s.lens);
    s.ctx.kv_fp8_register = true;
    const Plan on = make_plan(s.pr, s.ctx, s.lens);
    ASSERT_EQ(on.launches.size(), off.launches.size());
    ASSERT_EQ(on.launches.size(), 2u) << on.summary();
    bool saw_decode = false;
    for (size_t i = 0; i < on.launches.size(); ++i) {
      const auto &a = on.launches[i].kernel, &b = off.launches[i].kernel;
      saw_decode = saw_decode || a.decode;
      EXPECT_EQ(a.kv_fp8_register, a.decode) << on.summary();
      EXPECT_FALSE(b.kv_fp8_register) << off.summary();
      EXPECT_TRUE(a.kv_fp8);
      EXPECT_EQ(a.decode, b.decode);
      EXPECT_EQ(a.masked, b.masked);
      // Decodes split by the register tiles' own slots (SplitPolicy.Fp8CodeTiles*).
      if (a.decode)
        EXPECT_EQ(a.splits, attention::choose_kernel(s.pr, s.ctx.device, true, 3, 1,
                                                     on.launches[i].max_kv_len, true, true)
                                .splits);
      else
        EXPECT_EQ(a.splits, b.splits);
      EXPECT_EQ(a.block_m, b.block_m);
      EXPECT_EQ(a.block_n, b.block_n);
    }
    EXPECT_TRUE(saw_decode);
    EXPECT_NE(on.summary().find("kv-e4m3 register"), std::string::npos) << on.summary();
    EXPECT_EQ(off.summary().find("register"), std::string::npos) << off.summary();
    // A CUDA graph captured with one conversion is never replayed for the other.
    EXPECT_NE(attention::replay_key(on), attention::replay_key(off));
    EXPECT_NE(attention::replay_key(on).find("kv-e4m3 register"), std::string::npos);
  }
  // A bf16 cache never takes it, whatever the switch says.
  Step b = step({{1, 500}, {64, 64 + 100}});
  b.pr.kv_dtype = DType::kBFloat16;
  b.ctx.family = FamilyRequest::kSm80;
  b.ctx.kv_fp8_register = true;
  for (const auto& l : make_plan(b.pr, b.ctx, b.lens).launches)
    EXPECT_FALSE(l.kernel.kv_fp8_register);
}

TEST(PlanKvFp8, OffIsRefusedNamingKAndSayingHow) {
  Step s = step({{1, 500}, {64, 64 + 100}});
  s.ctx.fp8_kv_cache = false;
  const std::string why = refusal(s);
  EXPECT_EQ(why.rfind("k: ", 0), 0u) << why;
  EXPECT_NE(why.find("FLASHSERVE_CUDA_FP8_KV=1"), std::string::npos) << why;
}

// Decodes and chunks in one step: two sm80 launches, both on the fp8 KV kernels; the chunk's
// launch masked; the splits those of the same bf16 step (the split policy does not look at
// the element type), but for the register tiles' decode launch, which splits by its own slots
// (FLASHSERVE_KV_FP8_REGISTER, on by default); never sm90, even where the bf16 step takes it
// for its chunk.
TEST(PlanKvFp8, MixedStepRunsOnSm80FpKvKernelsWithBf16Splits) {
  std::mt19937 rng(23);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::pair<int64_t, int64_t>> seqs;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      const int64_t q = rng() % 3 == 0 ? 1 + rng() % 600 : 1;
      seqs.push_back({q, q + static_cast<int64_t>(rng() % 9000)});
    }
    int64_t decodes = 0, decode_kv = 0;
    for (const auto& [q, kv] : seqs)
      if (q == 1) ++decodes, decode_kv = std::max(decode_kv, kv);
    for (int64_t d : {64, 128, 256})
      for (bool reg : {false, true}) {
        Step s = step(seqs, d);
        s.ctx.kv_fp8_register = reg;
        const Plan p = make_plan(s.pr, s.ctx, s.lens);
        Step b = s;  // the same step over a bf16 cache, on sm80 only
        b.pr.kv_dtype = DType::kBFloat16;
        b.ctx.family = FamilyRequest::kSm80;
        const Plan q = make_plan(b.pr, b.ctx, b.lens);
        ASSERT_EQ(p.launches.size(), q.launches.size());
        for (size_t i = 0; i < p.launches.size(); ++i) {
          const auto &l = p.launches[i], &m = q.launches[i];
          EXPECT_EQ(l.kernel.family, attention::KernelFamily::kSm80);
          EXPECT_TRUE(l.kernel.kv_fp8);
          EXPECT_FALSE(m.kernel.kv_fp8);
          EXPECT_TRUE(l.kernel.paged);
          EXPECT_EQ(l.kernel.masked, !l.kernel.decode);
          EXPECT_EQ(l.kernel.decode, m.kernel.decode);
          if (reg && l.kernel.decode)
            EXPECT_EQ(l.kernel.splits, attention::choose_kernel(s.pr, s.ctx.device, true, decodes,
                                                                1, decode_kv, true, true)
                                           .splits)
                << "round " << round << " d" << d;
          else
            EXPECT_EQ(l.kernel.splits, m.kernel.splits) << "round " << round << " d" << d;
          EXPECT_EQ(l.kernel.block_m, m.kernel.block_m);
          EXPECT_EQ(l.kernel.block_n, m.kernel.block_n);
          EXPECT_EQ(l.seq_begin, m.seq_begin);
          EXPECT_EQ(l.seq_end, m.seq_end);
        }
        if (!reg) EXPECT_EQ(p.workspace_bytes, q.workspace_bytes);
        EXPECT_NE(attention::replay_key(p).find("kv-e4m3"), std::string::npos);
        EXPECT_EQ(attention::replay_key(p).find("sm90"), std::string::npos);
        EXPECT_NE(p.summary().find("kv-e4m3"), std::string::npos);
      }
  }
  // The case the bf16 plan sends to sm90 (a 512-query chunk over 4k keys): sm80 here.
  const Step s = step({{512, 4096}});
  EXPECT_EQ(make_plan(s.pr, s.ctx, s.lens).launches.at(0).kernel.family,
            attention::KernelFamily::kSm80);
  Step b = s;
  b.pr.kv_dtype = DType::kBFloat16;
  EXPECT_EQ(make_plan(b.pr, b.ctx, b.lens).launches.at(0).kernel.family,
            attention::KernelFamily::kSm90)
      << "the bf16 step no longer takes sm90 here: the test above shows nothing";
  EXPECT_NE(attention::sm90_lacks(s.pr, s.ctx).find("float8_e4m3fn K/V"), std::string::npos);
}

// Without causal masking the prefill launch still runs the masked tiles (the only prefill fp8 KV
// kernels): an unbounded window masks only the keys past kv_len. Unknown host lengths
// (attention_forward) plan alike. A plan for replay keeps the kernels.
TEST(PlanKvFp8, UnmaskedCallsAndUnknownLengthsRunMaskedTiles) {
  Step s = step({{1, 300}, {40, 40 + 200}, {1, 9}});
  s.pr.mask.right = -1;
  for (bool known : {true, false}) {
    const HostLengths lens = known ? s.lens : HostLengths{};
    const Plan p = make_plan(s.pr, s.ctx, lens);
    ASSERT_EQ(p.launches.size(), 2u);
    for (const auto& l : p.launches) {
      EXPECT_TRUE(l.kernel.kv_fp8);
      EXPECT_EQ(l.kernel.masked, !l.kernel.decode);
    }
  }
  Step w = s;
  w.lens.widen = true;
  for (const auto& l : make_plan(w.pr, w.ctx, w.lens).launches) EXPECT_TRUE(l.kernel.kv_fp8);
}

TEST(PlanKvFp8, WhatItLacksIsRefusedByName) {
  const Step ok = step({{1, 300}, {40, 40 + 200}});
  EXPECT_EQ(refusal(ok), "accepted");
  Step f16 = ok;
  f16.pr.dtype = f16.pr.out_dtype = DType::kFloat16;
  EXPECT_EQ(refusal(f16).rfind("q: ", 0), 0u) << refusal(f16);
  Step dense = ok;
  dense.pr.paged = false;
  dense.pr.varlen_k = true;
  EXPECT_EQ(refusal(dense).rfind("block_table: ", 0), 0u) << refusal(dense);
  Step d96 = step({{1, 300}}, 96);
  EXPECT_EQ(refusal(d96).rfind("q: ", 0), 0u) << refusal(d96);
  Step dv = ok;
  dv.pr.head_dim_v = 64;
  EXPECT_EQ(refusal(dv).rfind("v: ", 0), 0u) << refusal(dv);
  Step cap = ok;
  cap.pr.score_mod.softcap = 30.0f;
  EXPECT_EQ(refusal(cap).rfind("softcap: ", 0), 0u) << refusal(cap);
  Step sm90 = ok;
  sm90.ctx.family = FamilyRequest::kSm90;
  EXPECT_EQ(refusal(sm90).rfind("FLASHSERVE_KERNEL: ", 0), 0u) << refusal(sm90);
  Step sm80 = ok;
  sm80.ctx.family = FamilyRequest::kSm80;
  EXPECT_EQ(refusal(sm80), "accepted");
  // The switch is checked first: off, even a call the kernels lack is refused naming it.
  Step off = f16;
  off.ctx.fp8_kv_cache = false;
  EXPECT_NE(refusal(off).find("FLASHSERVE_CUDA_FP8_KV=1"), std::string::npos);
}

}  // namespace
}  // namespace flashserve::testing
