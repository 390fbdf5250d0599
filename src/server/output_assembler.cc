#include "server/output_assembler.h"

#include <utility>

#include "tokenizer/utf8.h"

namespace flashserve::server {

OutputAssembler::OutputAssembler(std::unique_ptr<TextStream> text, std::vector<std::string> stops,
                                 bool include_stop)
    : text_(std::move(text)), stops_(std::move(stops), include_stop) {}

void OutputAssembler::take(const std::vector<int32_t>& tokens, std::vector<TokenLogprobs> logprobs,
                           serve::FinishReason finish, Piece& p) {
  if (done()) return;
  const bool ends_on_token =
      finish == serve::FinishReason::kEos || finish == serve::FinishReason::kStop;
  for (size_t i = 0; i < tokens.size() && !done(); ++i) {
    p.token_ids.push_back(tokens[i]);
    ++completion_tokens_;
    // The eos or stop token ends the output: it is in token_ids (as in vLLM), not in the text
    // (as in OpenAI), so it has no logprobs entry either.
    if (ends_on_token && i + 1 == tokens.size()) break;
    // The token's text begins where the raw text stands now (a token that ends part-way through
    // a character gives its text with a later token, and begins here all the same).
    const bool entry = i < logprobs.size();
    if (entry) held_.push_back({raw_bytes_, std::move(logprobs[i])});
    if (!text_) continue;
    const std::string raw = text_->push(tokens[i]);
    if (entry && pending_ && !raw.empty()) {
      // Text the detokeniser held for earlier tokens (an invalid byte shown as U+FFFD once the
      // next token proves it so) came out with this token's: its own text is the end of it.
      const std::string own = tokenizer::utf8::lossy(held_.back().entry.sampled.bytes);
      if (!own.empty() && own.size() < raw.size() && raw.ends_with(own))
        held_.back().start = raw_bytes_ + static_cast<int64_t>(raw.size() - own.size());
    }
    pending_ = raw.empty();
    feed(raw, p);
  }
  if (done()) return;
  if (finish == serve::FinishReason::kNone) return release(p, false);
  if (text_) {
    feed(text_->flush(), p);
    if (done()) return;
    const std::string rest = stops_.flush();
    released_bytes_ += static_cast<int64_t>(rest.size());
    p.text += rest;
  }
  end(finish == serve::FinishReason::kLength  ? "length"
      : finish == serve::FinishReason::kAbort ? "abort"
                                              : "stop",
      p);
}

void OutputAssembler::feed(const std::string& raw, Piece& p) {
  raw_bytes_ += static_cast<int64_t>(raw.size());
  const std::string out = stops_.feed(raw);
  released_bytes_ += static_cast<int64_t>(out.size());
  p.text += out;
  if (stops_.stopped()) end("stop", p);
}

void OutputAssembler::release(Piece& p, bool all) {
  // Entries go out with their text: those whose token begins inside the text sent so far (all of
  // them without a tokenizer, where there is no text to wait for).
  size_t n = 0;
  while (n < held_.size() && (all || !text_ || held_[n].start < released_bytes_)) ++n;
  for (size_t i = 0; i < n; ++i) p.logprobs.push_back(std::move(held_[i].entry));
  held_.erase(held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(n));
}

void OutputAssembler::end(const char* reason, Piece& p) {
  // After a stop string, only the tokens that begin before it keep their entries; released_bytes_
  // is where the text was cut.
  release(p, !stops_.stopped());
  held_.clear();
  finish_reason_ = reason;
  p.finish_reason = reason;
}

}  // namespace flashserve::server
