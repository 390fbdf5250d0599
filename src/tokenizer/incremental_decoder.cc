// Streaming detokenisation. Decoding token by token is wrong twice over: a character whose bytes
// span several tokens would come out broken, and decoders that look at the first token of a text
// (the Llama 2 Strip of the leading space) would drop a space before every token. So we decode a
// short window: the already-emitted tokens [prefix, read) give the text the window starts with,
// and what the new tokens add after it is emitted once it no longer ends in an incomplete
// character (which the lossy decode shows as U+FFFD). The window then slides forward.
#include <algorithm>

#include "flashserve/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace flashserve::tokenizer {
namespace {

bool ends_incomplete(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, utf8::kReplacement) == 0;
}

// How many context tokens we keep: enough for decoders that look back one token.
constexpr size_t kContext = 4;

// Where `text` goes on past `prefix`, in bytes: after as many characters as `prefix` has (as vLLM
// slices its strings). A decoder may rewrite the join of the two: byte fallback turns a run of
// byte tokens that is not UTF-8 into one U+FFFD per byte, so "D" (<0x44>, emitted) followed by a
// lone <0x83> decodes as two U+FFFD. What was emitted stays; what follows must still come out
// (waiting for `text` to start with `prefix` again waited forever: the rest of the completion
// was lost).
size_t past(const std::string& prefix, const std::string& text) {
  if (text.compare(0, prefix.size(), prefix) == 0) return prefix.size();
  size_t chars = 0;
  for (const char c : prefix) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  size_t seen = 0;
  for (size_t at = 0; at < text.size(); ++at)
    if ((static_cast<unsigned char>(text[at]) & 0xC0) != 0x80 && seen++ == chars) return at;
  return text.size();
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, std::span<const int32_t> context,
                                       bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {
  const size_t keep = std::min(context.size(), kContext);
  ids_.assign(context.end() - keep, context.end());
  prefix_offset_ = 0;
  read_offset_ = ids_.size();
}

std::string IncrementalDecoder::push(int32_t token) {
  if (token < 0 || token >= tokenizer_->vocab_size())
    throw Error(ErrorKind::kInvalidArgument, "token_ids",
                "id " + std::to_string(token) + " is outside the vocabulary");
  ids_.push_back(token);
  const std::span<const int32_t> all(ids_);
  const std::string prefix =
      tokenizer_->decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  const std::string text = tokenizer_->decode(all.subspan(prefix_offset_), skip_special_);
  // Wait while the text is incomplete, or does not yet go past the window's start.
  const size_t from = past(prefix, text);
  if (ends_incomplete(text) || from >= text.size()) return {};
  std::string out = text.substr(from);
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  // Keep the buffer short: tokens before the window are never decoded again.
  if (prefix_offset_ > 64) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_offset_));
    read_offset_ -= prefix_offset_;
    prefix_offset_ = 0;
  }
  return out;
}

std::string IncrementalDecoder::flush() {
  const std::span<const int32_t> all(ids_);
  const std::string prefix =
      tokenizer_->decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  const std::string text = tokenizer_->decode(all.subspan(prefix_offset_), skip_special_);
  prefix_offset_ = read_offset_ = ids_.size();
  return text.substr(std::min(past(prefix, text), text.size()));
}

}  // namespace flashserve::tokenizer
