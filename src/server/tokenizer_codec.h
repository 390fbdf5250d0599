// The TextCodec of a model directory: its tokenizer (tokenizer.json) and chat template
// (tokenizer_config.json), or null when it has no tokenizer.json.
#pragma once

#include <memory>
#include <string>

#include "server/text_codec.h"

namespace flashserve::server {

std::unique_ptr<TextCodec> load_text_codec(const std::string& model_dir);

}  // namespace flashserve::server
