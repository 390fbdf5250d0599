// How a token is drawn from a row of logits, and the random number it is drawn with. The rule and
// the generator are shared by the CPU and the GPU samplers so that both draw the same token for
// the same request, position and logits (up to the rounding of the softmax).
//
// The logits the rule reads are the model's after the row's LogitsAdjust (model/logits_adjust.h:
// logit_bias, banned tokens, a grammar's mask, repetition/presence/frequency penalties), which
// both samplers apply first.
//
// Rule: temperature 0 is greedy (argmax; the lowest index among equal maxima). Otherwise
//   p = softmax(logits / temperature); order the tokens by logit descending (so by p), ties by
//   lower index;
//   min_p > 0 keeps only the tokens with p >= min_p * max p (vLLM's min_p: with e = exp((logit -
//   max logit) / temperature), those with e >= min_p; a prefix of the order, so it commutes with
//   top_k);
//   keep the first top_k of that order (top_k 0: all); then keep the shortest prefix whose mass
//   is >= top_p times the mass of those top_k (at least one token); renormalise over the kept set
//   and return the first kept token (in that order) whose cumulative mass exceeds u * kept_mass, u
//   = sample_uniform(seed, position of the token being sampled); the last kept token if rounding
//   leaves none.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#if defined(__CUDACC__)
#define FLASHSERVE_HOST_DEVICE __host__ __device__
#else
#define FLASHSERVE_HOST_DEVICE
#endif

namespace flashserve::model {

// vLLM's SamplingParams, as far as flashserve implements them.
struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;
  // (Fields below the first four, so that {temperature, top_k, top_p, seed} initialisers keep
  // their meaning.)
  float min_p = 0.0f;  // 0: off
  // Penalties, with vLLM's semantics (model/logits_adjust.h): repetition_penalty divides the
  // positive logits and multiplies the negative ones of every token in the prompt or the output
  // (1: off); presence_penalty is subtracted once from each token the output has, and
  // frequency_penalty once per occurrence in the output (0: off).
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Added to the logit of each token (OpenAI's logit_bias; distinct tokens).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // The stop and eos tokens cannot be sampled until this many tokens were generated.
  int64_t min_tokens = 0;

  // Throws Error(kInvalidArgument) naming the field: temperature >= 0 and finite, top_k >= 0,
  // top_p in (0, 1], min_p in [0, 1], repetition_penalty > 0 and finite, presence and frequency
  // penalties finite, logit_bias of distinct tokens >= 0 with finite values, min_tokens >= 0.
  void validate() const;
  // Whether the logits need the sequence's tokens (a penalty is on).
  bool penalizes() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

// SplitMix64's finaliser: a bijection of 64-bit words whose outputs pass BigCrush for counter
// inputs, so (seed, position) needs no state to carry between steps.
FLASHSERVE_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The uniform in [0, 1) that samples the token at `position` (its index in the sequence: the
// prompt's tokens are 0 .. prompt_len - 1, the first generated token is prompt_len) of a request
// seeded with `seed`. 24 random bits, so the value is exact in float on every device.
FLASHSERVE_HOST_DEVICE inline float sample_uniform(uint64_t seed, int64_t position) {
  const uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(position)));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

// The CPU sampler: applies the rule above to logits[0, vocab) with the given uniform.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, float u);

}  // namespace flashserve::model
