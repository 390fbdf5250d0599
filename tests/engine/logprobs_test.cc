// Logprobs (model/logprobs.h) against float64 recomputations: token_logprobs on fresh random rows
// of logits, and the engine's per-token logprobs against log_softmax, in float64, of the logits the
// CPU runner gives for the same request run alone. Also: the log-probability is the model's (raw
// logits, as vLLM reports by default), not the temperature-scaled one the token was drawn from, and
// only the rows of requests that ask leave the runner.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "engine/engine.h"
#include "engine/model_engine.h"
#include "engine/tiny_model.h"
#include "flashserve/error.h"
#include "model/logprobs.h"
#include "model/test_dirs.h"

namespace fe = flashserve::engine;
namespace fm = flashserve::model;
namespace fs = flashserve::serve;
using flashserve::Error;

namespace {

// log_softmax in float64, written apart from the code under test: log(sum exp) around the first
// finite value, the sum in long double.
std::vector<double> log_softmax64(const float* row, int64_t vocab, double temperature = 1.0) {
  double pivot = 0;
  for (int64_t i = 0; i < vocab; ++i)
    if (std::isfinite(row[i])) pivot = std::max(pivot, static_cast<double>(row[i]) / temperature);
  long double sum = 0;
  for (int64_t i = 0; i < vocab; ++i)
    sum += std::exp(static_cast<long double>(row[i]) / temperature - pivot);
  const double lse = pivot + static_cast<double>(std::log(sum));
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) out[i] = static_cast<double>(row[i]) / temperature - lse;
  return out;
}

// Token ids by logit descending, ties to the lower id (the sampler's order).
std::vector<int32_t> order_of(const float* row, int64_t vocab) {
  std::vector<int32_t> o(static_cast<size_t>(vocab));
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  return o;
}

TEST(TokenLogprobs, IsTheFloat64LogSoftmaxAndTheTopIsSorted) {
  const uint64_t seed = fm::testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int64_t vocab : {1, 7, 1000, 32000}) {
    std::vector<float> row(static_cast<size_t>(vocab));
    for (float& x : row) x = normal(rng) + 30.0f;  // an offset: log_softmax must subtract it
    if (vocab >= 10) {                             // a tie at the top: the lower id comes first
      const float top = *std::max_element(row.begin(), row.end()) + 1.0f;
      row[9] = top;
      row[5] = top;
      row[vocab - 1] = -std::numeric_limits<float>::infinity();  // a masked token
    }
    const std::vector<double> ref = log_softmax64(row.data(), vocab);
    const std::vector<int32_t> order = order_of(row.data(), vocab);
    long double mass = 0;
    for (double x : ref) mass += std::exp(static_cast<long double>(x));
    ASSERT_NEAR(static_cast<double>(mass), 1.0, 1e-9);  // the reference itself
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab - 1));
    for (int32_t token : {pick(rng), pick(rng), order[0], static_cast<int32_t>(vocab - 1)})
      for (int32_t n : {0, 1, 5, 20}) {
        const fm::SampledLogprobs r = fm::token_logprobs(row.data(), vocab, token, n);
        EXPECT_EQ(r.sampled.token, token);
        if (std::isinf(ref[token])) {
          EXPECT_EQ(r.sampled.logprob, -std::numeric_limits<float>::infinity());
        } else {
          EXPECT_NEAR(r.sampled.logprob, ref[token], 1e-6 + 1e-7 * std::abs(ref[token]));
        }
        ASSERT_EQ(r.top.size(), static_cast<size_t>(std::min<int64_t>(n, vocab)));
        for (size_t i = 0; i < r.top.size(); ++i) {
          EXPECT_EQ(r.top[i].token, order[i]) << "rank " << i;
          EXPECT_NEAR(r.top[i].logprob, ref[order[i]], 1e-6 + 1e-7 * std::abs(ref[order[i]]));
          if (i > 0) EXPECT_GE(r.top[i - 1].logprob, r.top[i].logprob);
        }
      }
    if (vocab >= 10) {
      const fm::SampledLogprobs r = fm::token_logprobs(row.data(), vocab, 9, 2);
      EXPECT_EQ(r.top[0].token, 5);
      EXPECT_EQ(r.top[1].token, 9);
      EXPECT_EQ(r.top[0].logprob, r.top[1].logprob);
    }
  }
  std::vector<float> row = {1.0f, 2.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_TRUE(std::isnan(fm::token_logprobs(row.data(), 3, 0, 0).sampled.logprob));
  EXPECT_THROW(fm::token_logprobs(row.data(), 3, 3, 0), Error);
  EXPECT_THROW(fm::token_logprobs(row.data(), 3, -1, 0), Error);
  EXPECT_THROW(fm::token_logprobs(row.data(), 3, 0, fm::kMaxTopLogprobs + 1), Error);
  EXPECT_THROW(fm::token_logprobs(row.data(), 3, 0, -1), Error);
}

// A runner that counts the rows of logits handed over for logprobs.
class CountingRunner final : public fm::ModelRunner {
 public:
  explicit CountingRunner(std::shared_ptr<fm::ModelRunner> inner) : inner_(std::move(inner)) {}
  const fm::ModelConfig& config() const override { return inner_->config(); }
  void allocate_kv(int64_t blocks, int32_t block_size) override {
    inner_->allocate_kv(blocks, block_size);
  }
  void forward(const fm::ForwardBatch& b) override { inner_->forward(b); }
  std::vector<float> logits() const override { return inner_->logits(); }
  std::vector<float> logits_rows(const std::vector<int32_t>& rows) const override {
    rows_read += static_cast<int64_t>(rows.size());
    return inner_->logits_rows(rows);
  }
  std::vector<int32_t> sample(const fm::ForwardBatch& b, const std::vector<fm::SamplingParams>& p,
                              const std::vector<fm::LogitsAdjust>& a) override {
    return inner_->sample(b, p, a);
  }
  mutable int64_t rows_read = 0;

 private:
  std::shared_ptr<fm::ModelRunner> inner_;
};

struct AloneRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // the row each token was drawn from
};

// The request alone through its own runner, whole prefill then one token a step, keeping the
// logits; checks logits_rows against logits() on the way.
AloneRun run_alone(fm::ModelRunner& runner, const std::vector<int32_t>& prompt, int64_t max_tokens,
                   const fm::SamplingParams& params) {
  constexpr int32_t kBlock = 16;
  const int64_t blocks = (static_cast<int64_t>(prompt.size()) + max_tokens + kBlock) / kBlock;
  runner.allocate_kv(blocks, kBlock);
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  AloneRun a;
  std::vector<int32_t> seq = prompt;
  int64_t done = 0;
  while (static_cast<int64_t>(a.tokens.size()) < max_tokens) {
    const int64_t q = static_cast<int64_t>(seq.size()) - done;
    fm::ForwardBatchBuilder b(kBlock);
    b.add(seq.data() + done, done, q, table, true);
    const fm::ForwardBatch fb = std::move(b).build();
    runner.forward(fb);
    a.logits.push_back(runner.logits());
    EXPECT_EQ(runner.logits_rows({0}), a.logits.back());
    EXPECT_THROW(runner.logits_rows({1}), Error);
    a.tokens.push_back(runner.sample(fb, {params})[0]);
    seq.push_back(a.tokens.back());
    done += q;
  }
  return a;
}

TEST(EngineLogprobs, AreTheFloat64LogSoftmaxOfTheModelsLogitsAndOnlyAskersPay) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  const uint64_t seed = fm::testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(3, 1000);

  fe::ModelEngineOptions mo;
  mo.model_dir = fe::testing::tiny_dir();
  mo.num_blocks = 64;
  fe::LoadedModel m = fe::load_model(mo);
  auto counting = std::make_shared<CountingRunner>(m.runner);
  m.runner = counting;
  fs::SchedulerConfig sc;
  sc.max_tokens_per_step = 24;  // the prompts are prefilled in chunks beside the decodes
  sc.max_running = 8;
  sc.max_model_len = 256;
  sc.chunk_tile = 8;
  auto engine = fe::make_model_engine(m, sc);

  struct Case {
    fe::NewRequest r;
    std::vector<int32_t> tokens;
    std::vector<fm::SampledLogprobs> logprobs;
  };
  std::vector<Case> cases(3);
  for (Case& c : cases) {
    for (int i = 0; i < 30; ++i) c.r.prompt.push_back(token(rng));
    c.r.max_tokens = 7;
    c.r.ignore_eos = true;
  }
  cases[0].r.logprobs = 5;  // greedy
  cases[1].r.logprobs = 3;  // sampled at temperature 0.7 from a top-k 40 nucleus
  cases[1].r.sampling = {0.7f, 40, 0.95f, seed};
  cases[2].r.sampling = {0.9f, 0, 1.0f, seed + 1};  // asks for none
  std::map<int64_t, Case*> by_id;
  for (Case& c : cases) by_id[engine->add_request(c.r)] = &c;
  while (engine->has_work())
    for (fe::RequestOutput& o : engine->step().outputs) {
      Case& c = *by_id.at(o.id);
      c.tokens.insert(c.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      c.logprobs.insert(c.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
    }
  EXPECT_EQ(counting->rows_read, 14);  // 7 + 7 tokens of the two that asked, nothing else
  EXPECT_TRUE(cases[2].logprobs.empty());
  EXPECT_EQ(cases[2].tokens.size(), 7u);

  auto reference = fm::make_cpu_runner(fe::testing::tiny_dir());
  const int64_t vocab = reference->config().vocab_size;
  bool raw_not_scaled = false;  // the sampled case shows the unscaled distribution somewhere
  for (int k = 0; k < 2; ++k) {
    const Case& c = cases[k];
    SCOPED_TRACE("case " + std::to_string(k));
    const AloneRun alone = run_alone(*reference, c.r.prompt, c.r.max_tokens, c.r.sampling);
    ASSERT_EQ(c.tokens, alone.tokens);
    ASSERT_EQ(c.logprobs.size(), c.tokens.size());
    for (size_t t = 0; t < c.tokens.size(); ++t) {
      const float* row = alone.logits[t].data();
      const std::vector<double> ref = log_softmax64(row, vocab);
      const std::vector<int32_t> order = order_of(row, vocab);
      const fm::SampledLogprobs& got = c.logprobs[t];
      // Batched and alone forwards round differently (float32 sums of other shapes).
      constexpr double kTol = 1e-4;
      EXPECT_EQ(got.sampled.token, c.tokens[t]);
      EXPECT_NEAR(got.sampled.logprob, ref[c.tokens[t]], kTol) << "position " << t;
      ASSERT_EQ(got.top.size(), static_cast<size_t>(c.r.logprobs));
      for (size_t i = 0; i < got.top.size(); ++i) {
        EXPECT_NEAR(got.top[i].logprob, ref[order[i]], kTol) << "position " << t << " rank " << i;
        if (i + 1 < got.top.size() && ref[order[i]] - ref[order[i + 1]] > kTol &&
            (i == 0 || ref[order[i - 1]] - ref[order[i]] > kTol))
          EXPECT_EQ(got.top[i].token, order[i]) << "position " << t << " rank " << i;
        if (i > 0) EXPECT_GE(got.top[i - 1].logprob, got.top[i].logprob);
      }
      if (k == 0) {  // greedy: the sampled token is the most likely one
        EXPECT_EQ(got.top[0].token, got.sampled.token);
        EXPECT_EQ(got.top[0].logprob, got.sampled.logprob);
      } else {
        const double scaled = log_softmax64(row, vocab, 0.7)[c.tokens[t]];
        raw_not_scaled |= std::abs(scaled - got.sampled.logprob) > 1e-2;
      }
    }
  }
  EXPECT_TRUE(raw_not_scaled);
  EXPECT_THROW(engine->add_request([] {
    fe::NewRequest r;
    r.prompt = {1, 2};
    r.logprobs = fm::kMaxTopLogprobs + 1;
    return r;
  }()),
               Error);
}

}  // namespace
