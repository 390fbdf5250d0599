// One choice's output, assembled from the engine's tokens as they are read: the token ids, the
// text (through the detokeniser and the stop strings), the logprobs and the count of completion
// tokens, kept in step token by token, so that what a response returns is the same however the
// tokens were batched by the reads (streamed or not, a slow reader or a fast one).
//
// The contract (docs/server.md, "What a choice returns"):
//   - token_ids: the generated tokens up to the one that ended the request: the eos or stop token
//     (engine), or the token that completed a stop string. Tokens the engine produced after that
//     one (read in the same batch) are dropped, and not counted.
//   - completion_tokens (usage) = the number of token_ids.
//   - text: the tokens' text without the eos/stop token, cut before the stop string.
//   - logprobs: one entry per token of the text: the token_ids without the final eos/stop token
//     and without the tokens that lie wholly inside the stop string (a token that begins before
//     the cut keeps its entry). Streamed, an entry goes out with its token's text: entries of text
//     held back as a possible stop string are held back with it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "serve/sequence.h"
#include "server/openai_response.h"
#include "server/stop_strings.h"
#include "server/text_codec.h"

namespace flashserve::server {

class OutputAssembler {
 public:
  // `text` is null without a tokenizer (the output is then token ids only; no stop strings).
  // `include_stop`: the text keeps the stop string that ended it (and the logprobs its tokens).
  OutputAssembler(std::unique_ptr<TextStream> text, std::vector<std::string> stops,
                  bool include_stop = false);

  // Takes the tokens of one read (and, when the request asked, one logprobs entry per token) and
  // the stream's finish reason after that read (for the last token of the read); appends to `p`
  // what can be returned now. Once done(), later tokens are ignored.
  void take(const std::vector<int32_t>& tokens, std::vector<TokenLogprobs> logprobs,
            serve::FinishReason finish, Piece& p);

  // Ended: by the engine (finish given to take) or by a stop string.
  bool done() const { return finish_reason_ != nullptr; }
  // "stop" (eos, a stop token or string), "length" or "abort"; null while running.
  const char* finish_reason() const { return finish_reason_; }
  // A stop string ended the output (the engine's request is still running: close it).
  bool stopped_by_string() const { return stops_.stopped(); }
  // Tokens returned in token_ids so far.
  int64_t completion_tokens() const { return completion_tokens_; }

 private:
  struct Held {
    int64_t start = 0;  // where the token's text begins in the raw text (bytes)
    TokenLogprobs entry;
  };
  void feed(const std::string& raw, Piece& p);
  void release(Piece& p, bool all);
  void end(const char* reason, Piece& p);

  std::unique_ptr<TextStream> text_;
  StopStrings stops_;
  int64_t raw_bytes_ = 0;       // raw text the detokeniser gave so far
  int64_t released_bytes_ = 0;  // of which passed the stop strings (sent)
  bool pending_ = false;        // the last token's text is held by the detokeniser
  std::vector<Held> held_;      // logprobs entries whose text is not sent yet
  int64_t completion_tokens_ = 0;
  const char* finish_reason_ = nullptr;
};

}  // namespace flashserve::server
