// The CPU runner's bf16 and fp8 (e4m3) KV caches (model/kv_cache_dtype.h) on the tiny model,
// against the float64 reference of reference_model.h with the same rounding applied where the
// cache stores K and V (an independent model of what each cache computes), over a prefill of two
// sequences in a shuffled paged pool and decode steps:
//
//  - each cache's logits are within float32's own tolerance (kRelTol of the logits' RMS, as
//    forward_test) plus twice that cache's whole effect |D| (D = the reference with the cache's
//    rounding minus the reference without), which covers the elements whose float32 and float64
//    values fall on either side of a rounding midpoint and so round to neighbouring codes
//    (tolerance() below: a measured allowance, 5x the worst of 100 seeds, not a derived one); a
//    wrong scale, head or slot would move them by many |D|.
//  - fp8 against bf16: by the triangle inequality through the two references, the runner's
//    difference is at most |D8 - D16| + tol8 + tol16, the stated bound; where bf16's top-2 logit
//    gap exceeds twice that bound, the two caches' greedy tokens must agree.
//  - greedy generation with each cache, whose agreement is reported (not asserted: a near-tie
//    may legitimately go either way, and then the continuations differ).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>

#include "common/float8.h"
#include "common/half.h"
#include "flashserve/error.h"
#include "model/forward_batch.h"
#include "model/kv_cache_dtype.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model/runner.h"
#include "reference_model.h"
#include "test_dirs.h"

namespace flashserve::model {
namespace {

using testing::fresh_dir;
using testing::ref_forward;
using testing::ref_load;
using testing::RefKvStore;
using testing::RefModel;

constexpr double kRelTol = 3e-5;  // float32 against float64 (forward_test.cc's derivation)

// A rounding cache's logits against the reference that rounds where it stores: float32's own
// tolerance plus twice the cache's whole effect |D| (D = the reference with the cache's rounding
// minus the reference without). The runner rounds float32 values, the reference float64 ones: an
// element whose two values straddle a rounding midpoint lands on neighbouring codes, and those
// flips move the logits by a share of |D| that no closed form bounds: over 100 seeds up to
// 0.36 |D| for bf16 (its finer grid has more midpoints for float32's noise to straddle) and
// 0.09 |D| for e4m3; 2 |D| leaves a margin of 5x. A wrong scale, head, slot or a missing
// dequantisation moves the logits by a large share of their RMS, many |D|.
double tolerance(double logit_rms, double cache_effect) {
  return kRelTol * logit_rms + 2 * cache_effect;
}

double max_abs_diff(const float* a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}
double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}
double rms(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s / static_cast<double>(x.size()));
}
int64_t argmax(const float* x, int64_t n) {
  return std::max_element(x, x + n) - x;
}
// The gap between the two largest values of a row.
double top2_gap(const float* x, int64_t n) {
  std::vector<float> v(x, x + n);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return static_cast<double>(v[0]) - v[1];
}

// Two sequences (prompts of 24 and 9 tokens) prefilled in one step, then `decodes` steps of one
// (random, teacher-forced) token each, in a pool of blocks of 16 dealt in a shuffled order.
struct Schedule {
  std::vector<std::vector<int32_t>> tokens;  // each sequence's whole token list
  std::vector<std::vector<int32_t>> blocks;
  int64_t num_blocks = 0, decodes = 0;
};

Schedule make_schedule(std::mt19937_64& rng, int64_t vocab, int64_t decodes) {
  Schedule s;
  s.decodes = decodes;
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  const int64_t lens[] = {24, 9};
  const int64_t per_seq = (24 + decodes + 15) / 16;
  s.num_blocks = 2 * per_seq;
  std::vector<int32_t> ids(static_cast<size_t>(s.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  for (int i = 0; i < 2; ++i) {
    std::vector<int32_t> t;
    for (int64_t j = 0; j < lens[i] + decodes; ++j) t.push_back(tok(rng));
    s.tokens.push_back(t);
    s.blocks.emplace_back(ids.begin() + i * per_seq, ids.begin() + (i + 1) * per_seq);
  }
  return s;
}

// The runner's logits at every scheduled step: [step][sequence] rows of vocab floats.
std::vector<std::vector<std::vector<float>>> run_schedule(ModelRunner& runner, const Schedule& s,
                                                          const KvCacheConfig& kv) {
  runner.set_kv_cache(kv);
  runner.allocate_kv(s.num_blocks, 16);
  const int64_t V = runner.config().vocab_size;
  std::vector<std::vector<std::vector<float>>> out;
  for (int64_t step = 0; step <= s.decodes; ++step) {
    ForwardBatchBuilder bb(16);
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const int64_t prompt = static_cast<int64_t>(s.tokens[i].size()) - s.decodes;
      const int64_t start = step == 0 ? 0 : prompt + step - 1;
      const int64_t len = step == 0 ? prompt : 1;
      bb.add(s.tokens[i].data() + start, start, len, s.blocks[i], true);
    }
    runner.forward(std::move(bb).build());
    const std::vector<float> l = runner.logits();
    std::vector<std::vector<float>> rows;
    for (size_t i = 0; i < s.tokens.size(); ++i)
      rows.emplace_back(l.begin() + static_cast<int64_t>(i) * V,
                        l.begin() + static_cast<int64_t>(i + 1) * V);
    out.push_back(std::move(rows));
  }
  return out;
}

// The reference's logits at the same positions as run_schedule's rows.
std::vector<std::vector<std::vector<double>>> ref_schedule(const RefModel& ref, const Schedule& s,
                                                           const RefKvStore& store) {
  std::vector<std::vector<std::vector<double>>> out(static_cast<size_t>(s.decodes + 1));
  for (const auto& tokens : s.tokens) {
    const auto tr = ref_forward(ref, tokens, store);
    const int64_t prompt = static_cast<int64_t>(tokens.size()) - s.decodes;
    for (int64_t step = 0; step <= s.decodes; ++step)
      out[step].push_back(tr.logits[prompt - 1 + step]);
  }
  return out;
}

// A per-(layer, KV head) scale of K or V: 2^u, u uniform in [-1, 1].
std::vector<float> random_scales(std::mt19937_64& rng, const ModelConfig& c) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<float> s(static_cast<size_t>(c.num_hidden_layers * c.num_key_value_heads));
  for (float& x : s) x = static_cast<float>(std::exp2(u(rng)));
  return s;
}

// What the runner's e4m3 cache stores, in the reference: e4m3(x / scale) x scale, with the
// division in float32 as the runner does it.
RefKvStore e4m3_store(const KvCacheConfig& kv, int64_t kv_heads) {
  return [kv, kv_heads](int64_t l, int64_t h, bool is_v, double* x, int64_t d) {
    const std::vector<float>& scales = is_v ? kv.v_scales : kv.k_scales;
    const float scale = scales.empty() ? 1.0f : scales[l * kv_heads + h];
    for (int64_t i = 0; i < d; ++i)
      x[i] = static_cast<double>(round_to_e4m3(static_cast<float>(x[i]) / scale)) * scale;
  };
}
RefKvStore bf16_store() {
  return [](int64_t, int64_t, bool, double* x, int64_t d) {
    for (int64_t i = 0; i < d; ++i) x[i] = to_float(to_bf16(static_cast<float>(x[i])));
  };
}

// The float64 reference at every scheduled row: without rounding, and with each cache's.
struct References {
  std::vector<std::vector<std::vector<double>>> exact, fp8, bf16;

  References(const RefModel& ref, const Schedule& s, const KvCacheConfig& fp8_cache)
      : exact(ref_schedule(ref, s, nullptr)),
        fp8(ref_schedule(ref, s, e4m3_store(fp8_cache, ref.c.num_key_value_heads))),
        bf16(ref_schedule(ref, s, bf16_store())) {}
  // At row (step, sequence i): the logits' RMS, and each cache's effect |D| on them.
  double rms_at(int64_t step, size_t i) const { return rms(exact[step][i]); }
  double fp8_effect(int64_t step, size_t i) const {
    return max_abs_diff(fp8[step][i], exact[step][i]);
  }
  double bf16_effect(int64_t step, size_t i) const {
    return max_abs_diff(bf16[step][i], exact[step][i]);
  }
};

class KvCacheDtypes : public ::testing::Test {
 protected:
  void SetUp() override {
    FLASHSERVE_SKIP_WITHOUT_BLAS();
    seed_ = testing::test_seed();
    dir_ = fresh_dir("tiny");
    RandomCheckpointOptions o;
    o.seed = seed_;
    o.dtype = DType::kFloat32;
    write_random_checkpoint(preset_config("tiny"), dir_, o);
    rng_.seed(seed_);
  }
  // The float64 reference and the CPU runner of the checkpoint.
  void load() {
    ref_ = ref_load(dir_);
    runner_ = make_cpu_runner(dir_);
  }
  uint64_t seed_ = 0;
  std::string dir_;
  std::mt19937_64 rng_;
  RefModel ref_;
  std::unique_ptr<ModelRunner> runner_;
};

TEST_F(KvCacheDtypes, EachCacheMatchesTheReferenceThatRoundsWhereItStores) {
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed_));
  load();
  const ModelConfig& c = ref_.c;
  const Schedule s = make_schedule(rng_, c.vocab_size, 6);
  const KvCacheConfig fp8{KvCacheDtype::kFp8E4M3, random_scales(rng_, c), random_scales(rng_, c)};
  const KvCacheConfig bf16{KvCacheDtype::kBf16, {}, {}};
  const References refs(ref_, s, fp8);
  const auto run_f32 = run_schedule(*runner_, s, {});
  const auto run_fp8 = run_schedule(*runner_, s, fp8);
  const auto run_bf16 = run_schedule(*runner_, s, bf16);

  double worst_fp8 = 0, worst_bf16 = 0, effect_fp8 = 0, effect_bf16 = 0;
  for (int64_t step = 0; step <= s.decodes; ++step)
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      SCOPED_TRACE("step " + std::to_string(step) + ", sequence " + std::to_string(i));
      const double r = refs.rms_at(step, i);
      ASSERT_GT(r, 0.1);  // the logits are not degenerate
      EXPECT_LE(max_abs_diff(run_f32[step][i].data(), refs.exact[step][i]), kRelTol * r);
      const double d8 = refs.fp8_effect(step, i), d16 = refs.bf16_effect(step, i);
      // The roundings did happen: e4m3's effect is far above float32's noise.
      EXPECT_GT(d8, 10 * kRelTol * r);
      const double tol8 = tolerance(r, d8), tol16 = tolerance(r, d16);
      const double e8 = max_abs_diff(run_fp8[step][i].data(), refs.fp8[step][i]);
      const double e16 = max_abs_diff(run_bf16[step][i].data(), refs.bf16[step][i]);
      EXPECT_LE(e8, tol8) << "fp8 cache: |D8| " << d8 << ", logit RMS " << r;
      EXPECT_LE(e16, tol16) << "bf16 cache: |D16| " << d16 << ", logit RMS " << r;
      worst_fp8 = std::max(worst_fp8, e8 / tol8);
      worst_bf16 = std::max(worst_bf16, e16 / tol16);
      effect_fp8 = std::max(effect_fp8, d8 / r);
      effect_bf16 = std::max(effect_bf16, d16 / r);
    }
  std::cout << "fp8 cache: its effect on the logits up to " << effect_fp8
            << " of their RMS; runner error / tolerance up to " << worst_fp8 << "\n"
            << "bf16 cache: effect up to " << effect_bf16 << " of the RMS; error / tolerance up to "
            << worst_bf16 << "\n";
}

TEST_F(KvCacheDtypes, Fp8AgainstBf16WithinTheStatedBound) {
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed_));
  load();
  const ModelConfig& c = ref_.c;
  const Schedule s = make_schedule(rng_, c.vocab_size, 24);
  // Serving's scales: 1.0 for every head (vLLM's default without calibrated scales).
  const KvCacheConfig fp8{KvCacheDtype::kFp8E4M3, {}, {}};
  const References refs(ref_, s, fp8);
  const auto run_fp8 = run_schedule(*runner_, s, fp8);
  const auto run_bf16 = run_schedule(*runner_, s, {KvCacheDtype::kBf16, {}, {}});
  const int64_t V = c.vocab_size;
  double worst = 0, largest = 0;
  int64_t decided = 0, agree = 0, rows = 0;
  for (int64_t step = 0; step <= s.decodes; ++step)
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      SCOPED_TRACE("step " + std::to_string(step) + ", sequence " + std::to_string(i));
      const double r = refs.rms_at(step, i);
      const double bound = max_abs_diff(refs.fp8[step][i], refs.bf16[step][i]) +
                           tolerance(r, refs.fp8_effect(step, i)) +
                           tolerance(r, refs.bf16_effect(step, i));
      const float* a = run_fp8[step][i].data();
      const float* b = run_bf16[step][i].data();
      double diff = 0;
      for (int64_t v = 0; v < V; ++v) diff = std::max(diff, std::fabs(double{a[v]} - b[v]));
      EXPECT_LE(diff, bound) << "logit RMS " << r;
      worst = std::max(worst, diff / bound);
      largest = std::max(largest, diff / r);
      ++rows;
      agree += argmax(a, V) == argmax(b, V);
      if (top2_gap(b, V) > 2 * bound) {
        ++decided;
        EXPECT_EQ(argmax(a, V), argmax(b, V))
            << "bf16's top-2 gap " << top2_gap(b, V) << " exceeds twice the bound " << bound;
      }
    }
  std::cout << "fp8 against bf16 cache: max |logit difference| up to " << largest
            << " of the logits' RMS, " << worst << " of the stated bound; teacher-forced argmax "
            << "agrees at " << agree << " of " << rows << " positions (" << decided
            << " decided by the bound)\n";
  ::testing::Test::RecordProperty("fp8_vs_bf16_argmax_agreement",
                                  std::to_string(agree) + "/" + std::to_string(rows));
}

// Greedy generation with each cache, reported: how long the two agree and how many tokens match.
TEST_F(KvCacheDtypes, GreedyAgreementOverARunIsReported) {
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed_));
  std::mt19937_64 rng(seed_);
  auto runner = make_cpu_runner(dir_);
  const ModelConfig& c = runner->config();
  constexpr int64_t kNew = 64;
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(c.vocab_size - 1));
  auto generate = [&](const std::vector<int32_t>& prompt, KvCacheDtype dtype) {
    runner->set_kv_cache({dtype, {}, {}});
    const int64_t blocks = (static_cast<int64_t>(prompt.size()) + kNew + 15) / 16;
    runner->allocate_kv(blocks, 16);
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
    std::vector<int32_t> seq = prompt;
    for (int64_t n = 0; n < kNew; ++n) {
      ForwardBatchBuilder bb(16);
      const int64_t start = n == 0 ? 0 : static_cast<int64_t>(seq.size()) - 1;
      bb.add(seq.data() + start, start, static_cast<int64_t>(seq.size()) - start, table, true);
      runner->forward(std::move(bb).build());
      seq.push_back(static_cast<int32_t>(argmax(runner->logits().data(), c.vocab_size)));
    }
    return std::vector<int32_t>(seq.begin() + static_cast<int64_t>(prompt.size()), seq.end());
  };
  int64_t same = 0, total = 0;
  for (int p = 0; p < 4; ++p) {
    std::vector<int32_t> prompt(16 + 8 * p);
    for (int32_t& t : prompt) t = tok(rng);
    const auto a = generate(prompt, KvCacheDtype::kBf16),
               b = generate(prompt, KvCacheDtype::kFp8E4M3);
    const int64_t prefix = std::mismatch(a.begin(), a.end(), b.begin()).first - a.begin();
    int64_t eq = 0;
    for (int64_t i = 0; i < kNew; ++i) eq += a[i] == b[i];
    same += eq;
    total += kNew;
    std::cout << "prompt " << prompt.size() << " tokens: fp8 and bf16 caches agree on the first "
              << prefix << " of " << kNew << " greedy tokens (" << eq << " positions equal)\n";
  }
  ::testing::Test::RecordProperty("greedy_agreement",
                                  std::to_string(same) + "/" + std::to_string(total));
}

TEST(KvCacheDtype, NamesAsVllmSpellsThem) {
  EXPECT_EQ(parse_kv_cache_dtype("auto"), KvCacheDtype::kAuto);
  EXPECT_EQ(parse_kv_cache_dtype("bf16"), KvCacheDtype::kBf16);
  EXPECT_EQ(parse_kv_cache_dtype("bfloat16"), KvCacheDtype::kBf16);
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), KvCacheDtype::kFp8E4M3);
  EXPECT_EQ(parse_kv_cache_dtype("fp8_e4m3"), KvCacheDtype::kFp8E4M3);
  for (const char* bad : {"fp8_e5m2", "int8", "FP8", ""}) {
    try {
      parse_kv_cache_dtype(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "kv_cache_dtype");
      EXPECT_NE(std::string(e.what()).find("'" + std::string(bad) + "'"), std::string::npos);
    }
  }
  EXPECT_EQ(kv_cache_element_bytes(KvCacheDtype::kFp8E4M3, 4), 1);
  EXPECT_EQ(kv_cache_element_bytes(KvCacheDtype::kBf16, 4), 2);
  EXPECT_EQ(kv_cache_element_bytes(KvCacheDtype::kAuto, 4), 4);
}

TEST_F(KvCacheDtypes, ScalesAreChecked) {
  auto runner = make_cpu_runner(dir_);
  const size_t n = static_cast<size_t>(runner->config().num_hidden_layers *
                                       runner->config().num_key_value_heads);
  EXPECT_THROW(runner->set_kv_cache({KvCacheDtype::kFp8E4M3, std::vector<float>(n - 1, 1.0f), {}}),
               Error);
  EXPECT_THROW(runner->set_kv_cache({KvCacheDtype::kFp8E4M3, std::vector<float>(n, 0.0f), {}}),
               Error);
  EXPECT_THROW(runner->set_kv_cache({KvCacheDtype::kBf16, {}, std::vector<float>(n, 1.0f)}), Error);
  // A new element type drops the pool: no forward writes the old pool as the new type.
  runner->set_kv_cache({KvCacheDtype::kFp8E4M3, {}, {}});
  runner->allocate_kv(4, 16);
  runner->set_kv_cache({});
  ForwardBatchBuilder bb(16);
  const std::vector<int32_t> tokens = {5, 6, 7}, blocks = {0};
  bb.add(tokens.data(), 0, 3, blocks, true);
  EXPECT_THROW(runner->forward(std::move(bb).build()), Error);
}

}  // namespace
}  // namespace flashserve::model
