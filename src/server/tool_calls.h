// Chat's `tools` and `tool_choice`: the request's tools (rendered by the chat template), the
// grammar a forced call follows, and the completion read back as OpenAI's `tool_calls`.
//
// The rules (docs/server.md, "Tool calls"):
//   - tool_choice "none": the tools are rendered, the output is content. "required", or a named
//     function: the output is constrained (model/json_grammar.h) to one call object
//     {"name": <a tool's name (the named one)>, "arguments": <an object of its parameters'
//     schema>}. "auto" (the default with tools): unconstrained; the output is a call when,
//     whitespace aside, it is such an object naming a tool, or a sequence of Hermes-style
//     <tool_call>{...}</tool_call> blocks each holding one (several calls); else it is content.
//   - A completion read as calls has content null, tool_calls [{id "call_...", type "function",
//     function {name, arguments: the arguments object as JSON text (forced: as written; auto:
//     compact)}}] and finish_reason "tool_calls". With "auto", one cut by max_tokens is content,
//     with finish_reason "length".
//   - Streamed, a forced call goes out as OpenAI streams one: a first delta.tool_calls piece
//     with index, id, type and the name once the name is written, then pieces of the arguments
//     as they come (held back: a tail of whitespace and '}' that may be the call object's end).
//     One cut by max_tokens ends with finish_reason "length" and the arguments so far (before
//     its name: the text as content). With "auto", text that may still be a call is held back
//     (only while it could: it starts with '{' or "<tool_call>"), and the calls go out whole in
//     one chunk at the end.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/json_grammar.h"
#include "server/openai_response.h"

namespace flashserve::server {

// tools (null: none) and tool_choice (null: not given) of a chat request. Throws ApiError (400)
// naming the field: a malformed tool, a parameters schema outside the subset
// (server/json_schema.h), two tools of one name, tool_choice without tools or naming no tool.
ChatTools parse_tools(const nlohmann::ordered_json& tools,
                      const nlohmann::ordered_json& tool_choice);

// The calls `text` holds under the auto rule above (`names`: the tools); nullopt when it is
// content. Each call's arguments are compact JSON text.
std::optional<std::vector<ToolCall>> parse_tool_calls(std::string_view text,
                                                      const std::vector<std::string>& names);

// One choice's output under tools (choice auto, required or named): holds back its text while it
// may be a call, and at the end turns it into tool_calls or releases it as content.
class ToolCallReader {
 public:
  // `id_seed`: the calls' ids are "call_" and 24 hex digits drawn from it.
  ToolCallReader(const ChatTools& tools, uint64_t id_seed);
  // Takes a piece of the choice's output (in order) and changes it into what goes out now.
  void take(Piece& p);

 private:
  static constexpr size_t npos = std::string::npos;
  std::string call_id(size_t i) const;
  bool may_be_call() const;
  size_t arguments_start(std::string* name) const;
  void take_forced(Piece& p);

  std::vector<std::string> names_;
  bool forced_ = false;         // required or named: the output is a call object
  bool content_ = false;        // auto: decided, the output is content
  std::string held_;            // the output so far (auto: held back while it may be a call)
  size_t arguments_at_ = npos;  // forced: where the arguments start in held_, once written
  size_t sent_ = 0;             // forced: held_ sent as arguments, up to here
  uint64_t id_seed_ = 0;
};

}  // namespace flashserve::server
