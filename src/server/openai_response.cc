#include "server/openai_response.h"

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

}  // namespace

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json full_response(const ResponseHead& h, const Piece& all, const Usage& u) {
  json r = head(h, false);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish(all)}};
  if (h.endpoint == Endpoint::kChat)
    choice["message"] = {{"role", "assistant"}, {"content", all.text}};
  else
    choice["text"] = all.text;
  choice["token_ids"] = all.token_ids;
  r["choices"] = json::array({choice});
  r["usage"] = usage_json(u);
  return r;
}

json chunk(const ResponseHead& h, const Piece& piece, bool first, bool usage_field) {
  json r = head(h, true);
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish(piece)}};
  if (h.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!piece.text.empty() || first) delta["content"] = piece.text;
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
