// Penalties, logit_bias and min_tokens through the whole engine (a batch of requests with
// different parameters, chunked prefill, the model executor and the CPU runner's sampler) against
// each request generated alone, greedily, on the argmax of vLLM's processed logits computed in
// double from the model's own logits (tests/support/vllm_penalties.h). A difference is allowed
// only after a near-tie of the processed logits (rounding, not a bug).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "engine/engine.h"
#include "engine/model_engine.h"
#include "engine/tiny_model.h"
#include "model/test_dirs.h"
#include "support/vllm_penalties.h"

namespace fe = flashserve::engine;
namespace fm = flashserve::model;
namespace fs = flashserve::serve;

namespace {

constexpr double kNearTie = 1e-3;

struct Alone {
  std::vector<int32_t> tokens;
  std::vector<double> top2_gap;
};

// Greedy on vLLM's processed logits, one token a step; stops at a stop token (after min_tokens).
Alone generate_processed(fm::ModelRunner& runner, const fe::NewRequest& r) {
  const std::vector<int32_t> table =
      fe::testing::pool_for_alone(runner, r.prompt.size() + static_cast<size_t>(r.max_tokens));
  const int64_t V = runner.config().vocab_size;
  Alone a;
  std::vector<int32_t> seq = r.prompt;
  int64_t done = 0;
  while (static_cast<int64_t>(a.tokens.size()) < r.max_tokens) {
    const int64_t q = static_cast<int64_t>(seq.size()) - done;
    fm::ForwardBatchBuilder b(fe::testing::kAloneBlock);
    b.add(seq.data() + done, done, q, table, true);
    runner.forward(std::move(b).build());
    const std::vector<float> logits = runner.logits();
    const std::vector<float> row(logits.begin(), logits.begin() + V);
    const bool early = static_cast<int64_t>(a.tokens.size()) < r.sampling.min_tokens;
    const std::vector<double> l = flashserve::testing::vllm_processed_logits(
        row, r.sampling, r.prompt, a.tokens, early ? r.stop_token_ids : std::vector<int32_t>{});
    std::vector<double> sorted = l;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<double>());
    const int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    a.tokens.push_back(next);
    a.top2_gap.push_back(sorted[0] - sorted[1]);
    seq.push_back(next);
    done += q;
    if (std::count(r.stop_token_ids.begin(), r.stop_token_ids.end(), next)) break;
  }
  return a;
}

TEST(EnginePenalties, GreedyMatchesVllmsProcessedLogitsAlone) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  std::mt19937_64 rng(fm::testing::test_seed());
  auto alone_runner = fm::make_cpu_runner(fe::testing::tiny_dir());
  const int64_t V = alone_runner->config().vocab_size;
  std::vector<fe::NewRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    fe::NewRequest r;
    // Prompts of a few distinct tokens, so that the output repeats them and penalties bite.
    std::uniform_int_distribution<int32_t> tok(0, 40);
    r.prompt.resize(std::uniform_int_distribution<size_t>(3, 40)(rng));
    for (int32_t& t : r.prompt) t = tok(rng);
    r.max_tokens = 24;
    r.ignore_eos = true;
    fm::SamplingParams& p = r.sampling;
    switch (i % 5) {
      case 0:
        p.repetition_penalty = 1.8f;
        break;
      case 1:
        p.presence_penalty = 1.5f, p.frequency_penalty = 0.8f;
        break;
      case 2:
        p.frequency_penalty = -0.5f, p.repetition_penalty = 0.7f;
        break;
      case 3:  // a strong bias toward one token, against another
        p.logit_bias = {{static_cast<int32_t>(41 + rng() % (V - 41)), 100.0f},
                        {r.prompt[0], -50.0f}};
        p.presence_penalty = 2.0f;
        break;
      case 4:
        break;  // no adjustments: a plain row in the same batch
    }
    reqs.push_back(r);
  }
  // min_tokens: the stop token is the token generated first without it, banned for 5 tokens.
  {
    fe::NewRequest r = reqs[4];
    r.stop_token_ids = {generate_processed(*alone_runner, reqs[4]).tokens[0]};
    r.sampling.min_tokens = 5;
    reqs.push_back(r);
  }

  fe::ModelEngineOptions mo;
  mo.model_dir = fe::testing::tiny_dir();
  mo.num_blocks = 256;
  const fe::LoadedModel m = fe::load_model(mo);
  fs::SchedulerConfig sc;
  sc.policy = fs::Policy::kSarathi;
  sc.max_tokens_per_step = 48;  // prompts are chunked, and prefill beside decodes
  sc.max_running = 16;
  sc.max_model_len = 128;
  sc.chunk_tile = 16;
  auto engine = fe::make_model_engine(m, sc, fe::EngineConfig{}.watermark, false);
  std::map<int64_t, std::vector<int32_t>> got;
  for (const fe::NewRequest& r : reqs) got[engine->add_request(r)];
  while (engine->has_work())
    for (const fe::RequestOutput& o : engine->step().outputs)
      got[o.id].insert(got[o.id].end(), o.new_tokens.begin(), o.new_tokens.end());

  int64_t near_ties = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Alone want = generate_processed(*alone_runner, reqs[i]);
    const std::vector<int32_t>& g = got[static_cast<int64_t>(i)];
    const auto diff = std::mismatch(g.begin(), g.end(), want.tokens.begin(), want.tokens.end());
    if (diff.first == g.end() && diff.second == want.tokens.end()) continue;
    const size_t k = static_cast<size_t>(diff.first - g.begin());
    if (k < want.top2_gap.size() && want.top2_gap[k] < kNearTie) {
      ++near_ties;
      continue;
    }
    ADD_FAILURE() << "request " << i << " differs from its run alone at token " << k;
  }
  EXPECT_LE(near_ties, 2);
  // min_tokens held the stop token back for exactly 5 tokens, and it was sampled later or never.
  const std::vector<int32_t>& last = got[static_cast<int64_t>(reqs.size() - 1)];
  ASSERT_GE(last.size(), 5u);
  for (size_t k = 0; k < 5; ++k) EXPECT_NE(last[k], reqs.back().stop_token_ids[0]) << k;
  // The bias applied (a run that ignored the adjustments would pass the comparison only if the
  // reference ignored them too): +100 makes greedy take that token from the first one on.
  EXPECT_EQ(got[3].at(0), reqs[3].sampling.logit_bias[0].first);
}

}  // namespace

namespace {

// A constraint that allows tokens 5 and 6 only, and is complete after three tokens.
class FiveOrSix final : public fm::TokenConstraint {
 public:
  bool allowed_next(std::vector<uint32_t>& allowed) override {
    allowed[0] |= (1u << 5) | (1u << 6);
    return accepted.size() >= 3;
  }
  void accept(int32_t token) override { accepted.push_back(token); }
  std::vector<int32_t> accepted;
};

// The executor applies a request's constraint with the rest of its sampling: only what it
// allows is drawn (greedy and sampled), its stop tokens only once it is complete, and every
// token drawn is fed back to it.
TEST(EnginePenalties, ConstraintsMaskTheirRowsAndSeeEveryToken) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  fe::ModelEngineOptions mo;
  mo.model_dir = fe::testing::tiny_dir();
  mo.num_blocks = 64;
  const fe::LoadedModel m = fe::load_model(mo);
  fs::SchedulerConfig sc;
  sc.max_model_len = 128;
  auto engine = fe::make_model_engine(m, sc, fe::EngineConfig{}.watermark, false);
  std::vector<std::shared_ptr<FiveOrSix>> constraints;
  std::map<int64_t, std::vector<int32_t>> got;
  for (int i = 0; i < 4; ++i) {
    fe::NewRequest r;
    r.prompt = {1, 2, 3, 4 + i};
    r.max_tokens = 12;
    r.ignore_eos = true;
    r.stop_token_ids = {7};  // allowed once the constraint is complete
    r.sampling.temperature = i % 2 ? 1.0f : 0.0f;
    r.sampling.seed = 3;
    if (i == 0) r.sampling.logit_bias = {{7, 100.0f}};  // wants 7 from the start
    constraints.push_back(std::make_shared<FiveOrSix>());
    r.constraint = constraints.back();
    got[engine->add_request(r)];
  }
  fe::NewRequest plain;  // a row without a constraint in the same batch
  plain.prompt = {9, 9, 9};
  plain.max_tokens = 12;
  plain.ignore_eos = true;
  const int64_t plain_id = engine->add_request(plain);
  while (engine->has_work())
    for (const fe::RequestOutput& o : engine->step().outputs)
      got[o.id].insert(got[o.id].end(), o.new_tokens.begin(), o.new_tokens.end());
  for (int i = 0; i < 4; ++i) {
    const std::vector<int32_t>& g = got[i];
    EXPECT_EQ(g, constraints[i]->accepted) << i;
    for (size_t k = 0; k < g.size(); ++k)
      EXPECT_TRUE(g[k] == 5 || g[k] == 6 || (k >= 3 && g[k] == 7)) << i << ": " << g[k];
  }
  // The request biased toward the stop token takes it as soon as it is allowed.
  EXPECT_EQ(got[0].size(), 4u);
  EXPECT_EQ(got[0].back(), 7);
  EXPECT_EQ(got[plain_id].size(), 12u);
  EXPECT_TRUE(std::any_of(got[plain_id].begin(), got[plain_id].end(),
                          [](int32_t t) { return t != 5 && t != 6; }));
}

}  // namespace
