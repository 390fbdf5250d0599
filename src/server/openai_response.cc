#include "server/openai_response.h"

#include "tokenizer/utf8.h"

#include <algorithm>
#include <cmath>

namespace flashserve::server {

using json = nlohmann::json;

namespace {

json head(const ResponseHead& h, bool streamed) {
  const bool chat = h.endpoint == Endpoint::kChat;
  return {{"id", h.id},
          {"object",
           chat ? (streamed ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", h.created},
          {"model", h.model}};
}

json finish(const Piece& p) {
  return p.finish_reason ? json(*p.finish_reason) : json(nullptr);
}

// JSON has no infinities: a token of probability 0 is reported at -9999.0, as OpenAI and vLLM do.
json logprob_value(float x) {
  return std::isnan(x) ? json(nullptr) : json(std::max(x, -9999.0f));
}

// The token as text: its bytes with invalid UTF-8 (part of a character) as U+FFFD.
std::string token_text(const LoggedToken& t) {
  return tokenizer::utf8::lossy(t.bytes);
}

json chat_token(const LoggedToken& t) {
  json bytes = nullptr;
  if (t.has_bytes) {
    bytes = json::array();
    for (unsigned char c : t.bytes) bytes.push_back(static_cast<int>(c));
  }
  return {{"token", token_text(t)}, {"logprob", logprob_value(t.logprob)}, {"bytes", bytes}};
}

// OpenAI's tool_calls entries. Streamed, each carries its index, and a piece that continues a call
// only its arguments.
json tool_calls_json(const std::vector<ToolCall>& calls, bool streamed) {
  json out = json::array();
  for (const ToolCall& c : calls) {
    json call = json::object();
    if (streamed) call["index"] = c.index;
    if (!streamed || !c.id.empty()) {
      call["id"] = c.id;
      call["type"] = "function";
      call["function"] = {{"name", c.name}, {"arguments", c.arguments}};
    } else {
      call["function"] = {{"arguments", c.arguments}};
    }
    out.push_back(std::move(call));
  }
  return out;
}

json choice_logprobs(const ResponseHead& h, const Piece& p) {
  return h.logprobs ? logprobs_json(h.endpoint, p.logprobs) : json(nullptr);
}

}  // namespace

json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprobs>& tokens) {
  if (endpoint == Endpoint::kChat) {
    json content = json::array();
    for (const TokenLogprobs& t : tokens) {
      json entry = chat_token(t.sampled);
      json top = json::array();
      for (const LoggedToken& alt : t.top) top.push_back(chat_token(alt));
      entry["top_logprobs"] = top;
      content.push_back(entry);
    }
    return {{"content", content}};
  }
  json text = json::array(), values = json::array(), top = json::array(), offsets = json::array();
  for (const TokenLogprobs& t : tokens) {
    text.push_back(token_text(t.sampled));
    values.push_back(logprob_value(t.sampled.logprob));
    // The sampled token and the alternatives (so up to logprobs + 1 entries, as OpenAI says).
    // Tokens of the same text (byte tokens of partial characters all read U+FFFD) share a key:
    // the first keeps it, so the sampled token's value stays, then the likelier alternative's.
    json alts = json::object();
    alts[token_text(t.sampled)] = logprob_value(t.sampled.logprob);
    for (const LoggedToken& alt : t.top) alts.emplace(token_text(alt), logprob_value(alt.logprob));
    top.push_back(alts);
    offsets.push_back(t.text_offset);
  }
  return {{"tokens", text},
          {"token_logprobs", values},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json full_response(const ResponseHead& h, const std::vector<Piece>& choices, const Usage& u) {
  json r = head(h, false);
  r["choices"] = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const Piece& all = choices[i];
    json choice = {
        {"index", i}, {"logprobs", choice_logprobs(h, all)}, {"finish_reason", finish(all)}};
    if (h.endpoint == Endpoint::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", all.text}};
      if (!all.tool_calls.empty()) {
        choice["message"]["content"] = nullptr;
        choice["message"]["tool_calls"] = tool_calls_json(all.tool_calls, false);
      }
    } else {
      choice["text"] = all.text;
    }
    choice["token_ids"] = all.token_ids;
    r["choices"].push_back(choice);
  }
  r["usage"] = usage_json(u);
  return r;
}

json chunk(const ResponseHead& h, const Piece& piece, size_t index, bool first, bool usage_field) {
  json r = head(h, true);
  json choice = {
      {"index", index}, {"logprobs", choice_logprobs(h, piece)}, {"finish_reason", finish(piece)}};
  if (h.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!piece.text.empty() || first) delta["content"] = piece.text;
    if (!piece.tool_calls.empty()) delta["tool_calls"] = tool_calls_json(piece.tool_calls, true);
    choice["delta"] = delta;
  } else {
    choice["text"] = piece.text;
  }
  choice["token_ids"] = piece.token_ids;
  r["choices"] = json::array({choice});
  if (usage_field) r["usage"] = nullptr;
  return r;
}

json usage_chunk(const ResponseHead& h, const Usage& u) {
  json r = head(h, true);
  r["choices"] = json::array();
  r["usage"] = usage_json(u);
  return r;
}

std::string sse_event(const json& data) {
  // dump() escapes newlines inside strings, so the event is one "data:" line.
  return "data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace flashserve::server
