// What the server needs from a tokenizer: prompts to ids, generated ids to streamed text, chat
// messages to a prompt. The server holds a TextCodec only when the model directory has a tokenizer;
// without one it serves token-id prompts and answers with token ids (text prompts are refused).
// Kept as an interface so the HTTP layer does not depend on how tokenizers are built, and so the
// tests can stream text through a codec whose output they know.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flashserve::server {

struct ChatMessage {
  std::string role;  // system, developer, user, assistant, tool
  std::string content;
  std::string tool_calls_json;  // an assistant's tool_calls, arguments as objects; "": none
  std::string tool_call_id;     // a tool's message: the call it answers
};

// The text of one request's generated tokens, in order. One per request, one thread.
class TextStream {
 public:
  virtual ~TextStream() = default;
  // The text that became final with `token` (valid UTF-8; may be empty mid-character).
  virtual std::string push(int32_t token) = 0;
  // Whatever is held back, at the end.
  virtual std::string flush() = 0;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // The prompt's ids, with the special tokens the tokenizer adds (BOS); nullopt when there are
  // more than max_ids (Tokenizer::encode_within: found without encoding all of a long prompt).
  virtual std::optional<std::vector<int32_t>> encode(std::string_view text,
                                                     size_t max_ids) const = 0;
  // A detokeniser for the tokens generated after `prompt`; special tokens have no text when
  // `skip_special_tokens` (vLLM's default).
  virtual std::unique_ptr<TextStream> stream(std::span<const int32_t> prompt,
                                             bool skip_special_tokens = true) const = 0;
  // The text of `ids` (/detokenize, echo of a token-id prompt).
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;
  // The chat template applied to `messages` with the generation prompt and the request's tools
  // (`tools_json`: a JSON array, the template's `tools`; "": none); throws Error naming
  // "messages" for what the template rejects, or kUnsupported when there is no template.
  virtual std::string render_chat(const std::vector<ChatMessage>& messages,
                                  const std::string& tools_json) const = 0;
  // A rendered chat prompt's ids: the template writes BOS itself, so none is added (as Hugging
  // Face's apply_chat_template(tokenize=True) does).
  virtual std::optional<std::vector<int32_t>> encode_rendered(std::string_view rendered,
                                                              size_t max_ids) const = 0;
  // Tokens that end generation besides the model's config.json eos (a chat model's end-of-turn
  // token, say); they stop a request unless it sets ignore_eos.
  virtual std::vector<int32_t> eos_token_ids() const { return {}; }
  // The bytes one token adds to a text (maybe part of a character): logprobs' `bytes`, and their
  // text (invalid UTF-8 as U+FFFD) its `token`.
  virtual std::string token_bytes(int32_t id) const = 0;
  // Whether `id` is a special (control) token: structured output never allows one.
  virtual bool is_special(int32_t /*id*/) const { return false; }
  // 1 + the largest id the tokenizer knows (0: unknown; structured output needs it).
  virtual int32_t vocab_size() const { return 0; }
};

}  // namespace flashserve::server
