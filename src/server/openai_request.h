// The OpenAI request schema: a JSON body of POST /v1/completions or /v1/chat/completions parsed
// and checked into a GenerationRequest, or refused with an ApiError (400) naming the field.
//
// Choices, documented in docs/server.md:
//   - Unknown fields are refused (400 "Unrecognized request argument supplied: x"), as OpenAI's
//     API does: a parameter a client believes it set must not be silently ignored. Parameters
//     OpenAI has but flashserve does not implement are accepted only at their neutral value
//     (best_of 1, suffix null, ...).
//   - logprobs: completions `logprobs` 0..5 (the sampled token and that many alternatives), chat
//     `logprobs: true` with `top_logprobs` 0..20 (top_logprobs without logprobs is refused).
//   - null means "not given" for every optional field, as in OpenAI's API.
//   - temperature defaults to 1, as in OpenAI's API and vLLM (0 is greedy).
//   - Numbers are typed: an integer field takes a JSON integer (not 16.0 or "16").
//   - Extensions with vLLM's names (its extra_body fields): top_k, min_p, repetition_penalty,
//     min_tokens, ignore_eos, stop_token_ids, skip_special_tokens, include_stop_str_in_output.
//   - Batched prompts (a list of strings or of token-id lists) are n independent choices each.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/sampling.h"
#include "server/api_error.h"
#include "server/text_codec.h"

namespace flashserve::model {
class JsonGrammar;
}

namespace flashserve::server {

enum class Endpoint { kCompletions, kChat };

// Chat's tools (server/tool_calls.h has the rules).
enum class ToolChoice { kNone, kAuto, kRequired, kNamed };
struct ChatTools {
  ToolChoice choice = ToolChoice::kNone;
  std::vector<std::string> names;  // in the request's order
  std::string json;                // the tools array as given, for the chat template; "": none
  // "required" or named: what the output follows (its root a call object); else null.
  std::shared_ptr<const model::JsonGrammar> grammar;
};

// One prompt of a completions request: text, or token ids.
struct Prompt {
  std::optional<std::string> text;
  std::vector<int32_t> ids;
};

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // "": not given (the server's first served name)
  // Completions: its prompts (one, or a batch: each gives n choices, in order). Chat: messages.
  std::vector<Prompt> prompts;
  std::vector<ChatMessage> messages;

  std::optional<int64_t> max_tokens;            // max_tokens or max_completion_tokens
  std::string max_tokens_param = "max_tokens";  // which of the two the request used
  model::SamplingParams sampling;
  bool seed_given = false;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;          // special tokens have no text
  bool include_stop_str_in_output = false;  // the text keeps the stop string that ended it
  bool echo = false;                        // completions: the text starts with the prompt's
  bool stream = false;
  bool include_usage = false;
  // -1: no logprobs; n >= 0: each token's log-probability and the n most likely alternatives.
  int32_t logprobs = -1;
  int32_t n = 1;  // choices: each its own sequence in the engine
  // chat: what the output is constrained to (model/json_grammar.h): response_format json_object
  // (any object) or json_schema (server/json_schema.h), or a tool call (tool_choice required or
  // named); null: nothing.
  std::shared_ptr<const model::JsonGrammar> grammar;
  ChatTools tools;  // chat: tools and tool_choice
};

// The most choices one request may ask for (each runs as its own sequence).
inline constexpr int32_t kMaxChoices = 128;

// OpenAI's limits: completions' logprobs, chat's top_logprobs.
inline constexpr int32_t kMaxCompletionLogprobs = 5;
inline constexpr int32_t kMaxChatTopLogprobs = 20;

// How many prompts one completions request may batch.
inline constexpr size_t kMaxPrompts = 128;

// How many stop strings a request may give (OpenAI's limit).
inline constexpr size_t kMaxStopStrings = 4;
// How deep a request body may nest arrays and objects (a valid one needs 5).
inline constexpr int kMaxJsonDepth = 32;

// Throws ApiError (400) for malformed JSON, a body that is not an object, a missing or mistyped
// field, a value out of range or an unknown field.
GenerationRequest parse_request(std::string_view body, Endpoint endpoint);

// vLLM's POST /tokenize: {model?, prompt} (encoded with the tokenizer's special tokens, as a
// completions prompt is) or {model?, messages} (the chat template's prompt, as chat's);
// return_token_strs asks for each token's text too. add_special_tokens and
// add_generation_prompt are accepted at the value the generation endpoints use (their default).
struct TokenizeRequest {
  std::string model;  // "": not given
  std::optional<std::string> prompt;
  std::vector<ChatMessage> messages;
  bool return_token_strs = false;
};
TokenizeRequest parse_tokenize_request(std::string_view body);

// vLLM's POST /detokenize: {model?, tokens: [ids]}.
struct DetokenizeRequest {
  std::string model;  // "": not given
  std::vector<int32_t> tokens;
};
DetokenizeRequest parse_detokenize_request(std::string_view body);

}  // namespace flashserve::server
