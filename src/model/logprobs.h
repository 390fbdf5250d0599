// Log-probabilities of sampled tokens, for the OpenAI API's `logprobs`: the sampled token's and the
// most likely tokens' at the same position. Computed only for the requests that ask for them: the
// runner hands over just their rows of logits (ModelRunner::logits_rows), so a batch where no
// request asks pays nothing.
//
// Which distribution: the model's own, log_softmax of the raw logits, before temperature, top-k
// and top-p. That is vLLM's default (logprobs_mode "raw_logprobs") and what OpenAI's API returns;
// a token drawn at temperature 1.3 or from a top-p nucleus still reports its log-probability
// under the model.
#pragma once

#include <cstdint>
#include <vector>

namespace flashserve::model {

// The most alternatives a request may ask for (OpenAI's chat top_logprobs limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct SampledLogprobs {
  TokenLogprob sampled;           // the token drawn at this position
  std::vector<TokenLogprob> top;  // the top_n most likely, by logprob descending, ties to lower id
};

// From one row of logits [vocab], in double (max-subtracted log-sum-exp), rounded to float at the
// end. NaN logits give NaN log-probabilities, as PyTorch's log_softmax does. Throws
// Error(kInvalidArgument) for a token outside [0, vocab) or top_n outside [0, kMaxTopLogprobs].
SampledLogprobs token_logprobs(const float* logits, int64_t vocab, int32_t token, int32_t top_n);

}  // namespace flashserve::model
