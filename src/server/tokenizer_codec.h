// The TextCodec of a model directory: its tokenizer (tokenizer.json, src/tokenizer) and chat
// template (tokenizer_config.json, or the one given with --chat-template).
#pragma once

#include <memory>
#include <string>

#include "server/text_codec.h"

namespace flashserve::server {

// Null when the directory has no tokenizer.json (the server then serves token ids only). A
// template that cannot be loaded is not fatal: chat requests then get a 400 saying why, and
// completions still work. `chat_template`: a template's text (not a path) that replaces the
// directory's; "": the directory's. Throws Error when tokenizer.json or `chat_template` is
// malformed, and when the tokenizer has ids beyond `model_vocab_size` (config.json's vocab_size; 0:
// not checked): it would encode prompts the model has no embedding for, and its end-of-sequence ids
// would be refused as stop tokens on every request. A smaller tokenizer is normal (Qwen2.5 pads
// its embedding to a multiple of 128).
std::unique_ptr<TextCodec> load_text_codec(const std::string& model_dir,
                                           const std::string& chat_template = {},
                                           int64_t model_vocab_size = 0);

}  // namespace flashserve::server
