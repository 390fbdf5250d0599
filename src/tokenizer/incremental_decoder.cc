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
  // Wait while the text is incomplete, or does not yet extend the window's start (a decoder
  // may rewrite the join of the two, e.g. a byte run that is only valid once complete).
  if (ends_incomplete(text) || text.size() <= prefix.size() ||
      text.compare(0, prefix.size(), prefix) != 0)
    return {};
  std::string out = text.substr(prefix.size());
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
  if (text.size() <= prefix.size() || text.compare(0, prefix.size(), prefix) != 0) return {};
  return text.substr(prefix.size());
}

}  // namespace flashserve::tokenizer
