// Streaming: every chunk is valid UTF-8, the chunks add up to what decode() gives for the whole
// sequence past the prompt, characters split over several byte tokens appear whole in one chunk,
// and the Llama 2 leading space survives after a prompt.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_fixtures.h"

namespace flashserve::tokenizer {
namespace {

std::vector<std::string> texts() {
  std::ifstream in(fixture_dir("compare_corpus.json"));
  return nlohmann::json::parse(in).get<std::vector<std::string>>();
}

// Streams `generated` after `prompt`; checks each chunk and returns their concatenation.
std::string stream(const Tokenizer& t, const std::vector<int32_t>& prompt,
                   const std::vector<int32_t>& generated, bool skip) {
  IncrementalDecoder d(t, prompt, skip);
  std::string all;
  for (int32_t id : generated) {
    const std::string chunk = d.push(id);
    EXPECT_TRUE(utf8::is_valid(chunk)) << nlohmann::json(utf8::lossy(chunk));
    all += chunk;
  }
  const std::string rest = d.flush();
  EXPECT_TRUE(utf8::is_valid(rest));
  return all + rest;
}

class Streaming : public ::testing::TestWithParam<const char*> {};

TEST_P(Streaming, ChunksAddUpToTheDecode) {
  const Tokenizer t = Tokenizer::load(fixture_dir(GetParam()));
  const std::vector<int32_t> prompt = t.encode("Say:", true);
  int compared = 0;
  for (const std::string& text : texts()) {
    const auto ids = t.encode(text, false);
    for (bool skip : {false, true}) {
      // Without a prompt: the whole decode.
      EXPECT_EQ(stream(t, {}, ids, skip), t.decode(ids, skip)) << nlohmann::json(text);
      // After a prompt: the decode of prompt + generated past the decode of the prompt.
      std::vector<int32_t> all = prompt;
      all.insert(all.end(), ids.begin(), ids.end());
      const std::string full = t.decode(all, skip), head = t.decode(prompt, skip);
      ASSERT_EQ(full.compare(0, head.size(), head), 0);
      EXPECT_EQ(stream(t, prompt, ids, skip), full.substr(head.size())) << nlohmann::json(text);
      ++compared;
    }
  }
  EXPECT_GT(compared, 800);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Streaming, ::testing::Values("byte_level", "byte_fallback"));

TEST(StreamingByteFallback, ACharacterOfFourByteTokensComesOutWhole) {
  const Tokenizer t = Tokenizer::load(fixture_dir("byte_fallback"));
  const auto ids = t.encode("ok \xF0\x93\x80\x80", false);  // ..., <0xF0> <0x93> <0x80> <0x80>
  ASSERT_GE(ids.size(), 4u);
  IncrementalDecoder d(t, t.encode("x", true));
  std::vector<std::string> chunks;
  for (int32_t id : ids) chunks.push_back(d.push(id));
  const size_t n = chunks.size();
  EXPECT_EQ(chunks[n - 4], "");
  EXPECT_EQ(chunks[n - 3], "");
  EXPECT_EQ(chunks[n - 2], "");
  EXPECT_EQ(chunks[n - 1], "\xF0\x93\x80\x80");
  EXPECT_EQ(d.flush(), "");
}

// A lone continuation byte after an emitted byte token makes byte fallback rewrite the two as two
// U+FFFD: the emitted "D" stays, and the text after the pair still comes, as vLLM's streaming
// gives it (it stopped there: the rest of a completion was lost).
TEST(StreamingByteFallback, AByteThatBreaksAnEmittedCharacterDoesNotStopTheStream) {
  const Tokenizer t = Tokenizer::load(fixture_dir("byte_fallback"));
  const std::optional<int32_t> d = t.token_id("<0x44>"), bad = t.token_id("<0x83>");
  ASSERT_TRUE(d && bad);
  const std::vector<int32_t> tail = t.encode("ative words", false);
  IncrementalDecoder dec(t, t.encode("x", true));
  std::string all = dec.push(*d);
  EXPECT_EQ(all, "D");
  all += dec.push(*bad);
  for (int32_t id : tail) all += dec.push(id);
  all += dec.flush();
  EXPECT_TRUE(utf8::is_valid(all));
  EXPECT_EQ(all,
            "D\xEF\xBF\xBD"
            " ative words");  // (encode gives "▁ative")
}

TEST(StreamingByteFallback, LeadingSpaceAfterThePrompt) {
  const Tokenizer t = Tokenizer::load(fixture_dir("byte_fallback"));
  const auto word = t.encode("the", false);  // "▁the": decoded alone, Strip drops the space
  ASSERT_EQ(word.size(), 1u);
  EXPECT_EQ(t.decode(word, false), "the");
  IncrementalDecoder d(t, t.encode("Say", true));
  EXPECT_EQ(d.push(word[0]), " the");
}

TEST(StreamingByteLevel, TruncatedCharacterIsFlushedAsReplacement) {
  const Tokenizer t = Tokenizer::load(fixture_dir("byte_level"));
  const auto ids = t.encode("\xF0\x9F\x98\x80", false);  // 😀, several byte tokens
  ASSERT_GT(ids.size(), 1u);
  IncrementalDecoder d(t, {});
  EXPECT_EQ(d.push(ids[0]), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace flashserve::tokenizer
