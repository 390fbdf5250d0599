// server/json_constraint.h: the mask of a JSON-object constraint over a small vocabulary, checked
// token by token against the recognizer fed each token's bytes directly (the trie walk must
// allow exactly those), along random walks that follow the mask; special and empty tokens never
// allowed; completion and the no-way-out case hand the choice to the stop tokens.
#include "server/json_constraint.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace flashserve::server {
namespace {

const std::vector<std::string> kVocab = {
    "",  // no bytes (a special token's place): never allowed
    "{",  "}",    "[",  "]", "\"", ":",   ",",        " ",    "\n",  "1",   "12",   "-",
    ".",  "5",    "e",  "a", "ab", "\"a", "a\"",      "\":",  "{\"", "\",", "true", "fal",
    "se", "null", "\\", "n", "u",  "0",   "\xc3\xa9", "x\"}", "}}",  "]}",  ",\"",  "\x01"};

bool accepts(model::JsonRecognizer s, const std::string& bytes) {
  if (bytes.empty()) return false;
  for (char c : bytes)
    if (!s.feed(static_cast<uint8_t>(c))) return false;
  return true;
}

TEST(JsonConstraint, TheMaskIsExactlyTheTokensTheGrammarTakes) {
  auto trie = std::make_shared<const VocabTrie>(kVocab);
  const int V = static_cast<int>(kVocab.size());
  std::mt19937 rng(11);
  int completed = 0, steps = 0;
  for (int walk = 0; walk < 200; ++walk) {
    JsonConstraint c(trie, model::JsonGrammar::any_object());
    model::JsonRecognizer mirror;
    std::string text;
    for (int step = 0; step < 40; ++step) {
      std::vector<uint32_t> allowed((V + 31) / 32, 0u);
      const bool done = c.allowed_next(allowed);
      std::vector<int> ok;
      for (int t = 0; t < V; ++t) {
        const bool bit = allowed[t >> 5] >> (t & 31) & 1u;
        ASSERT_EQ(bit, !done && accepts(mirror, kVocab[t]))
            << "token " << t << " after '" << text << "'";
        if (bit) ok.push_back(t);
      }
      ++steps;
      if (done) {
        if (mirror.complete()) {
          EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
          ++completed;
        } else {  // stuck: truly no token of the vocabulary continues the text
          for (int t = 0; t < V; ++t) EXPECT_FALSE(accepts(mirror, kVocab[t])) << text;
        }
        break;
      }
      ASSERT_FALSE(ok.empty()) << text;
      const int t = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
      c.accept(t);
      for (char ch : kVocab[t]) ASSERT_TRUE(mirror.feed(static_cast<uint8_t>(ch)));
      text += kVocab[t];
    }
  }
  EXPECT_GT(steps, 2000);
  EXPECT_GT(completed, 5);
}

TEST(JsonConstraint, AStopTokenThatIsNotJsonLeavesTheStateAlone) {
  auto trie = std::make_shared<const VocabTrie>(kVocab);
  JsonConstraint c(trie, model::JsonGrammar::any_object());
  c.accept(1);   // "{"
  c.accept(16);  // "a": not allowed here; ignored as a stop token would be
  std::vector<uint32_t> allowed(2, 0u);
  EXPECT_FALSE(c.allowed_next(allowed));
  EXPECT_TRUE(allowed[0] >> 5 & 1u);  // '"' may open a key
  EXPECT_FALSE(allowed[0] >> 16 & 1u);
}

TEST(JsonConstraint, NoWayOnHandsTheChoiceToTheStopTokens) {
  // A vocabulary that can open an object but never close it.
  auto trie = std::make_shared<const VocabTrie>(std::vector<std::string>{"{", "x"});
  JsonConstraint c(trie, model::JsonGrammar::any_object());
  std::vector<uint32_t> allowed(1, 0u);
  EXPECT_FALSE(c.allowed_next(allowed));
  EXPECT_EQ(allowed[0], 1u);  // "{"
  c.accept(0);
  allowed[0] = 0;
  EXPECT_TRUE(c.allowed_next(allowed));  // stuck: "complete", nothing of its own allowed
  EXPECT_EQ(allowed[0], 0u);
}

}  // namespace
}  // namespace flashserve::server
