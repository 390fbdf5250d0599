// The tokenizer of a model directory against the model's vocabulary (config.json's vocab_size):
// a tokenizer with ids beyond it is refused when the server loads (it encodes prompts the model
// has no embedding for, and its end-of-sequence ids would be refused as stop tokens on every
// request); a smaller one is normal (embeddings padded to a multiple of 128, as Qwen2.5's are) and
// the ids it lacks stream as no text, as transformers decodes them, instead of failing mid-stream.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flashserve/error.h"
#include "server/tokenizer_codec.h"
#include "tokenizer/tokenizer.h"

namespace fsv = flashserve::server;

namespace {

const std::string kDir = std::string(FLASHSERVE_TOKENIZER_FIXTURES) + "/byte_level";

TEST(TokenizerCodec, ATokenizerLargerThanTheModelIsRefusedNamingBoth) {
  const int32_t vocab = flashserve::tokenizer::Tokenizer::load(kDir).vocab_size();
  try {
    fsv::load_text_codec(kDir, {}, vocab - 1);
    ADD_FAILURE() << "accepted a tokenizer with more ids than the model";
  } catch (const flashserve::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(kDir + "/tokenizer.json"), std::string::npos) << what;
    EXPECT_NE(what.find("vocab_size " + std::to_string(vocab - 1)), std::string::npos) << what;
  }
  EXPECT_NE(fsv::load_text_codec(kDir, {}, vocab), nullptr);
  EXPECT_NE(fsv::load_text_codec(kDir), nullptr);  // 0: not checked
}

TEST(TokenizerCodec, IdsOfAPaddedVocabularyStreamAsNoText) {
  const auto tok = flashserve::tokenizer::Tokenizer::load(kDir);
  const int32_t vocab = tok.vocab_size();
  const auto codec = fsv::load_text_codec(kDir, {}, vocab + 128);
  ASSERT_NE(codec, nullptr);
  const std::vector<int32_t> text = tok.encode("Hello, wörld!", false);
  ASSERT_GE(text.size(), 2u);
  auto stream = codec->stream({});
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    out += stream->push(text[i]);
    out += stream->push(vocab + static_cast<int32_t>(i));  // was: Error "outside the vocabulary"
  }
  out += stream->flush();
  EXPECT_EQ(out, tok.decode(text, false));
}

}  // namespace
