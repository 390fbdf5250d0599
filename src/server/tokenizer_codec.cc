#include "server/tokenizer_codec.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "flashserve/error.h"
#include "tokenizer/tokenizer.h"

namespace flashserve::server {

namespace {

namespace tk = flashserve::tokenizer;

class DecoderStream final : public TextStream {
 public:
  DecoderStream(const tk::Tokenizer& t, std::span<const int32_t> context, bool skip_special)
      : decoder_(t, context, skip_special), vocab_(t.vocab_size()) {}
  // A model's vocabulary is often padded past its tokenizer's (Qwen2: 151936 rows, 151665 ids):
  // an id the tokenizer lacks has no text (it is in token_ids; its logprobs entry says
  // token_id:N), as in vLLM, instead of failing the request mid-stream.
  std::string push(int32_t token) override {
    if (token < 0 || token >= vocab_) return {};
    return decoder_.push(token);
  }
  std::string flush() override { return decoder_.flush(); }

 private:
  tk::IncrementalDecoder decoder_;
  int32_t vocab_;
};

class TokenizerCodec final : public TextCodec {
 public:
  TokenizerCodec(tk::Tokenizer t, std::optional<tk::ChatTemplate> chat, std::string chat_error)
      : tokenizer_(std::move(t)), chat_(std::move(chat)), chat_error_(std::move(chat_error)) {}

  std::optional<std::vector<int32_t>> encode(std::string_view text, size_t max_ids) const override {
    return tokenizer_.encode_within(text, /*add_special_tokens=*/true, max_ids);
  }
  std::unique_ptr<TextStream> stream(std::span<const int32_t> prompt,
                                     bool skip_special_tokens) const override {
    // A few prompt tokens are enough context for the first token's leading-space rule.
    const size_t keep = std::min<size_t>(prompt.size(), 8);
    return std::make_unique<DecoderStream>(tokenizer_, prompt.last(keep), skip_special_tokens);
  }
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    return tokenizer_.decode(ids, skip_special_tokens);
  }
  std::string render_chat(const std::vector<ChatMessage>& messages,
                          const std::string& tools_json) const override {
    if (!chat_)
      throw Error(ErrorKind::kUnsupported, "messages",
                  "this model has no usable chat template (" + chat_error_ +
                      "); start the server with --chat-template FILE");
    std::vector<tk::ChatMessage> m;
    for (const ChatMessage& x : messages)
      m.push_back({x.role, x.content, x.tool_calls_json, x.tool_call_id});
    return chat_->render(m, /*add_generation_prompt=*/true, tools_json);
  }
  std::optional<std::vector<int32_t>> encode_rendered(std::string_view rendered,
                                                      size_t max_ids) const override {
    return tokenizer_.encode_within(rendered, /*add_special_tokens=*/false, max_ids);
  }
  std::vector<int32_t> eos_token_ids() const override { return tokenizer_.eos_token_ids(); }
  std::string token_bytes(int32_t id) const override { return tokenizer_.token_bytes(id); }
  bool is_special(int32_t id) const override { return tokenizer_.is_special(id); }
  int32_t vocab_size() const override { return tokenizer_.vocab_size(); }

 private:
  tk::Tokenizer tokenizer_;
  std::optional<tk::ChatTemplate> chat_;
  std::string chat_error_;
};

}  // namespace

std::unique_ptr<TextCodec> load_text_codec(const std::string& model_dir,
                                           const std::string& chat_template,
                                           int64_t model_vocab_size) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return nullptr;
  tk::Tokenizer t = tk::Tokenizer::load(model_dir);
  if (model_vocab_size > 0 && t.vocab_size() > model_vocab_size)
    throw Error(ErrorKind::kInvalidArgument, path.string(),
                "has token ids up to " + std::to_string(t.vocab_size() - 1) +
                    ", beyond the model's vocab_size " + std::to_string(model_vocab_size) +
                    " (config.json): a tokenizer of another model?");
  std::optional<tk::ChatTemplate> chat;
  std::string why;
  if (!chat_template.empty()) {
    chat = tk::ChatTemplate::from_string(chat_template, t.bos_token(), t.eos_token());
  } else {
    try {
      chat = tk::ChatTemplate::load(model_dir);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  return std::make_unique<TokenizerCodec>(std::move(t), std::move(chat), std::move(why));
}

}  // namespace flashserve::server
