// Ours against Hugging Face's own implementation: hf_reference.sh runs @huggingface/tokenizers on
// the fixtures and the comparison corpus (js/reference.mjs) and points FLASHSERVE_HF_REFERENCE
// at its output; every text must give the same ids (with and without special tokens) and the
// same decodes, and every random id sequence the same decodes. Without that variable (a plain
// ctest run of this binary) the test is skipped and says why; the ctest hf_reference runs it.
#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_fixtures.h"

namespace flashserve::tokenizer {
namespace {

// The JavaScript ByteFallback decoder turns byte runs into text with TextDecoder, which drops a
// U+FEFF (BOM) at the start of each run; Hugging Face's Rust decoder (String::from_utf8) keeps it,
// and so do we. A decode that differs only by such BOMs is counted apart, not as a failure.
bool differs_only_by_bom(std::string ours, const std::string& theirs) {
  if (ours == theirs) return false;
  for (size_t k; (k = ours.find("\xEF\xBB\xBF")) != std::string::npos;) ours.erase(k, 3);
  return ours == theirs;
}

// `derived`: the fixture is one hf_reference.sh derived into the reference directory.
// The JavaScript ByteFallback decoder also turns an invalid run of byte tokens into text with
// TextDecoder (valid bytes kept, one U+FFFD per maximal invalid subsequence); the Rust one, and
// ours, give one U+FFFD per byte of such a run (tokenizers/src/decoders/byte_fallback.rs and its
// tests; our ByteFallbackTokenizer test). True when `ids` (less skipped specials) has such a run.
bool has_invalid_byte_run(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  std::string run;
  const auto invalid = [&] { return !run.empty() && !utf8::is_valid(run); };
  for (int32_t id : ids) {
    if (skip && tok.is_special(id)) continue;
    const std::string t = *tok.token(id);
    if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
      run += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
      continue;
    }
    if (invalid()) return true;
    run.clear();
  }
  return invalid();
}

void compare(const std::string& kind, bool derived = false) {
  const char* dir = std::getenv("FLASHSERVE_HF_REFERENCE");
  if (!dir) GTEST_SKIP() << "skipped: FLASHSERVE_HF_REFERENCE not set (ctest hf_reference sets it)";
  const std::string path = std::string(dir) + "/" + kind + ".jsonl";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  const Tokenizer tok =
      Tokenizer::load(derived ? std::string(dir) + "/" + kind : fixture_dir(kind));
  int texts = 0, id_sequences = 0, failures = 0, bom_only = 0, invalid_runs = 0;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    const auto with_special = j.contains("with_special")
                                  ? j["with_special"].get<std::vector<int32_t>>()
                                  : j["ids"].get<std::vector<int32_t>>();
    if (j["kind"] == "text") {
      const std::string text = j["text"];
      const auto ids = tok.encode(text, false);
      EXPECT_EQ(ids, j["ids"].get<std::vector<int32_t>>())
          << kind << " text: " << nlohmann::json(text);
      EXPECT_EQ(tok.encode(text, true), with_special) << kind << " text: " << nlohmann::json(text);
      failures +=
          ids != j["ids"].get<std::vector<int32_t>>() || tok.encode(text, true) != with_special;
      ++texts;
    } else {
      ++id_sequences;
    }
    for (bool skip : {false, true}) {
      const std::string ours = tok.decode(with_special, skip);
      const std::string theirs = j[skip ? "decoded_skip" : "decoded"].get<std::string>();
      if (differs_only_by_bom(ours, theirs)) {
        ++bom_only;
        continue;
      }
      if (ours != theirs && has_invalid_byte_run(tok, with_special, skip)) {
        ++invalid_runs;
        continue;
      }
      EXPECT_EQ(ours, theirs) << kind << " ids " << with_special.size() << " " << j["ids"].dump();
      failures += ours != theirs;
    }
  }
  EXPECT_GT(texts, 400);
  EXPECT_GT(id_sequences, 100);
  std::printf(
      "hf_reference %s: %d texts (ids + decodes) and %d id sequences (decodes) compared: "
      "%d differ; set apart: %d decodes by the JavaScript decoder's dropped BOM, %d with an "
      "invalid "
      "byte run (JavaScript keeps its valid bytes, Rust and we do not)\n",
      kind.c_str(), texts, id_sequences, failures, bom_only, invalid_runs);
}

TEST(HfReference, ByteLevel) {
  compare("byte_level");
}
TEST(HfReference, ByteFallback) {
  compare("byte_fallback");
}
TEST(HfReference, Metaspace) {
  compare("metaspace", true);
}
// The Unicode normalizers, on the comparison corpus and normalizer_corpus.json (decomposed
// accents, Hangul jamo, compatibility characters, case, edge whitespace).
TEST(HfReference, Qwen2Nfc) {
  compare("qwen2_nfc");
}
TEST(HfReference, ByteFallbackNfkc) {
  compare("byte_fallback_nfkc");
}
TEST(HfReference, ByteFallbackNfd) {
  compare("byte_fallback_nfd");
}
TEST(HfReference, FoldedNfkdStripAccentsLowercaseStrip) {
  compare("byte_level_folded");
}

}  // namespace
}  // namespace flashserve::tokenizer
