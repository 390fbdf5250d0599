// What changes one row's logits before the sampling rule (model/sampling.h), in vLLM's order:
//   1. l += bias              OpenAI's logit_bias; -inf for a banned token (a stop token before
//                             min_tokens, a token a grammar does not allow)
//   2. a token of the prompt or the output:  l = l > 0 ? l / repetition_penalty
//                                                      : l * repetition_penalty
//   3. l -= frequency_penalty * (times in the output) + presence_penalty * (in the output ? 1 : 0)
// and, when `allowed` is given, every token outside it is -inf. Built on the host from the
// sequence's tokens (only the tokens it touches: a row of a request without penalties, biases or
// a grammar has none), applied by the CPU runner (apply_logits_adjust) and, the same arithmetic
// in float, by the CUDA runner's adjust kernel (model/cuda/logits_adjust.h) on a copy of the
// logits: the logprobs a request gets stay the model's own (vLLM's raw_logprobs).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "model/sampling.h"

namespace flashserve::model {

struct TokenAdjust {
  int32_t token = 0;
  float bias = 0.0f;        // step 1
  float repetition = 1.0f;  // step 2 (1: the token is in neither the prompt nor the output)
  float subtract = 0.0f;    // step 3
};

struct LogitsAdjust {
  std::vector<TokenAdjust> tokens;  // distinct, ascending
  // Bit t % 32 of word t / 32 is set for an allowed token t; empty: every token is allowed.
  std::vector<uint32_t> allowed;
  bool empty() const { return tokens.empty() && allowed.empty(); }
};

FLASHSERVE_HOST_DEVICE inline float adjusted_logit(float logit, const TokenAdjust& a) {
  float l = logit + a.bias;
  if (a.repetition != 1.0f) l = l > 0.0f ? l / a.repetition : l * a.repetition;
  return l - a.subtract;
}

FLASHSERVE_HOST_DEVICE inline bool token_allowed(const uint32_t* allowed, int64_t token) {
  return (allowed[token >> 5] >> (token & 31)) & 1u;
}

// The row's adjustments: params' logit_bias and penalties over `prompt` and `output` (the
// sequence's tokens so far), `banned` tokens at -inf, and `allowed` (empty: all) as given.
LogitsAdjust make_logits_adjust(const SamplingParams& params, std::span<const int32_t> prompt,
                                std::span<const int32_t> output, std::span<const int32_t> banned,
                                std::vector<uint32_t> allowed = {});

// Applies `a` to logits[0, vocab) in place (the CPU runner's copy of a row).
void apply_logits_adjust(float* logits, int64_t vocab, const LogitsAdjust& a);

}  // namespace flashserve::model
