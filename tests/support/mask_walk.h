// Random walks along a structured-output constraint's mask (server/json_constraint.h) over a small
// vocabulary: at every step the mask must be exactly the tokens that a mirror recognizer, fed
// each token's bytes directly, takes whole (the trie walk must allow those and no others); the
// walk then takes one of them at random. A walk that completes hands its text to `complete`; one
// stuck (no token continues it) must truly have no token that continues it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/json_grammar.h"
#include "model/json_recognizer.h"
#include "server/json_constraint.h"

namespace flashserve::testing {

struct WalkCounts {
  int steps = 0;
  int completed = 0;
};

inline bool takes_whole(model::JsonRecognizer r, const std::string& bytes) {
  if (bytes.empty()) return false;
  for (char c : bytes)
    if (!r.feed(static_cast<uint8_t>(c))) return false;
  return true;
}

inline WalkCounts walk_masks(const std::vector<std::string>& vocab,
                             const std::shared_ptr<const model::JsonGrammar>& grammar,
                             uint32_t seed, int walks, int max_steps,
                             const std::function<void(const std::string&)>& complete) {
  auto trie = std::make_shared<const server::VocabTrie>(vocab);
  const int V = static_cast<int>(vocab.size());
  std::mt19937 rng(seed);
  WalkCounts counts;
  for (int walk = 0; walk < walks; ++walk) {
    server::JsonConstraint c(trie, grammar);
    model::JsonRecognizer mirror(grammar.get());
    std::string text;
    for (int step = 0; step < max_steps; ++step) {
      std::vector<uint32_t> allowed((V + 31) / 32, 0u);
      const bool done = c.allowed_next(allowed);
      std::vector<int> ok;
      for (int t = 0; t < V; ++t) {
        const bool bit = allowed[t >> 5] >> (t & 31) & 1u;
        EXPECT_EQ(bit, !done && takes_whole(mirror, vocab[t]))
            << "seed " << seed << ", token " << t << " after '" << text << "'";
        if (bit != (!done && takes_whole(mirror, vocab[t]))) return counts;
        if (bit) ok.push_back(t);
      }
      ++counts.steps;
      if (done) {
        if (mirror.complete()) {
          complete(text);
          ++counts.completed;
        } else {  // stuck: truly no token of the vocabulary continues the text
          for (int t = 0; t < V; ++t) EXPECT_FALSE(takes_whole(mirror, vocab[t])) << text;
        }
        break;
      }
      EXPECT_FALSE(ok.empty()) << "seed " << seed << " after '" << text << "'";
      if (ok.empty()) return counts;
      const int t = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
      c.accept(t);
      for (char ch : vocab[t]) mirror.feed(static_cast<uint8_t>(ch));
      text += vocab[t];
    }
  }
  return counts;
}

}  // namespace flashserve::testing
