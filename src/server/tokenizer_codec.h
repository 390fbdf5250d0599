// The TextCodec of a model directory: its tokenizer (tokenizer.json, src/tokenizer) and chat
// template (tokenizer_config.json, or a file given with --chat-template).
#pragma once

#include <memory>
#include <string>

#include "server/text_codec.h"

namespace flashserve::server {

// Null when the directory has no tokenizer.json (the server then serves token ids only). A
// template that cannot be loaded is not fatal: chat requests then get a 400 saying why, and
// completions still work. Throws Error when tokenizer.json or `chat_template_file` is malformed.
std::unique_ptr<TextCodec> load_text_codec(const std::string& model_dir,
                                           const std::string& chat_template_file = {});

}  // namespace flashserve::server
