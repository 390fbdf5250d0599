// The OpenAI request schema: a JSON body of POST /v1/completions or /v1/chat/completions parsed
// and checked into a GenerationRequest, or refused with an ApiError (400) naming the field.
//
// Choices, documented in docs/server.md:
//   - Unknown fields are refused (400 "Unrecognized request argument supplied: x"), as OpenAI's
//     API does: a parameter a client believes it set must not be silently ignored. Parameters
//     OpenAI has but flashserve does not implement are accepted only at their neutral value
//     (n 1, presence_penalty 0, echo false, best_of 1, ...).
//   - logprobs: completions `logprobs` 0..5 (the sampled token and that many alternatives), chat
//     `logprobs: true` with `top_logprobs` 0..20 (top_logprobs without logprobs is refused).
//   - null means "not given" for every optional field, as in OpenAI's API.
//   - Numbers are typed: an integer field takes a JSON integer (not 16.0 or "16").
//   - Extensions with vLLM's names: top_k, ignore_eos, stop_token_ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/sampling.h"
#include "server/api_error.h"
#include "server/text_codec.h"

namespace flashserve::server {

enum class Endpoint { kCompletions, kChat };

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  // Completions: exactly one of these. Chat: messages.
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  std::vector<ChatMessage> messages;

  std::optional<int64_t> max_tokens;            // max_tokens or max_completion_tokens
  std::string max_tokens_param = "max_tokens";  // which of the two the request used
  model::SamplingParams sampling;
  bool seed_given = false;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;
  // -1: no logprobs; n >= 0: each token's log-probability and the n most likely alternatives.
  int32_t logprobs = -1;
  int32_t n = 1;  // choices: each its own sequence in the engine
};

// The most choices one request may ask for (each runs as its own sequence).
inline constexpr int32_t kMaxChoices = 128;

// OpenAI's limits: completions' logprobs, chat's top_logprobs.
inline constexpr int32_t kMaxCompletionLogprobs = 5;
inline constexpr int32_t kMaxChatTopLogprobs = 20;

// How many stop strings a request may give (OpenAI's limit).
inline constexpr size_t kMaxStopStrings = 4;
// How deep a request body may nest arrays and objects (a valid one needs 5).
inline constexpr int kMaxJsonDepth = 32;

// Throws ApiError (400) for malformed JSON, a body that is not an object, a missing or mistyped
// field, a value out of range or an unknown field.
GenerationRequest parse_request(std::string_view body, Endpoint endpoint);

}  // namespace flashserve::server
