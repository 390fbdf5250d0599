// The sampling rule of model/sampling.h against independent computations of what it allows and how
// often: greedy is the first argmax; min-p, top-k and top-p never pick outside the set they define
// (and reach its edge); draws follow softmax(logits / T) restricted to that set; the counter-based
// uniform is uniform; and a seed gives the same tokens again through the whole CPU runner.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <set>

#include "flashserve/error.h"
#include "model/generate.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model/sampling.h"
#include "test_dirs.h"

namespace flashserve::model {
namespace {

std::vector<float> random_logits(std::mt19937_64& rng, int64_t n, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> l(static_cast<size_t>(n));
  for (float& x : l) x = nd(rng);
  return l;
}

// Rank of token t in the rule's order (logit descending, ties by lower index), counted directly.
int64_t rank_of(const std::vector<float>& l, int64_t t) {
  int64_t r = 0;
  for (int64_t j = 0; j < static_cast<int64_t>(l.size()); ++j)
    if (l[j] > l[t] || (l[j] == l[t] && j < t)) ++r;
  return r;
}

// The kept set's probabilities by rank: softmax(l / T) over the tokens whose probability is at
// least min_p times the largest's, then the top k of those, cut where the mass of the ranks
// before reaches top_p of it. Computed with a full sort, unlike the sampler's partial one.
std::vector<std::pair<int32_t, double>> kept_set(const std::vector<float>& l,
                                                 const SamplingParams& p) {
  std::vector<int32_t> idx(l.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  size_t k = p.top_k > 0 ? std::min<size_t>(p.top_k, l.size()) : l.size();
  size_t min_p_kept = 0;
  while (min_p_kept < l.size() &&
         std::exp((static_cast<double>(l[idx[min_p_kept]]) - l[idx[0]]) / p.temperature) >= p.min_p)
    ++min_p_kept;
  k = std::min(k, std::max<size_t>(min_p_kept, 1));
  std::vector<std::pair<int32_t, double>> s;
  double z = 0;
  for (size_t i = 0; i < k; ++i) {
    s.emplace_back(idx[i], std::exp((static_cast<double>(l[idx[i]]) - l[idx[0]]) / p.temperature));
    z += s.back().second;
  }
  double before = 0;
  size_t keep = 0;
  while (keep < s.size() && (keep == 0 || before < p.top_p * z)) before += s[keep++].second;
  s.resize(keep);
  double zk = 0;
  for (auto& e : s) zk += e.second;
  for (auto& e : s) e.second /= zk;
  return s;
}

TEST(Sampling, GreedyIsTheFirstArgmax) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 3000)(rng);
    std::vector<float> l = random_logits(rng, n, 4.0f);
    if (trial % 2 && n > 2) {  // plant a tie for the maximum at two random places
      const float top = *std::max_element(l.begin(), l.end()) + 1.0f;
      l[std::uniform_int_distribution<int64_t>(0, n - 1)(rng)] = top;
      l[std::uniform_int_distribution<int64_t>(0, n - 1)(rng)] = top;
    }
    int64_t want = 0;
    for (int64_t i = 1; i < n; ++i)
      if (l[i] > l[want]) want = i;
    SamplingParams p;     // temperature 0
    p.top_k = trial % 5;  // greedy ignores top-k / top-p
    EXPECT_EQ(sample_token(l.data(), n, p, 0.999f), want);
  }
}

TEST(Sampling, TopKAndTopPNeverPickOutsideTheirSetAndReachItsEdge) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int edges = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = std::uniform_int_distribution<int64_t>(2, 500)(rng);
    std::vector<float> l = random_logits(rng, n, 2.0f);
    if (trial % 3 == 0)  // quantised logits: many ties inside and at the edge of the set
      for (float& x : l) x = std::round(x * 2) / 2;
    SamplingParams p;
    p.temperature = std::uniform_real_distribution<float>(0.2f, 2.0f)(rng);
    p.top_k =
        trial % 2 ? static_cast<int32_t>(std::uniform_int_distribution<int64_t>(1, n)(rng)) : 0;
    p.top_p = trial % 4 < 2 ? std::uniform_real_distribution<float>(0.05f, 1.0f)(rng) : 1.0f;
    if (trial % 5 < 2) p.min_p = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    const auto kept = kept_set(l, p);
    std::set<int32_t> allowed;
    for (auto& e : kept) allowed.insert(e.first);
    for (int draw = 0; draw < 50; ++draw) {
      const float u = std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
      const int32_t t = sample_token(l.data(), n, p, u);
      ASSERT_TRUE(allowed.count(t))
          << "token " << t << " (rank " << rank_of(l, t) << ") outside the " << allowed.size()
          << " allowed; top_k " << p.top_k << " top_p " << p.top_p;
    }
    // The extremes of u pick the first and the last token of the kept set (the last when its
    // probability is above u's resolution of 2^-24).
    EXPECT_EQ(sample_token(l.data(), n, p, 0.0f), kept.front().first);
    if (kept.back().second > 1e-6) {
      ++edges;
      EXPECT_EQ(sample_token(l.data(), n, p, 1.0f - 1.0f / 16777216.0f), kept.back().first);
    }
  }
  EXPECT_GT(edges, 50);  // the edge was checked often (top-k / top-p cuts keep it likely)
}

// Pearson's chi-square of observed counts against expected probabilities.
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs, int64_t n) {
  double chi = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * static_cast<double>(n);
    chi += (static_cast<double>(counts[i]) - e) * (static_cast<double>(counts[i]) - e) / e;
  }
  return chi;
}

TEST(Sampling, DrawsFollowTheTemperedSoftmaxOfTheKeptSet) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t vocab = 10, draws = 200000;
  const std::vector<float> l = random_logits(rng, vocab, 1.0f);
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p = 0.0f;
  };
  for (const Case& k : {Case{1.0f, 0, 1.0f}, Case{0.5f, 0, 1.0f}, Case{2.0f, 6, 1.0f},
                        Case{0.8f, 0, 0.7f}, Case{1.0f, 0, 1.0f, 0.2f}}) {
    SamplingParams p;
    p.temperature = k.temperature;
    p.top_k = k.top_k;
    p.top_p = k.top_p;
    p.min_p = k.min_p;
    p.seed = rng();
    const auto kept = kept_set(l, p);
    std::vector<int64_t> counts(kept.size(), 0);
    std::vector<double> probs;
    for (auto& e : kept) probs.push_back(e.second);
    for (int64_t pos = 0; pos < draws; ++pos) {
      const int32_t t = sample_token(l.data(), vocab, p, sample_uniform(p.seed, pos));
      const auto it = std::find_if(kept.begin(), kept.end(), [&](auto& e) { return e.first == t; });
      ASSERT_NE(it, kept.end());
      ++counts[it - kept.begin()];
    }
    // The 1e-6 quantile of chi-square with up to 9 degrees of freedom is below 45; a sampler off
    // by one rank, or tempering by T^2, lands in the thousands at 200000 draws.
    if (kept.size() > 1)
      EXPECT_LT(chi_square(counts, probs, draws), 45.0)
          << "T " << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p;
  }
}

TEST(Sampling, UniformIsUniformAndDependsOnSeedAndPosition) {
  const int64_t n = 1 << 18, bins = 64;
  for (uint64_t seed : {uint64_t{0}, uint64_t{12345}, ~uint64_t{0}}) {
    std::vector<int64_t> counts(bins, 0);
    for (int64_t pos = 0; pos < n; ++pos) {
      const float u = sample_uniform(seed, pos);
      ASSERT_GE(u, 0.0f);
      ASSERT_LT(u, 1.0f);
      ++counts[static_cast<int64_t>(u * bins)];
    }
    // 63 degrees of freedom: the 1e-6 quantile is about 130.
    EXPECT_LT(chi_square(counts, std::vector<double>(bins, 1.0 / bins), n), 130.0) << seed;
  }
  EXPECT_EQ(sample_uniform(7, 100), sample_uniform(7, 100));
  EXPECT_NE(sample_uniform(7, 100), sample_uniform(8, 100));
  EXPECT_NE(sample_uniform(7, 100), sample_uniform(7, 101));
}

TEST(Sampling, ParamsAreValidated) {
  SamplingParams p;
  p.validate();
  p.temperature = -1;
  EXPECT_THROW(p.validate(), Error);
  p = {};
  p.temperature = NAN;
  EXPECT_THROW(p.validate(), Error);
  p = {};
  p.top_k = -1;
  EXPECT_THROW(p.validate(), Error);
  p = {};
  p.top_p = 0;
  EXPECT_THROW(p.validate(), Error);
  p.top_p = 1.5f;
  EXPECT_THROW(p.validate(), Error);
}

// A random tiny checkpoint in a fresh directory `name`, its weights drawn from `seed`.
std::string random_tiny(const char* name, uint64_t seed) {
  const std::string dir = testing::fresh_dir(name);
  RandomCheckpointOptions opt;
  opt.seed = seed;
  write_random_checkpoint(preset_config("tiny"), dir, opt);
  return dir;
}

TEST(Sampling, SameSeedSameTokensThroughTheRunner) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  auto runner = make_cpu_runner(random_tiny("seed", seed));
  GenerateOptions g;
  g.max_tokens = 16;
  g.stop_at_eos = false;
  g.sampling.temperature = 1.0f;
  g.sampling.top_p = 0.95f;
  g.sampling.seed = seed;
  const std::vector<int32_t> prompt = {5, 17, 300, 42, 9};
  const auto a = generate(*runner, prompt, g);
  g.prefill_chunk = 2;  // chunking changes nothing about the draws
  const auto b = generate(*runner, prompt, g);
  EXPECT_EQ(a, b);
  g.sampling.seed = seed + 1;
  const auto c = generate(*runner, prompt, g);
  EXPECT_NE(a, c);  // 16 tokens from a near-uniform 1024-way choice: equal with chance ~1e-40
  ASSERT_EQ(a.size(), 16u);
}

// Generation stops at any of the model's end tokens, generation_config.json's included (the
// tiny config's own eos is 2), and returns the one that stopped it.
TEST(Sampling, GenerateStopsAtAnyEosToken) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  const std::string dir = random_tiny("eos", seed);
  GenerateOptions g;
  g.max_tokens = 24;
  g.stop_at_eos = false;
  const std::vector<int32_t> prompt = {5, 17, 300, 42, 9};
  const auto all = generate(*make_cpu_runner(dir), prompt, g);
  ASSERT_EQ(all.size(), 24u);
  const int32_t stop = all[6];
  std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id": [1023, )" << stop << "]}";
  g.stop_at_eos = true;
  const auto got = generate(*make_cpu_runner(dir), prompt, g);
  const auto end = std::find_if(all.begin(), all.end(),
                                [&](int32_t t) { return t == stop || t == 2 || t == 1023; });
  EXPECT_EQ(got, std::vector<int32_t>(all.begin(), end + 1));
}

}  // namespace
}  // namespace flashserve::model
