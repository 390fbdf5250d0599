// The tokenizer on the checked-in fixtures, against expectations written by hand from the
// definitions (GPT-2's byte map, UTF-8 of known characters, the fixtures' own special tokens),
// and its errors. The comparison with Hugging Face's implementation is hf_reference_test.cc.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "flashserve/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/checkpoint_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_fixtures.h"

namespace flashserve::tokenizer {
namespace {

std::vector<std::string> corpus_lines() {
  std::ifstream in(fixture_dir("corpus.txt"));
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::string fixture_json(const std::string& kind) {
  std::ifstream in(fixture_dir(kind) + "/tokenizer.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The error a loader throws for a tokenizer.json edited by `edit`.
Error load_error(void (*edit)(nlohmann::json&)) {
  auto j = nlohmann::json::parse(fixture_json("byte_level"));
  edit(j);
  try {
    Tokenizer::from_json(j.dump());
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error";
  return Error(ErrorKind::kInternal, "", "");
}

TEST(ByteLevelMap, IsGpt2sTable) {
  const ByteLevelMap& m = ByteLevelMap::get();
  EXPECT_EQ(m.encode(' '), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(m.encode('\n'), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(m.encode(0), "\xC4\x80");     // U+0100
  EXPECT_EQ(m.encode('A'), "A");
  EXPECT_EQ(m.encode(0xAD), "\xC5\x83");  // U+0143, the last remapped byte
  for (int b = 0; b < 256; ++b) {
    size_t n;
    EXPECT_EQ(m.decode(utf8::decode(m.encode(b), 0, &n)), b);
  }
}

TEST(Utf8, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(utf8::lossy("a\xFF"
                        "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(utf8::lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");  // one truncated 4-byte sequence
  EXPECT_EQ(utf8::lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(utf8::lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
  EXPECT_TRUE(utf8::is_valid("日本 👩‍💻"));
}

TEST(ByteLevelTokenizer, SpecialTokensAndBos) {
  const Tokenizer t = Tokenizer::load(fixture_dir("byte_level"));
  const int32_t bos = *t.token_id("<|begin_of_text|>"), eot = *t.token_id("<|eot_id|>");
  EXPECT_EQ(t.vocab_size(), 1536);
  EXPECT_EQ(t.bos_token_id(), bos);
  EXPECT_EQ(t.eos_token_ids(), std::vector<int32_t>{eot});
  EXPECT_EQ(t.bos_token(), "<|begin_of_text|>");
  EXPECT_TRUE(t.is_special(eot));
  EXPECT_FALSE(t.is_special(*t.token_id("A")));
  // Byte-level tokens of single bytes are the byte map's characters: "A" is 'A', " " is 'Ġ'.
  EXPECT_EQ(t.encode("A", false), std::vector<int32_t>{*t.token_id("A")});
  EXPECT_EQ(t.encode("<|eot_id|>", false), std::vector<int32_t>{eot});
  const auto ids = t.encode("A<|eot_id|>", true);
  EXPECT_EQ(ids, (std::vector<int32_t>{bos, *t.token_id("A"), eot}));
  EXPECT_EQ(t.decode(ids, false), "<|begin_of_text|>A<|eot_id|>");
  EXPECT_EQ(t.decode(ids, true), "A");
}

TEST(ByteLevelTokenizer, RoundTripsEveryLineAndInvalidUtf8BecomesReplacement) {
  const Tokenizer t = Tokenizer::load(fixture_dir("byte_level"));
  for (const std::string& line : corpus_lines())
    EXPECT_EQ(t.decode(t.encode(line, false), false), line);
  EXPECT_EQ(t.encode("a\xFF", false), t.encode("a\xEF\xBF\xBD", false));
  // A byte token alone is not valid UTF-8: decode gives U+FFFD, not the raw byte.
  const ByteLevelMap& m = ByteLevelMap::get();
  const int32_t f0 = *t.token_id(m.encode(0xF0));
  EXPECT_EQ(t.decode(std::vector<int32_t>{f0}, false), "\xEF\xBF\xBD");
}

TEST(ByteFallbackTokenizer, MetaspaceAndByteFallback) {
  const Tokenizer t = Tokenizer::load(fixture_dir("byte_fallback"));
  EXPECT_EQ(t.vocab_size(), 1024);  // the tiny model shape's vocabulary
  EXPECT_EQ(t.bos_token_id(), 1);
  EXPECT_EQ(t.eos_token_ids(), std::vector<int32_t>{2});
  // U+13000 is not in the fixture's vocabulary: "▁" and its four UTF-8 bytes F0 93 80 80.
  const std::vector<int32_t> expect{*t.token_id("\xE2\x96\x81"), *t.token_id("<0xF0>"),
                                    *t.token_id("<0x93>"), *t.token_id("<0x80>"),
                                    *t.token_id("<0x80>")};
  EXPECT_EQ(t.encode("\xF0\x93\x80\x80", false), expect);
  EXPECT_EQ(t.decode(expect, false), "\xF0\x93\x80\x80");  // Strip drops the leading space
  // An incomplete byte run decodes to one U+FFFD per byte (ByteFallback), not one per run.
  EXPECT_EQ(t.decode(std::vector<int32_t>(expect.begin() + 1, expect.begin() + 3), false),
            "\xEF\xBF\xBD\xEF\xBF\xBD");
  const auto with_bos = t.encode("Hello", true);
  EXPECT_EQ(with_bos.front(), 1);
  EXPECT_EQ(t.decode(with_bos, true), "Hello");
  for (const std::string& line : corpus_lines())
    if (line.find('<') == std::string::npos)
      EXPECT_EQ(t.decode(t.encode(line, false), false), line);
}

TEST(TokenizerErrors, NameTheFieldAndTheComponent) {
  Error e = load_error([](nlohmann::json& j) { j["model"]["type"] = "WordPiece"; });
  EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  EXPECT_EQ(e.argument(), "tokenizer.json: model.type");
  EXPECT_NE(std::string(e.what()).find("WordPiece"), std::string::npos);

  e = load_error([](nlohmann::json& j) { j["normalizer"] = {{"type", "NFKC"}}; });
  EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  EXPECT_EQ(e.argument(), "tokenizer.json: normalizer");
  EXPECT_NE(std::string(e.what()).find("NFKC"), std::string::npos);

  e = load_error(
      [](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Contiguous"; });
  EXPECT_EQ(e.argument(), "tokenizer.json: pre_tokenizer.pretokenizers[0].behavior");

  e = load_error([](nlohmann::json& j) { j["model"]["merges"][3] = "nonexistent tokens"; });
  EXPECT_EQ(e.argument(), "tokenizer.json: model.merges");
  EXPECT_NE(std::string(e.what()).find("entry 3"), std::string::npos);

  e = load_error([](nlohmann::json& j) {
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  });
  EXPECT_EQ(e.argument(), "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern");

  try {
    Tokenizer::load("/nonexistent/model");
    ADD_FAILURE();
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("'/nonexistent/model' does not exist"),
              std::string::npos);
  }
  const Tokenizer t = Tokenizer::load(fixture_dir("byte_level"));
  EXPECT_THROW(t.decode(std::vector<int32_t>{t.vocab_size()}, false), Error);
  EXPECT_THROW(t.decode(std::vector<int32_t>{-1}, false), Error);
}

TEST(CheckpointTokenizer, TinyGetsTheFixtureLargerShapesAPaddedVocabulary) {
  const std::string dir = ::testing::TempDir() + "/ckpt_tokenizer";
  std::filesystem::create_directories(dir);
  write_checkpoint_tokenizer(dir, 1024);
  const auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  EXPECT_EQ(read(dir + "/tokenizer.json"), fixture_json("byte_fallback"));  // embedded verbatim
  EXPECT_EQ(read(dir + "/tokenizer_config.json"),
            read(fixture_dir("byte_fallback") + "/tokenizer_config.json"));
  const Tokenizer tiny = Tokenizer::load(dir);
  const Tokenizer fixture = Tokenizer::load(fixture_dir("byte_fallback"));
  EXPECT_EQ(tiny.vocab_size(), 1024);
  EXPECT_EQ(tiny.encode("Hello, world", true), fixture.encode("Hello, world", true));
  EXPECT_EQ(ChatTemplate::load(dir).render({{"user", "Hi"}}, true), "<s>[INST] Hi [/INST]");

  write_checkpoint_tokenizer(dir, 32000);  // mistral-7b's vocab_size
  const Tokenizer big = Tokenizer::load(dir);
  EXPECT_EQ(big.vocab_size(), 32000);
  EXPECT_EQ(big.encode("Hello, world", true), fixture.encode("Hello, world", true));
  EXPECT_EQ(big.decode(std::vector<int32_t>{31999}, false), "<|unused_30975|>");
  EXPECT_THROW(write_checkpoint_tokenizer(dir, 1000), Error);
}

// The directory `flashserve make-checkpoint --shape tiny` wrote (ctest tokenizer_tiny_checkpoint):
// its tokenizer's vocabulary, BOS and EOS are those of its config.json.
TEST(CheckpointDir, TokenizerMatchesTheModelConfig) {
  const char* dir = std::getenv("FLASHSERVE_TINY_CHECKPOINT");
  if (!dir) GTEST_SKIP() << "skipped: FLASHSERVE_TINY_CHECKPOINT not set (ctest sets it)";
  std::ifstream in(std::string(dir) + "/config.json");
  const auto config = nlohmann::json::parse(in);
  const Tokenizer t = Tokenizer::load(dir);
  EXPECT_EQ(t.vocab_size(), config.at("vocab_size").get<int32_t>());
  EXPECT_EQ(t.bos_token_id(), config.at("bos_token_id").get<int32_t>());
  EXPECT_EQ(t.eos_token_ids(), std::vector<int32_t>{config.at("eos_token_id").get<int32_t>()});
  EXPECT_EQ(ChatTemplate::load(dir).render({{"user", "Hi"}}, true), "<s>[INST] Hi [/INST]");
}

}  // namespace
}  // namespace flashserve::tokenizer
