// The fp8 (e4m3) KV cache on CUDA (issue 23): a bfloat16 q over paged float8_e4m3fn K/V with
// descales per (sequence, KV head), on sm80's fwd_kernel_kv_fp8 (decode and masked prefill
// tiles, split-KV), as a serving step runs it (plan_attention with the host lengths, and
// attention_forward).
//
// Oracle: the float64 reference on the DEQUANTISED K/V (code x descale; AttentionCase draws
// N(0, 1) / descale and rounds it to e4m3), within the tolerance of bf16's kernels
// (attention_close: twice a naive bf16 kernel's error on the same dequantised inputs, plus
// bf16's floor). After the widening (exact) the kernel's arithmetic is the bf16 kernel's, with
// the k descale folded into the softmax scale and the v descale into O, so that tolerance is
// the one it must meet. Outputs start poisoned (NaN), as do unused pages and the tails of last
// pages (e4m3's NaN code: a loader that reads past kv_len shows).
//
// Beside the reference: without descales the codes widened to bf16 are the same values, so the
// bf16 kernels on the widened pool must give the same output bits (same plan, tiles and splits),
// and the LSE within a few float32 ulps: a test of the loader and of the scale plumbing that no
// bf16 tolerance can blur.
//
// The kernels are behind FLASHSERVE_CUDA_FP8_KV (off by default: docs/fp8.md): each test turns it
// on for its scope. The KvFp8.* tests run the decode launches on whichever conversion
// FLASHSERVE_KV_FP8_REGISTER picks outside them (scripts/fp8-kv-gpu-check.sh runs them both
// ways); KvFp8Widened.* pins the widening in shared memory, KvFp8Register.* the conversion at
// operand load (sm80/kv_fp8_reg.h) and compares it with the widening.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attention/backends.h"
#include "common/half.h"
#include "support/attention_case.h"
#include "support/compare.h"
#include "support/device_copy.h"
#include "support/scoped_env.h"
#include "support/serving_step.h"

namespace flashserve::testing {
namespace {

// A serving step over an e4m3 paged cache beside a bfloat16 q, with descales by default.
CaseSpec fp8kv(int64_t d, int64_t page, int64_t h_q, int64_t h_kv, std::vector<int64_t> q_lens,
               std::vector<int64_t> kv_lens, bool descales = true) {
  CaseSpec s = serving_step(d, page, h_q, h_kv, std::move(q_lens), std::move(kv_lens));
  s.fp8 = Fp8::kKV;
  s.descales = descales;
  return s;
}

// Runs the case's plan (host lengths) on its device copies; returns the plan's summary.
std::string run_planned(AttentionCase& c) {
  const CaseSpec& spec = c.spec();
  const HostLens lens(spec);
  DeviceCopy dev(c);
  const AttentionPlan plan = plan_attention(dev.params(), lens.view(spec));
  run_attention(plan, dev.params(plan.workspace_bytes()));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download();
  return plan.summary();
}

std::vector<CaseSpec> cases() {
  std::vector<CaseSpec> v;
  for (int64_t page : {16, 64, 256})
    for (auto [h_q, h_kv] : {std::pair<int64_t, int64_t>{8, 8}, {16, 4}, {16, 2}}) {
      // A chunk over cached keys that are not a page multiple, then decodes; then both kinds
      // interleaved with an empty sequence and a long decode that splits.
      v.push_back(fp8kv(128, page, h_q, h_kv, {77, 1, 1, 1}, {122, 700, 33, 1}));
      v.push_back(
          fp8kv(128, page, h_q, h_kv, {1, 130, 1, 0, 17, 1}, {2049, 130 + 333, 1, 9, 17, 300}));
    }
  // d64 and d256 at every page size: the e4m3 loader's 16-byte copies split a row into 4 (d64)
  // or 16 (d256) code chunks, staged in place and widened after the wait (smem_tile.h). Keys end
  // inside a key block and a page: a chunk over 70 cached keys, decodes of 1003 keys, 2 keys and
  // one key past d64's 128-key decode block.
  for (int64_t d : {64, 256})
    for (int64_t page : {16, 64, 256})
      v.push_back(fp8kv(d, page, 16, 4, {1, 45, 1, 1}, {1003, 45 + 70, 2, 129}));
  // d64 and d256, no descales, no lse, explicit splits in both launches, GQA 8.
  v.push_back(fp8kv(64, 16, 16, 4, {1, 200, 1}, {3000, 200 + 19, 65}));
  v.push_back(fp8kv(256, 64, 8, 2, {33, 1, 1, 129}, {33 + 100, 1500, 2, 129 + 7}));
  v.push_back(fp8kv(128, 16, 32, 4, {1, 1, 1000}, {4097, 17, 1000 + 1000}, false));
  CaseSpec nolse = fp8kv(128, 64, 32, 8, {1, 1, 512}, {4097, 2048, 512 + 1000});
  nolse.with_lse = false;
  v.push_back(nolse);
  CaseSpec forced = fp8kv(128, 16, 16, 2, {1, 60, 1}, {900, 60 + 31, 1200});
  forced.num_splits = 3;
  v.push_back(forced);
  CaseSpec window = fp8kv(128, 16, 8, 2, {1, 90, 1}, {1000, 90 + 300, 5});
  window.window_left = 255;  // Mistral's sliding window, as the runner sets it
  v.push_back(window);
  return v;
}

// compute-sanitizer's subset (scripts/fp8-kv-gpu-check.sh runs *KvFp8Sanitize*).
std::vector<CaseSpec> sanitize_cases() {
  std::vector<CaseSpec> v;
  v.push_back(fp8kv(128, 16, 16, 4, {1, 70, 1, 0, 17}, {1500, 70 + 21, 40, 3, 17}));
  CaseSpec forced = fp8kv(64, 64, 8, 2, {33, 1, 1}, {33 + 50, 700, 2000});
  forced.num_splits = 3;
  v.push_back(forced);
  // d256: sixteen code chunks a row, the decode tile's 32-key blocks.
  v.push_back(fp8kv(256, 256, 8, 2, {1, 40, 1}, {300, 40 + 30, 65}));
  return v;
}

class KvFp8 : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(KvFp8, PlannedMatchesFloat64OnTheDequantisedCache) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv on("FLASHSERVE_CUDA_FP8_KV", "1");
  CaseSpec s = GetParam();
  s.seed = seed_for(s.name(), 61);
  AttentionCase c(s);
  const std::string summary = run_planned(c);
  EXPECT_NE(summary.find("kv-e4m3"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("sm90"), std::string::npos) << summary;
  EXPECT_TRUE(attention_close(read_output(c.params()), c.exact(), c.lowp(), s.dtype))
      << s.name() << ": " << summary;
}

TEST_P(KvFp8, ForwardMatchesFloat64OnTheDequantisedCache) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv on("FLASHSERVE_CUDA_FP8_KV", "1");
  CaseSpec s = GetParam();
  s.seed = seed_for(s.name(), 67);
  AttentionCase c(s);
  DeviceCopy dev(c);
  attention_forward(dev.params());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dev.download();
  EXPECT_TRUE(attention_close(read_output(c.params()), c.exact(), c.lowp(), s.dtype)) << s.name();
}

// Same inputs twice, same bits (a moving error between runs is a race).
TEST_P(KvFp8, Deterministic) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv on("FLASHSERVE_CUDA_FP8_KV", "1");
  CaseSpec s = GetParam();
  s.seed = seed_for(s.name(), 71);
  AttentionCase c(s);
  run_planned(c);
  const NaiveOutput first = read_output(c.params());
  c.poison_outputs();
  run_planned(c);
  const NaiveOutput second = read_output(c.params());
  ASSERT_EQ(first.out.size(), second.out.size());
  for (size_t i = 0; i < first.out.size(); ++i)
    ASSERT_EQ(std::memcmp(&first.out[i], &second.out[i], sizeof(double)), 0) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(Mixed, KvFp8, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(KvFp8Sanitize, KvFp8, ::testing::ValuesIn(sanitize_cases()),
                         [](const auto& info) { return info.param.name(); });

// Without descales the e4m3 codes widened to bf16 are the same values: the bf16 kernels (same
// plan: decode and masked prefill tiles, the same splits) on a bf16 pool holding them must give
// the fp8 kernels' output bit for bit (the LSE within 4 float32 ulps: below). Causal, so that the
// bf16 prefill launches run masked tiles too.
// The widening path only (FLASHSERVE_KV_FP8_REGISTER=0): the conversion at operand load runs its
// GEMMs in f16 and permutes the head dim's summation order, so its bits differ (KvFp8Register).
TEST(KvFp8Widened, BitIdenticalToTheBf16KernelsOnTheWidenedCodes) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv on("FLASHSERVE_CUDA_FP8_KV", "1");
  ScopedEnv widen("FLASHSERVE_KV_FP8_REGISTER", "0");
  for (int64_t d : {64, 128, 256})
    for (int64_t page : {16, 256}) {
      CaseSpec s = fp8kv(d, page, 16, 4, {1, 90, 1, 1}, {2500, 90 + 40, 300, 1}, false);
      s.seed = seed_for(s.name(), 73);
      AttentionCase fp8(s);
      CaseSpec b = s;
      b.fp8 = Fp8::kNone;
      AttentionCase bf16(b);
      auto fb = fp8.buffers(), bb = bf16.buffers();
      ASSERT_EQ(fb[AttentionCase::kQ].bytes, bb[AttentionCase::kQ].bytes);
      std::memcpy(bb[AttentionCase::kQ].host, fb[AttentionCase::kQ].host,
                  fb[AttentionCase::kQ].bytes);
      for (int t : {AttentionCase::kK, AttentionCase::kV}) {
        ASSERT_EQ(fb[t].bytes * 2, bb[t].bytes);
        for (size_t i = 0; i < fb[t].bytes; ++i)
          store_float(bb[t].host, static_cast<int64_t>(i), DType::kBFloat16,
                      load_float(fb[t].host, static_cast<int64_t>(i), DType::kFloat8E4M3));
      }
      const std::string fp8_plan = run_planned(fp8);
      const std::string bf16_plan = run_planned(bf16);
      const NaiveOutput x = read_output(fp8.params()), y = read_output(bf16.params());
      ASSERT_EQ(x.out.size(), y.out.size());
      size_t differ = 0, first = 0;
      for (size_t i = 0; i < x.out.size(); ++i)
        if (std::memcmp(&x.out[i], &y.out[i], sizeof(double)) != 0 && differ++ == 0) first = i;
      EXPECT_EQ(differ, 0u) << s.name() << ": first at " << first << " (" << x.out[first] << " vs "
                            << y.out[first] << ")\nfp8 plan: " << fp8_plan
                            << "\nbf16 plan: " << bf16_plan;
      // The LSE: within 4 float32 ulps, not bit for bit. The two kernels are compiled apart,
      // and the fp8 one's softmax scale is a register (scale x k descale) where the bf16 one
      // reads the parameter, so the row max's multiply-add into the LSE may round once more or
      // less: the first device run (H200) found entries that differ in the last bits while
      // every output element was identical.
      ASSERT_EQ(x.lse.size(), y.lse.size());
      double worst = 0;
      for (size_t i = 0; i < x.lse.size(); ++i) {
        if (std::isinf(y.lse[i])) {
          EXPECT_EQ(x.lse[i], y.lse[i]) << s.name() << " lse " << i;
          continue;
        }
        const double ulps = std::abs(x.lse[i] - y.lse[i]) /
                            (std::ldexp(1.0, -23) * std::max(1.0, std::abs(y.lse[i])));
        worst = std::max(worst, ulps);
      }
      EXPECT_LE(worst, 4.0) << s.name() << ": LSE differs by up to " << worst << " ulps";
      std::printf("%s: out bit for bit, LSE within %.1f float32 ulps\n", s.name().c_str(), worst);
    }
}

// The decode tiles converting the codes at operand load (FLASHSERVE_KV_FP8_REGISTER=1;
// sm80/kv_fp8_reg.h, docs/kernel-notes.md "Issue 23: fp8 KV decode, converted at operand load")
// against float64 on the dequantised cache (the same tolerance as every KvFp8 case) and against
// the widening path on the same inputs (FLASHSERVE_KV_FP8_REGISTER=0), within the rounding of P:
// the two compute the same scores up to the order of the head dim's fp32 sums, and O from P
// rounded to f16 (unit roundoff 2^-11; absolutely 2^-25 below 2^-14) against bf16 (2^-8), so
// per element |x - y| <= (2^-8 + 2^-11 + n 2^-25) max|v| plus the two outputs' bf16 roundings
// (2^-8 |y| each); for n <= 4096 keys within 2^-7 (max|v| + |y|), max|v| bounded by the largest
// finite code (the descales are below 1). The LSE (the same fp32 row sums; the scores differ in
// the order of their sums only) within 1e-3 max(1, |lse|). Prefill rows run the same kernel
// both ways (the masked tiles keep the widening): identical bits there.
class KvFp8Register : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(KvFp8Register, MatchesFloat64AndTheWideningWithinTheRoundingOfP) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv on("FLASHSERVE_CUDA_FP8_KV", "1");
  CaseSpec s = GetParam();
  s.seed = seed_for(s.name(), 79);
  AttentionCase c(s);
  std::string reg_plan, wide_plan;
  {
    ScopedEnv reg("FLASHSERVE_KV_FP8_REGISTER", "1");
    reg_plan = run_planned(c);
  }
  const NaiveOutput x = read_output(c.params());
  bool decodes = false;
  for (int64_t q : s.q_lens) decodes = decodes || q == 1;
  EXPECT_EQ(reg_plan.find("kv-e4m3 register") != std::string::npos, decodes) << reg_plan;
  EXPECT_TRUE(attention_close(x, c.exact(), c.lowp(), s.dtype)) << s.name() << ": " << reg_plan;
  c.poison_outputs();
  {
    ScopedEnv widen("FLASHSERVE_KV_FP8_REGISTER", "0");
    wide_plan = run_planned(c);
  }
  EXPECT_EQ(wide_plan.find("register"), std::string::npos) << wide_plan;
  const NaiveOutput y = read_output(c.params());
  auto bufs = c.buffers();
  double vmax = 0;
  for (size_t i = 0; i < bufs[AttentionCase::kV].bytes; ++i) {
    const double v =
        load_float(bufs[AttentionCase::kV].host, static_cast<int64_t>(i), DType::kFloat8E4M3);
    if (std::isfinite(v)) vmax = std::max(vmax, std::abs(v));
  }
  ASSERT_EQ(x.out.size(), y.out.size());
  double worst = 0;  // in units of the bound
  for (size_t i = 0; i < x.out.size(); ++i) {
    const double bound = std::ldexp(vmax + std::abs(y.out[i]), -7);
    ASSERT_TRUE(std::isfinite(x.out[i]) && std::isfinite(y.out[i])) << s.name() << " element " << i;
    worst = std::max(worst, std::abs(x.out[i] - y.out[i]) / bound);
  }
  EXPECT_LE(worst, 1.0) << s.name() << "\nregister: " << reg_plan << "\nwidening: " << wide_plan;
  ASSERT_EQ(x.lse.size(), y.lse.size());
  double worst_lse = 0;
  for (size_t i = 0; i < x.lse.size(); ++i) {
    if (std::isinf(y.lse[i])) {
      EXPECT_EQ(x.lse[i], y.lse[i]) << s.name() << " lse " << i;
      continue;
    }
    worst_lse =
        std::max(worst_lse, std::abs(x.lse[i] - y.lse[i]) / std::max(1.0, std::abs(y.lse[i])));
  }
  EXPECT_LE(worst_lse, 1e-3) << s.name();
  std::printf("%s: register vs widening: out within %.3f of the bound, LSE within %.2e\n",
              s.name().c_str(), worst, worst_lse);
}

INSTANTIATE_TEST_SUITE_P(Mixed, KvFp8Register, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(KvFp8Sanitize, KvFp8Register, ::testing::ValuesIn(sanitize_cases()),
                         [](const auto& info) { return info.param.name(); });

// Q's range: the register path scales Q by the power of two that puts the tile's largest |q| in
// [2^14, 2^15) before converting it to f16 (kv_fp8_reg.h prepare_q) and divides the softmax
// scale by it. So q x 2^k with softmax_scale x 2^-k (k = -60, 40, 100: far outside f16's range
// either way) must give the unscaled call's bits, out and LSE; and match float64.
TEST(KvFp8Register, PowerOfTwoScaledQGivesTheSameBits) {
  SKIP_WITHOUT_CUDA();
  ScopedEnv on("FLASHSERVE_CUDA_FP8_KV", "1");
  ScopedEnv reg("FLASHSERVE_KV_FP8_REGISTER", "1");
  for (int64_t d : {64, 128, 256}) {
    CaseSpec s = fp8kv(d, 16, 16, 4, {1, 1, 1, 1}, {2500, 300, 77, 1});
    s.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
    s.seed = seed_for(s.name(), 83);
    AttentionCase base(s);
    const std::string plan = run_planned(base);
    EXPECT_NE(plan.find("kv-e4m3 register"), std::string::npos) << plan;
    const NaiveOutput x = read_output(base.params());
    for (int k : {-60, 40, 100}) {
      CaseSpec t = s;
      t.softmax_scale = std::ldexp(s.softmax_scale, -k);
      AttentionCase c(t);
      auto qb = c.buffers()[AttentionCase::kQ];
      for (int64_t i = 0; i < static_cast<int64_t>(qb.bytes / 2); ++i) {
        const double q = load_float(qb.host, i, DType::kBFloat16);
        store_float(qb.host, i, DType::kBFloat16, std::ldexp(q, k));
        ASSERT_EQ(load_float(qb.host, i, DType::kBFloat16), std::ldexp(q, k)) << "inexact scaling";
      }
      run_planned(c);
      const NaiveOutput y = read_output(c.params());
      ASSERT_EQ(x.out.size(), y.out.size());
      for (size_t i = 0; i < x.out.size(); ++i)
        ASSERT_EQ(std::memcmp(&x.out[i], &y.out[i], sizeof(double)), 0)
            << "d" << d << " k " << k << " element " << i << ": " << x.out[i] << " vs " << y.out[i];
      ASSERT_EQ(x.lse.size(), y.lse.size());
      for (size_t i = 0; i < x.lse.size(); ++i)
        ASSERT_EQ(std::memcmp(&x.lse[i], &y.lse[i], sizeof(double)), 0)
            << "d" << d << " k " << k << " lse " << i;
      EXPECT_TRUE(attention_close(y, c.exact(), c.lowp(), t.dtype)) << t.name() << " k " << k;
    }
  }
}

// What the fp8 KV path refuses on a device, by name: the switch off (k), a float16 q (q), dense
// K/V (block_table), FLASHSERVE_KERNEL=sm90 (no sm90 fp8 KV kernel).
TEST(KvFp8Refusals, ByName) {
  SKIP_WITHOUT_CUDA();
  auto refusal = [](CaseSpec s, const char* fp8_kv, const char* family) {
    ScopedEnv on("FLASHSERVE_CUDA_FP8_KV", fp8_kv);
    ScopedEnv k("FLASHSERVE_KERNEL", family);
    AttentionCase c(s);
    DeviceCopy dev(c);
    try {
      plan_attention(dev.params(), HostLens(s).view(s));
      return std::string("accepted");
    } catch (const Error& e) {
      return e.argument() + ": " + e.what();
    }
  };
  const CaseSpec ok = fp8kv(128, 16, 8, 2, {1, 40}, {300, 40 + 20});
  EXPECT_EQ(refusal(ok, "1", nullptr), "accepted");
  EXPECT_EQ(refusal(ok, "1", "sm80"), "accepted");
  EXPECT_EQ(refusal(ok, nullptr, nullptr).rfind("k: ", 0), 0u) << "on by default before its run?";
  EXPECT_NE(refusal(ok, "0", nullptr).find("FLASHSERVE_CUDA_FP8_KV=1"), std::string::npos);
  EXPECT_EQ(refusal(ok, "1", "sm90").rfind("FLASHSERVE_KERNEL: ", 0), 0u);
  CaseSpec f16 = ok;
  f16.dtype = DType::kFloat16;
  EXPECT_EQ(refusal(f16, "1", nullptr).rfind("q: ", 0), 0u) << refusal(f16, "1", nullptr);
  CaseSpec dense = ok;
  dense.kv_layout = KVLayout::kVarlen;
  EXPECT_EQ(refusal(dense, "1", nullptr).rfind("block_table: ", 0), 0u)
      << refusal(dense, "1", nullptr);
}

}  // namespace
}  // namespace flashserve::testing
