// The tokenizer on the checked-in fixtures, against expectations written by hand from the
// definitions (GPT-2's byte map, UTF-8 of known characters, the fixtures' own special tokens),
// and its errors. The comparison with Hugging Face's implementation is hf_reference_test.cc.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "flashserve/error.h"
#include "support/temp_dirs.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/checkpoint_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
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

// encode_within(text, special, max_ids) is the whole encoding when it has at most max_ids ids and
// nullopt otherwise, for every fixture (each pre-tokenizer kind, stopped in the middle of its
// pieces or, for one long word, before merging it) and every limit around each text's length.
TEST(TokenizerWithin, IsTheWholeEncodingOrNothing) {
  std::ifstream in(fixture_dir("compare_corpus.json"));
  const auto texts = nlohmann::json::parse(in).get<std::vector<std::string>>();
  std::string all;
  for (const std::string& t : texts) all += t + "\n";
  int checked = 0, refused = 0;
  for (const char* kind : {"byte_level", "byte_fallback", "byte_fallback_nfd", "byte_fallback_nfkc",
                           "byte_level_folded", "qwen2_nfc"}) {
    const Tokenizer tok = Tokenizer::load(fixture_dir(kind));
    for (const std::string& text : texts)
      for (bool special : {false, true}) {
        const std::vector<int32_t> whole = tok.encode(text, special);
        for (size_t k : {size_t{0}, size_t{1}, whole.size() / 2, whole.size() - 1, whole.size(),
                         whole.size() + 1, SIZE_MAX}) {
          if (k > whole.size() + 1 && k != SIZE_MAX) continue;  // whole.size() - 1 wrapped
          const auto got = tok.encode_within(text, special, k);
          if (whole.size() <= k) {
            ASSERT_TRUE(got) << kind << " max_ids " << k << " text " << nlohmann::json(text);
            ASSERT_EQ(*got, whole) << kind << " text " << nlohmann::json(utf8::lossy(text));
          } else {
            ASSERT_FALSE(got) << kind << " max_ids " << k << " text " << nlohmann::json(text);
            ++refused;
          }
          ++checked;
        }
      }
    // The corpus as one text, thousands of ids.
    const std::vector<int32_t> whole = tok.encode(all, true);
    ASSERT_GT(whole.size(), 2000u) << kind;
    for (size_t k : {size_t{7}, size_t{1000}, whole.size() - 1})
      EXPECT_FALSE(tok.encode_within(all, true, k)) << kind << " max_ids " << k;
    EXPECT_EQ(tok.encode_within(all, true, whole.size()), whole) << kind;
  }
  EXPECT_GT(checked, 5000);
  EXPECT_GT(refused, 2000);
}

// 12 MiB prompts against a small limit: two million words (stopped after a few), a 4 MiB word
// (refused from its length before merging), for a byte-level and a sentencepiece-style tokenizer
// (no pre-tokenizer: the whole prompt is one word). Encoding any of them whole takes seconds.
TEST(TokenizerWithin, HugeTextsAreRefusedQuickly) {
  std::string words;
  while (words.size() < (8u << 20)) words += "the cat sat on the mat. ";
  const std::string word(4u << 20, 'a');
  for (const char* kind : {"byte_level", "byte_fallback"})
    for (const std::string& text : {words + word, word + words}) {
      const Tokenizer tok = Tokenizer::load(fixture_dir(kind));
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_FALSE(tok.encode_within(text, true, 4096)) << kind;
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%s, %s, max_ids 4096: refused in %.1f ms\n", kind,
                  text[0] == 't' ? "2M words then a 4 MiB word" : "a 4 MiB word then 2M words", ms);
    }
}

TEST(TokenizerErrors, NameTheFieldAndTheComponent) {
  Error e = load_error([](nlohmann::json& j) { j["model"]["type"] = "WordPiece"; });
  EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  EXPECT_EQ(e.argument(), "tokenizer.json: model.type");
  EXPECT_NE(std::string(e.what()).find("WordPiece"), std::string::npos);

  // SentencePiece's Precompiled charsmap is a normalizer we do not have: refused by name, also
  // inside a Sequence, as are pre-tokenizers and decoders we do not have.
  e = load_error([](nlohmann::json& j) { j["normalizer"] = {{"type", "Precompiled"}}; });
  EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  EXPECT_EQ(e.argument(), "tokenizer.json: normalizer");
  EXPECT_NE(std::string(e.what()).find("Precompiled"), std::string::npos);
  e = load_error([](nlohmann::json& j) {
    j["normalizer"] = {{"type", "Sequence"},
                       {"normalizers", {{{"type", "NFC"}}, {{"type", "BertNormalizer"}}}}};
  });
  EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  EXPECT_NE(e.argument().find("tokenizer.json: normalizer"), std::string::npos) << e.argument();
  EXPECT_NE(std::string(e.what()).find("BertNormalizer"), std::string::npos);
  e = load_error([](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; });
  EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  EXPECT_EQ(e.argument(), "tokenizer.json: pre_tokenizer");
  EXPECT_NE(std::string(e.what()).find("Whitespace"), std::string::npos);
  e = load_error([](nlohmann::json& j) { j["decoder"] = {{"type", "WordPiece"}}; });
  EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  EXPECT_EQ(e.argument(), "tokenizer.json: decoder");
  EXPECT_NE(std::string(e.what()).find("WordPiece"), std::string::npos);

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

// A token's bytes as it continues a text (the logprobs API's `bytes`): the leading-space rules of
// a decode's start do not apply, a byte-fallback token is its raw byte, special tokens their text.
TEST(TokenBytes, AreWhatTheTokenAddsAfterOthers) {
  const Tokenizer fallback = Tokenizer::load(fixture_dir("byte_fallback"));
  EXPECT_EQ(fallback.decode(std::vector<int32_t>{374}, false), "the");  // Strip of the first space
  EXPECT_EQ(fallback.token_bytes(374), " the");                         // "▁the"
  EXPECT_EQ(fallback.token_bytes(362), " ");                            // "▁"
  EXPECT_EQ(fallback.token_bytes(231), "\xE4");                         // "<0xE4>", not U+FFFD
  EXPECT_EQ(fallback.token_bytes(2), "</s>");
  const Tokenizer level = Tokenizer::load(fixture_dir("byte_level"));
  EXPECT_EQ(level.token_bytes(264), " the");  // "Ġthe"
  EXPECT_EQ(level.token_bytes(535), "the");
  // Every token: the bytes, appended, rebuild the decode of a sequence (byte-level is lossless).
  std::vector<int32_t> ids = level.encode("Grüße, 世界! x = 42\n", false);
  std::string joined;
  for (int32_t id : ids) joined += level.token_bytes(id);
  EXPECT_EQ(joined, level.decode(ids, false));
  EXPECT_THROW(level.token_bytes(level.vocab_size()), Error);
}

// The Unicode operations against values written from the Unicode tables by hand.
TEST(UnicodeNormalizers, FormsByHand) {
  using unicode::Form, unicode::normalize;
  EXPECT_EQ(normalize("cafe\u0301", Form::kNFC), "caf\u00e9");
  EXPECT_EQ(normalize("caf\u00e9", Form::kNFD), "cafe\u0301");
  // Canonical reordering: dot below (ccc 220) before circumflex (ccc 230), then composition.
  EXPECT_EQ(normalize("a\u0302\u0323", Form::kNFC), "\u1ead");
  EXPECT_EQ(normalize("a\u0323\u0302", Form::kNFC), "\u1ead");
  EXPECT_EQ(normalize("a\u0302\u0323", Form::kNFD), "a\u0323\u0302");
  // Hangul: conjoining jamo compose algorithmically; compatibility jamo only under NFKC.
  EXPECT_EQ(normalize("\u1100\u1161\u11a8", Form::kNFC), "\uac01");
  EXPECT_EQ(normalize("\uac01", Form::kNFD), "\u1100\u1161\u11a8");
  EXPECT_EQ(normalize("\u3131", Form::kNFC), "\u3131");
  EXPECT_EQ(normalize("\u3131", Form::kNFKC), "\u1100");
  // Compatibility characters: ligatures, circled digits, full-width forms, super/subscripts.
  EXPECT_EQ(normalize("\ufb01\u2460\uff21\uff11\u3000\u00b2", Form::kNFKC), "fi1A1 2");
  EXPECT_EQ(normalize("\ufb01\u2460", Form::kNFC), "\ufb01\u2460");
  EXPECT_EQ(normalize("\u00bd", Form::kNFKD), "1\u20442");
  EXPECT_EQ(normalize("\u212b", Form::kNFC), "\u00c5");  // the Angstrom sign is a singleton
  EXPECT_EQ(normalize("", Form::kNFKC), "");
}

TEST(UnicodeNormalizers, LowercaseStripAndAccentsAsRustHasThem) {
  // Per code point, no context: a word-final capital sigma stays σ (Rust's char::to_lowercase,
  // which Hugging Face's Lowercase uses; JavaScript's toLowerCase would give ς).
  EXPECT_EQ(unicode::lowercase("\u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3"),
            "\u03bf\u03b4\u03c5\u03c3\u03c3\u03b5\u03c5\u03c3");
  EXPECT_EQ(unicode::lowercase("\u0130"), "i\u0307");  // full mapping: two code points
  EXPECT_EQ(unicode::lowercase("ABC \u00c9\u1e9e \uff21"), "abc \u00e9\u00df \uff41");
  // White_Space: U+0085 and U+3000 are, U+FEFF and U+200B are not.
  EXPECT_EQ(unicode::strip("\u0085\u3000 x y\t\ufeff\u200b \n", true, true), "x y\t\ufeff\u200b");
  EXPECT_EQ(unicode::strip("  x  ", true, false), "x  ");
  EXPECT_EQ(unicode::strip("  x  ", false, true), "  x");
  EXPECT_EQ(unicode::strip(" \t\n", true, false), "");
  EXPECT_EQ(unicode::strip_accents("e\u0301a\u0308\u0915\u093f"), "ea\u0915");  // Mn and Mc
}

// A Qwen2-shaped tokenizer.json (normalizer NFC) loads, and text in another form gives the ids
// of its NFC form; NFKC folds compatibility characters before the model sees them.
TEST(UnicodeNormalizers, TokenizersApplyThem) {
  const Tokenizer qwen2 = Tokenizer::load(fixture_dir("qwen2_nfc"));
  EXPECT_EQ(qwen2.encode("re\u0301sume\u0301 \u1100\u1161\u11a8", false),
            qwen2.encode("r\u00e9sum\u00e9 \uac01", false));
  EXPECT_NE(qwen2.encode("\ufb01", false), qwen2.encode("fi", false));
  const Tokenizer nfkc = Tokenizer::load(fixture_dir("byte_fallback_nfkc"));
  EXPECT_EQ(nfkc.encode("\ufb01nance \u2460 \uff21\uff22", false),
            nfkc.encode("finance 1 AB", false));
  const Tokenizer folded = Tokenizer::load(fixture_dir("byte_level_folded"));
  EXPECT_EQ(folded.encode("  Re\u0301SUM\u00c9\t", false), folded.encode("resume", false));
}

TEST(CheckpointTokenizer, TinyGetsTheFixtureLargerShapesAPaddedVocabulary) {
  const std::string dir =
      flashserve::testing::temp_dir("ckpt_tokenizer_" + std::to_string(::getpid()));
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
