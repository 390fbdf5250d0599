// server/json_constraint.h: the mask of a JSON-object constraint over a small vocabulary, checked
// token by token against the recognizer fed each token's bytes directly (the trie walk must
// allow exactly those), along random walks that follow the mask; special and empty tokens never
// allowed; completion and the no-way-out case hand the choice to the stop tokens.
#include "server/json_constraint.h"

#include "support/mask_walk.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace flashserve::server {
namespace {

const std::vector<std::string> kVocab = {
    "",  // no bytes (a special token's place): never allowed
    "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "1", "12", "-", ".", "5", "e", "a", "ab", "\"a",
    "a\"", "\":", "{\"", "\",", "true", "fal", "se", "null", "\\", "n", "u", "0", "\xc3\xa9",
    "x\"}", "}}", "]}", ",\"", "\x01",
    // Parts of characters: a token may end inside one, and the next ones must complete it.
    "\xc3", "\xa9", "\xe2\x82", "\xac\"", "\xed", "\xa0", "\x80", "\xe2\x82\xac"};

TEST(JsonConstraint, TheMaskIsExactlyTheTokensTheGrammarTakes) {
  const testing::WalkCounts n = testing::walk_masks(
      kVocab, model::JsonGrammar::any_object(), 11, 200, 40, [](const std::string& text) {
        EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
      });
  EXPECT_GT(n.steps, 2000);
  EXPECT_GT(n.completed, 5);
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
