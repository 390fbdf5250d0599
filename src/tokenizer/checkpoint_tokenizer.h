// The tokenizer `flashserve make-checkpoint` writes beside random weights, so a random checkpoint
// is served like a real one: the byte-fallback BPE fixture (tests/tokenizer/fixtures/
// byte_fallback, Llama 2 / Mistral style, trained by our train.mjs) with its Mistral [INST] chat
// template. It has exactly 1024 tokens, the `tiny` shape's vocab_size, with <unk> <s> </s> at
// 0 1 2 as tiny's config says. For a larger vocab_size the vocabulary is padded with tokens
// "<|unused_N|>" (never produced by encode, decodable), so every id the model can sample decodes.
#pragma once

#include <cstdint>
#include <string>

namespace flashserve::tokenizer {

// Writes DIR/tokenizer.json and DIR/tokenizer_config.json (DIR must exist). Throws
// Error(kInvalidArgument, "vocab_size") below 1024.
void write_checkpoint_tokenizer(const std::string& dir, int32_t vocab_size);

}  // namespace flashserve::tokenizer
