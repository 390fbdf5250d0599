#include "server/tokenizer_codec.h"

namespace flashserve::server {

// Until the tokenizer (src/tokenizer) is merged, every model is served by token ids.
std::unique_ptr<TextCodec> load_text_codec(const std::string&) {
  return nullptr;
}

}  // namespace flashserve::server
