// Several constrained rows in one step: the model executor computes their masks on its own
// workers at once (engine/model_executor.h mask_pool_). Through the whole engine on the CPU runner
// (chunked prefill beside decodes, sampled rows beside greedy ones, unconstrained rows between),
// every token a constrained row draws must be one its own constraint allowed at that position, each
// constraint must be asked exactly once per token it gets, and the unconstrained rows must be as
// they are when no row has a constraint.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model_engine.h"
#include "engine/tiny_model.h"
#include "model/test_dirs.h"
#include "model/token_constraint.h"

namespace fe = flashserve::engine;
namespace fm = flashserve::model;
namespace fs = flashserve::serve;

namespace {

// Allows the tokens t with (7 t + 13 k + row) % 5 == 0 at its k-th token: a different set per row
// and per position, so that a mask given to the wrong row or computed for the wrong position shows.
class ModuloConstraint final : public fm::TokenConstraint {
 public:
  ModuloConstraint(int row, int32_t vocab) : row_(row), vocab_(vocab) {}
  bool allowed(int32_t t) const { return (7 * t + 13 * accepted_ + row_) % 5 == 0; }
  bool allowed_next(std::vector<uint32_t>& mask) override {
    ++asked_;
    for (int32_t t = 0; t < vocab_; ++t)
      if (allowed(t)) mask[static_cast<size_t>(t) >> 5] |= 1u << (t & 31);
    return false;
  }
  void accept(int32_t token) override {
    if (!allowed(token)) ++violations_;
    ++accepted_;
  }
  int asked() const { return asked_; }
  int accepted() const { return accepted_; }
  int violations() const { return violations_; }

 private:
  int row_;
  int32_t vocab_;
  int asked_ = 0, accepted_ = 0, violations_ = 0;
};

struct RowTokens {
  std::map<int, std::vector<int32_t>> tokens;  // by row
};

RowTokens run_batch(const std::vector<fe::NewRequest>& reqs) {
  fe::ModelEngineOptions mo;
  mo.model_dir = fe::testing::tiny_dir();
  mo.num_blocks = 128;
  const fe::LoadedModel m = fe::load_model(mo);
  fs::SchedulerConfig sc;
  sc.max_tokens_per_step = 32;  // prompts prefilled in chunks beside the decodes
  sc.max_running = 16;
  sc.max_model_len = 256;
  sc.chunk_tile = 8;
  auto engine = fe::make_model_engine(m, sc);
  std::map<int64_t, int> row_of;
  for (size_t i = 0; i < reqs.size(); ++i)
    row_of[engine->add_request(reqs[i])] = static_cast<int>(i);
  RowTokens out;
  while (engine->has_work())
    for (fe::RequestOutput& o : engine->step().outputs) {
      std::vector<int32_t>& t = out.tokens[row_of.at(o.id)];
      t.insert(t.end(), o.new_tokens.begin(), o.new_tokens.end());
    }
  return out;
}

TEST(EngineConstrainedRows, EachRowDrawsFromItsOwnMaskAndTheOthersAreUntouched) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  const uint64_t seed = fm::testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(3, 1000);
  const int32_t vocab =
      static_cast<int32_t>(fm::make_cpu_runner(fe::testing::tiny_dir())->config().vocab_size);

  constexpr int kRows = 10;
  std::vector<fe::NewRequest> plain(kRows);
  for (int i = 0; i < kRows; ++i) {
    fe::NewRequest& r = plain[static_cast<size_t>(i)];
    r.prompt.resize(std::uniform_int_distribution<size_t>(5, 60)(rng));
    for (int32_t& t : r.prompt) t = token(rng);
    r.max_tokens = 12;
    r.ignore_eos = true;
    if (i % 2) r.sampling = {0.9f, 0, 1.0f, seed + static_cast<uint64_t>(i)};  // else greedy
  }
  // Rows 0, 1, 2, 4, 5, 7, 8 constrained; 3, 6, 9 not.
  std::vector<fe::NewRequest> mixed = plain;
  std::vector<std::shared_ptr<ModuloConstraint>> constraints(kRows);
  for (int i = 0; i < kRows; ++i)
    if (i % 3 != 0 || i == 0) {
      constraints[static_cast<size_t>(i)] = std::make_shared<ModuloConstraint>(i, vocab);
      mixed[static_cast<size_t>(i)].constraint = constraints[static_cast<size_t>(i)];
    }

  const RowTokens with = run_batch(mixed);
  const RowTokens without = run_batch(plain);
  for (int i = 0; i < kRows; ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    const std::vector<int32_t>& got = with.tokens.at(i);
    ASSERT_EQ(got.size(), 12u);
    if (const auto& c = constraints[static_cast<size_t>(i)]) {
      EXPECT_EQ(c->violations(), 0);
      EXPECT_EQ(c->accepted(), 12);
      EXPECT_EQ(c->asked(), 12);  // once per token: no mask computed twice or skipped
      for (size_t k = 0; k < got.size(); ++k)
        EXPECT_EQ((7 * got[k] + 13 * static_cast<int>(k) + i) % 5, 0) << "token " << k;
    } else {
      // The same batch shapes step by step (the constraints change no schedule), so the same
      // logits and the same draws.
      EXPECT_EQ(got, without.tokens.at(i));
    }
  }
}

}  // namespace
