// The tokenizer of a Hugging Face model directory (tokenizer.json), its streaming detokeniser and
// its chat template (tokenizer_config.json). This header is the contract the HTTP server calls.
//
// Supported tokenizer.json models: BPE, either byte-level (GPT-2 / Llama 3 / Qwen2: a ByteLevel
// pre-tokenizer, optionally after a Split by the file's regex) or with byte fallback (Llama 2 /
// Mistral: a Metaspace or Prepend+Replace normalizer, `<0xXX>` tokens, the ByteFallback / Fuse /
// Strip decoders). Added tokens are split out of the text before the model; TemplateProcessing
// adds BOS where the file says so. Anything else throws Error(kUnsupported) naming the component.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flashserve::tokenizer {

class TokenizerImpl;

// Immutable once loaded: its const methods may be called from any number of threads at once.
class Tokenizer {
 public:
  // `path` is a model directory (its tokenizer.json and, when present, tokenizer_config.json for
  // the BOS/EOS names) or a tokenizer.json file. Throws Error naming the file and the field.
  static Tokenizer load(const std::string& path);
  // The same from the text of a tokenizer.json (tests, fuzzing); `config_json` may be empty.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {});

  // Any bytes are accepted: invalid UTF-8 is encoded as U+FFFD, as Hugging Face's tokenizers do
  // after the lossy conversion Python and JavaScript make of such input.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // encode()'s ids when there are at most max_ids of them; otherwise nullopt, found as soon as
  // it is certain: the work stays in proportion to max_ids and the text's length, not to the
  // cost of encoding all of a long text (seconds for a few MB that are one BPE word).
  std::optional<std::vector<int32_t>> encode_within(std::string_view text, bool add_special_tokens,
                                                    size_t max_ids) const;
  // Ids outside [0, vocab_size()) throw Error(kInvalidArgument, "token_ids"). The result is
  // always valid UTF-8 (incomplete byte sequences become U+FFFD).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
  // The bytes token `id` adds to a text after other tokens (" hello" for "▁hello"; one raw byte
  // for "<0xE4>" or a byte-level byte token, so possibly not UTF-8): the logprobs API's `bytes`.
  // Throws as decode() does.
  std::string token_bytes(int32_t id) const;

  int32_t vocab_size() const;  // 1 + the largest id of the model and the added tokens
  std::optional<int32_t> token_id(std::string_view token) const;
  std::optional<std::string> token(int32_t id) const;
  bool is_special(int32_t id) const;
  // EOS ids: tokenizer_config.json's eos_token, else the special tokens named like one
  // (</s>, <|endoftext|>, <|eot_id|>, <|im_end|>, <|end_of_text|>) when present.
  const std::vector<int32_t>& eos_token_ids() const;
  std::optional<int32_t> bos_token_id() const;
  // The token texts the chat template refers to as bos_token / eos_token ("" when none).
  const std::string& bos_token() const;
  const std::string& eos_token() const;

  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

 private:
  friend class IncrementalDecoder;
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

// Streams the text of generated tokens. Every chunk is valid UTF-8 and the concatenation of all
// chunks plus flush() equals decode(prompt_tail + generated) minus decode(prompt_tail), so the
// Llama 2 leading-space rule and byte-fallback characters spanning several tokens come out right.
// One exception: Hugging Face's ByteFallback decoder replaces a whole run of byte tokens by
// U+FFFDs when any byte of it is invalid; a stream has already shown the characters completed
// before the invalid byte, so there the stream shows them where decode() shows U+FFFD.
// The tokenizer must outlive the decoder. Not thread-safe (one per request).
class IncrementalDecoder {
 public:
  // `context`: the last few prompt ids (the decoder keeps at most a handful), so the first
  // generated token is decoded as it reads after the prompt, not as the start of a text.
  IncrementalDecoder(const Tokenizer& tokenizer, std::span<const int32_t> context,
                     bool skip_special_tokens = true);
  // The text that became final with `token` (possibly empty while a character is incomplete).
  std::string push(int32_t token);
  // What is still held back (an incomplete character becomes U+FFFD).
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // the context and the tokens not yet fully emitted
  size_t prefix_offset_ = 0;  // ids_[prefix_offset_, read_offset_) were emitted already
  size_t read_offset_ = 0;
};

struct ChatMessage {
  std::string role;
  std::string content;
  std::string tool_calls_json;  // the message's tool_calls as a JSON array; "": none
  std::string tool_call_id;     // a tool's message: the call it answers; "": none
};

// A chat template in the Jinja subset documented in chat_template.h (for/if/elif/else, set,
// variables, indexing, attributes, `+` and `~`, comparisons, and/or/not, in, filters trim /
// length / upper / lower / tojson / ..., loop.index0/index/first/last/length,
// raise_exception). A template outside the subset throws Error(kUnsupported, "chat_template")
// saying so and pointing at `--chat-template FILE`.
// Immutable and cheap to copy by move; render() may be called from several threads at once.
class ChatTemplate {
 public:
  // tokenizer_config.json's chat_template (a string, or the list form's "default" entry) and
  // its bos_token / eos_token. Throws when the directory has none.
  static ChatTemplate load(const std::string& model_dir);
  // A template file given with --chat-template; bos/eos are those of the model's tokenizer.
  static ChatTemplate from_file(const std::string& path, std::string bos_token = {},
                                std::string eos_token = {});
  static ChatTemplate from_string(std::string source, std::string bos_token = {},
                                  std::string eos_token = {});

  // Throws Error(kInvalidArgument, "messages") for what the template rejects (raise_exception).
  // `tools_json`: the request's tools, a JSON array passed as the template's `tools` (as
  // transformers' apply_chat_template(tools=...) does); "": none (`tools` is then undefined).
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& tools_json = {}) const;

  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

 private:
  struct Program;
  explicit ChatTemplate(std::shared_ptr<const Program> program);
  std::shared_ptr<const Program> program_;
};

}  // namespace flashserve::tokenizer
