// model/json_recognizer.h against nlohmann::json's own parser (json::accept) over every string of
// up to 6 bytes of a JSON-ish alphabet, plus hand-written objects with every kind of value, the
// limits beyond the RFC, and the property the token mask needs: every prefix the recognizer
// takes can still be completed (no dead end).
#include "model/json_recognizer.h"

#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace flashserve::model {
namespace {

// Feeds `s`; the number of bytes taken before the first refusal (s.size(): all).
size_t taken(JsonRecognizer& r, const std::string& s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (!r.feed(static_cast<uint8_t>(s[i]))) return i;
  return s.size();
}

bool whole_object(const std::string& s) {
  JsonRecognizer r;
  return taken(r, s) == s.size() && r.complete();
}

// Calls `check` with every string of 1 to `max_len` bytes of `alphabet`.
void for_every_string(const std::string& alphabet, int max_len,
                      const std::function<void(const std::string&)>& check) {
  std::vector<std::string> level{""};
  for (int len = 1; len <= max_len; ++len) {
    std::vector<std::string> next;
    for (const std::string& p : level)
      for (char c : alphabet) next.push_back(p + c);
    for (const std::string& s : next) check(s);
    level = std::move(next);
  }
}

TEST(JsonRecognizer, AgreesWithNlohmannOnEveryShortString) {
  // The top level is an object with no whitespace around it (the recognizer's rule beyond the
  // RFC); everything else is json::accept's decision.
  int64_t objects = 0;
  for_every_string("{}[]\":,1- a", 6, [&](const std::string& s) {
    const bool reference = s.front() == '{' && s.back() == '}' && nlohmann::json::accept(s);
    ASSERT_EQ(whole_object(s), reference) << "'" << s << "'";
    objects += reference;
  });
  EXPECT_GE(objects, 5);  // {}, {"":1}, {"":[]} ...
}

// Strings are UTF-8 as RFC 3629 has it (nlohmann's parser checks the same): every sequence of up
// to 4 bytes of lead, continuation and invalid bytes, as a value and as a key.
TEST(JsonRecognizer, AgreesWithNlohmannOnTheUtf8OfStrings) {
  const std::string bytes = "A\xC2\xC3\xDF\xE0\xE2\xED\xEF\xF0\xF4\xF5\x80\x8F\x90\x9F\xA0\xBF\xC0";
  int64_t valid = 0;
  for_every_string(bytes, 4, [&](const std::string& x) {
    for (const std::string& s : {"{\"a\":\"" + x + "\"}", "{\"" + x + "\":1}"}) {
      const bool reference = nlohmann::json::accept(s);
      ASSERT_EQ(whole_object(s), reference)
          << nlohmann::json(nlohmann::json::binary_t(std::vector<uint8_t>(s.begin(), s.end())));
      valid += reference;
    }
  });
  EXPECT_GT(valid, 1000);  // A, é, €, U+10000 ... in every arrangement that is UTF-8
}

TEST(JsonRecognizer, TakesObjectsWithEveryKindOfValue) {
  for (const char* s : {"{}", "{\"a\":1}", "{\"a\": [1, -2.5e+3, 0, 0.25, 1E9, true, false, null]}",
                        "{\"k\":\"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uD83D\\uDE00\"}",
                        "{\"nested\":{\"x\":[{},[],[[]]]},\"y\":\"\xc3\xa9\"}", "{ \"a\" : { } }",
                        "{\"a\":1,\"b\":2}"}) {
    EXPECT_TRUE(whole_object(s)) << s;
    EXPECT_TRUE(nlohmann::json::accept(s)) << s;  // the cases are JSON indeed
  }
}

TEST(JsonRecognizer, RefusesAtTheFirstByteThatCannotFollow) {
  const std::vector<std::pair<std::string, size_t>> cases = {
      {" {}", 0},               // no leading whitespace
      {"[1]", 0},               // the top level is an object
      {"{}x", 2},               // nothing after it
      {"{} ", 2},               //
      {"{\"a\" 1}", 5},         // a colon after the key
      {"{\"a\":01}", 6},        // no leading zero
      {"{\"a\":1.}", 7},        // a digit after the point
      {"{\"a\":tru}", 8},       // true
      {"{\"a\":\"\x01\"}", 6},  // control characters are escaped
      {"{\"a\":\"\\x\"}", 7},   // no such escape
      {"{\"a\":\"\\u12g4\"}", 10},
      {"{\"a\":[1}", 7},  // brackets match
      {"{,}", 1},
      {"{\"a\":1,}", 7},  // no trailing comma
  };
  for (const auto& [s, at] : cases) {
    JsonRecognizer r;
    EXPECT_EQ(taken(r, s), at) << "'" << s << "'";
    EXPECT_EQ(r.complete(), s.rfind("{}", 0) == 0) << s;
  }
}

TEST(JsonRecognizer, LimitsWhitespaceRunsAndDepth) {
  JsonRecognizer r;
  std::string s = "{" + std::string(JsonRecognizer::kMaxWhitespace, ' ');
  EXPECT_EQ(taken(r, s), s.size());
  EXPECT_FALSE(r.feed(' '));
  EXPECT_TRUE(r.feed('}'));
  EXPECT_TRUE(r.complete());

  JsonRecognizer deep;
  std::string open = "{\"a\":";
  for (int i = 1; i < JsonRecognizer::kMaxDepth; ++i) open += "[";
  EXPECT_EQ(taken(deep, open), open.size());
  EXPECT_FALSE(deep.feed('['));  // one level more than kMaxDepth
  EXPECT_FALSE(deep.feed('{'));  // whichever bracket
  EXPECT_TRUE(deep.feed('1'));   // a scalar is no deeper
}

// Every prefix the recognizer takes has a completion: a breadth-first search over the alphabet
// finds one within a few bytes (what a mask needs: it never leads a completion into a state with
// no way out).
TEST(JsonRecognizer, EveryTakenPrefixCanBeCompleted) {
  const std::string alphabet = "{}[]\":,1-a.e\\u0";
  std::vector<std::pair<std::string, JsonRecognizer>> level{{"", JsonRecognizer{}}};
  int64_t checked = 0;
  for (int len = 1; len <= 4; ++len) {
    std::vector<std::pair<std::string, JsonRecognizer>> next;
    for (const auto& [p, r] : level)
      for (char c : alphabet) {
        JsonRecognizer s = r;
        if (s.feed(static_cast<uint8_t>(c))) next.push_back({p + c, s});
      }
    for (const auto& [p, r] : next) {
      std::deque<std::pair<JsonRecognizer, int>> queue{{r, 0}};
      bool found = r.complete();
      while (!found && !queue.empty()) {
        auto [s, depth] = queue.front();
        queue.pop_front();
        if (depth == 8) continue;
        for (char c : alphabet) {
          JsonRecognizer t = s;
          if (!t.feed(static_cast<uint8_t>(c))) continue;
          if (t.complete()) {
            found = true;
            break;
          }
          queue.push_back({t, depth + 1});
        }
      }
      ASSERT_TRUE(found) << "no completion of '" << p << "'";
      ++checked;
    }
    level = std::move(next);
  }
  EXPECT_GT(checked, 200);
}

}  // namespace
}  // namespace flashserve::model
