// The tokenizer of a model directory against the model's vocabulary (config.json's vocab_size):
// a tokenizer with ids beyond it is refused when the server loads (it encodes prompts the model
// has no embedding for, and its end-of-sequence ids would be refused as stop tokens on every
// request); a smaller one is normal (embeddings padded to a multiple of 128, as Qwen2.5's are).
#include <gtest/gtest.h>

#include <string>

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

}  // namespace
