// The OpenAI response schema: the JSON objects of /v1/completions ("text_completion") and
// /v1/chat/completions ("chat.completion", streamed as "chat.completion.chunk"), and their
// server-sent-event framing: each event is one line "data: <json>" and a blank line; a stream ends
// with "data: [DONE]".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/openai_request.h"

namespace flashserve::server {

// What every object of one response shares.
struct ResponseHead {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;       // cmpl-<n> or chatcmpl-<n>
  int64_t created = 0;  // Unix seconds
  std::string model;
  bool logprobs = false;  // the request asked for them: choices carry a logprobs object
};

// One token as the logprobs objects show it: its bytes (from the tokenizer; without one, the text
// "token_id:<id>" and no bytes, as vLLM's return_tokens_as_token_ids) and log-probability.
struct LoggedToken {
  std::string bytes;
  bool has_bytes = true;
  float logprob = 0.0f;
};

// One generated token's logprobs: the sampled token, the most likely ones, and (completions) the
// offset of its text in the completion, in code points.
struct TokenLogprobs {
  LoggedToken sampled;
  std::vector<LoggedToken> top;
  int64_t text_offset = 0;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // Prompt tokens found in the prefix cache (prompt_tokens_details.cached_tokens).
  int64_t cached_tokens = 0;
};

// One tool call of a chat completion (server/tool_calls.h), or a piece of one: its index in the
// choice's calls, its id ("call_...") and the function's name (in a call's first piece only) and
// its arguments as JSON text (a piece continues the arguments of the call of its index).
struct ToolCall {
  size_t index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

// One choice's piece: its text, the ids it came from (an extension, with vLLM's field name
// token_ids: the only output when the model has no tokenizer) and, at the end, the finish reason.
struct Piece {
  std::string text;
  std::vector<int32_t> token_ids;
  std::optional<std::string> finish_reason;  // "stop", "length" or "tool_calls"; none running
  // Chat with tools: the calls the output was read as (its content is then null), in pieces.
  std::vector<ToolCall> tool_calls;
  // Appends a piece of a call: a new index starts a call, a known one continues its arguments.
  void add_tool_call(const ToolCall& c) {
    if (c.index < tool_calls.size())
      tool_calls[c.index].arguments += c.arguments;
    else
      tool_calls.push_back(c);
  }
  // When the request asked: one per token of the text (output_assembler.h: the eos/stop token and
  // the tokens inside a stop string have none).
  std::vector<TokenLogprobs> logprobs;
};

// A choice's "logprobs" object for these tokens: completions' {tokens, token_logprobs,
// top_logprobs, text_offset}, chat's {content: [{token, logprob, bytes, top_logprobs}]}.
nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprobs>& tokens);

nlohmann::json usage_json(const Usage& u);
// The whole (non-streamed) response: one whole piece per choice, in index order.
nlohmann::json full_response(const ResponseHead& h, const std::vector<Piece>& choices,
                             const Usage& u);
// One streamed chunk, of choice `index`. `first` (that choice's first chunk) adds the chat delta's
// role; `usage_field` adds "usage": null (what OpenAI sends on every chunk when
// stream_options.include_usage is set).
nlohmann::json chunk(const ResponseHead& h, const Piece& piece, size_t index, bool first,
                     bool usage_field);
// The last chunk when include_usage is set: no choices, the usage.
nlohmann::json usage_chunk(const ResponseHead& h, const Usage& u);

std::string sse_event(const nlohmann::json& data);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace flashserve::server
