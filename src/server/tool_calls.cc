#include "server/tool_calls.h"

#include <algorithm>
#include <cstdio>

#include "model/sampling.h"
#include "server/api_error.h"
#include "server/json_schema.h"

namespace flashserve::server {
namespace {

using ojson = nlohmann::ordered_json;
using Grammar = model::JsonGrammar;

constexpr size_t kMaxTools = 128;  // OpenAI's limit
constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";

std::string dumped(const ojson& v) {
  return v.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

// OpenAI's rule for function names: a-z, A-Z, 0-9, '_' and '-', at most 64.
bool valid_name(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

void only_keys(const ojson& v, const std::string& at, std::initializer_list<const char*> keys) {
  for (const auto& item : v.items()) {
    // Not a structured binding: clang 14 (the fuzz build) refuses one captured by a lambda.
    const std::string& key = item.key();
    if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return key == k; }))
      throw bad_request(at + "." + key, "Unrecognized argument supplied in " + at + ": " + key);
  }
}

const ojson* field(const ojson& v, const char* key) {
  const auto it = v.find(key);
  return it == v.end() || it->is_null() ? nullptr : &*it;
}

std::string string_field(const ojson& v, const std::string& at, const char* key) {
  const ojson* f = field(v, key);
  const std::string name = at + "." + key;
  if (!f) throw bad_request(name, name + ": missing");
  if (!f->is_string()) throw bad_request(name, name + ": expected a string");
  return f->get<std::string>();
}

// One tool: its name, and the call object {"name": ..., "arguments": ...} added to `g`.
std::string parse_tool(const ojson& tool, size_t i, Grammar& g, std::vector<int32_t>& calls) {
  const std::string at = "tools[" + std::to_string(i) + "]";
  if (!tool.is_object()) throw bad_request(at, at + ": expected an object");
  only_keys(tool, at, {"type", "function"});
  if (string_field(tool, at, "type") != "function")
    throw bad_request(at + ".type", at + ".type: only \"function\" is supported");
  const ojson* fn = field(tool, "function");
  if (!fn || !fn->is_object())
    throw bad_request(at + ".function", at + ".function: expected an object");
  const std::string fat = at + ".function";
  only_keys(*fn, fat, {"name", "description", "parameters", "strict"});
  const std::string name = string_field(*fn, fat, "name");
  if (!valid_name(name))
    throw bad_request(fat + ".name", fat + ".name: '" + name +
                                         "' is not a function name (a-z, A-Z, 0-9, _ and -, "
                                         "at most 64)");
  if (field(*fn, "description")) string_field(*fn, fat, "description");
  bool strict = false;
  if (const ojson* s = field(*fn, "strict")) {
    if (!s->is_boolean()) throw bad_request(fat + ".strict", fat + ".strict: expected a boolean");
    strict = s->get<bool>();
  }
  // No parameters: a function of none (OpenAI's reading), whose arguments are {}.
  int32_t args = -1;
  if (const ojson* p = field(*fn, "parameters")) {
    args = compile_json_schema(*p, fat + ".parameters", strict, g);
    if (g.node(args).kind != Grammar::Kind::kObject)
      throw bad_request(fat + ".parameters",
                        fat + ".parameters: must be an object schema (arguments are an object)");
  } else {
    args = g.object({});
  }
  calls.push_back(
      g.object({{"\"name\"", g.literals({dumped(name)}), true}, {"\"arguments\"", args, true}}));
  return name;
}

// A call object {"name": <one of names>, "arguments": {...}}, parsed; nullopt otherwise.
std::optional<ToolCall> call_of(std::string_view text, const std::vector<std::string>& names) {
  const ojson v = ojson::parse(text.begin(), text.end(), nullptr, false);
  if (!v.is_object() || v.size() != 2 || !v.contains("name") || !v.contains("arguments"))
    return std::nullopt;
  const ojson& name = v["name"];
  if (!name.is_string() || !v["arguments"].is_object() ||
      std::find(names.begin(), names.end(), name.get<std::string>()) == names.end())
    return std::nullopt;
  return ToolCall{0, {}, name.get<std::string>(), dumped(v["arguments"])};
}

std::string_view trimmed(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

ChatTools parse_tools(const ojson& tools, const ojson& tool_choice) {
  ChatTools out;
  if (!tools.is_null()) {
    if (!tools.is_array()) throw bad_request("tools", "tools: expected an array of tools");
    if (tools.empty()) throw bad_request("tools", "tools: empty (leave it out for no tools)");
    if (tools.size() > kMaxTools)
      throw bad_request("tools", "tools: at most " + std::to_string(kMaxTools) + " tools (got " +
                                     std::to_string(tools.size()) + ")");
  }
  auto g = std::make_shared<Grammar>();
  std::vector<int32_t> calls;
  for (size_t i = 0; !tools.is_null() && i < tools.size(); ++i) {
    const std::string name = parse_tool(tools[i], i, *g, calls);
    if (std::find(out.names.begin(), out.names.end(), name) != out.names.end())
      throw bad_request(
          "tools[" + std::to_string(i) + "].function.name",
          "tools[" + std::to_string(i) + "].function.name: '" + name + "' names two tools");
    out.names.push_back(name);
  }
  if (!tools.is_null()) out.json = dumped(tools);

  out.choice = tools.is_null() ? ToolChoice::kNone : ToolChoice::kAuto;
  int32_t named = -1;
  if (tool_choice.is_string()) {
    const std::string c = tool_choice.get<std::string>();
    if (c == "none")
      out.choice = ToolChoice::kNone;
    else if (c == "auto")
      out.choice = ToolChoice::kAuto;
    else if (c == "required")
      out.choice = ToolChoice::kRequired;
    else
      throw bad_request("tool_choice", "tool_choice: '" + c +
                                           "' is not one of none, auto, required (or an object "
                                           "naming a function)");
  } else if (tool_choice.is_object()) {
    only_keys(tool_choice, "tool_choice", {"type", "function"});
    if (string_field(tool_choice, "tool_choice", "type") != "function")
      throw bad_request("tool_choice.type", "tool_choice.type: only \"function\" is supported");
    const ojson* fn = field(tool_choice, "function");
    if (!fn || !fn->is_object())
      throw bad_request("tool_choice.function",
                        "tool_choice.function: expected an object with a name");
    only_keys(*fn, "tool_choice.function", {"name"});
    const std::string name = string_field(*fn, "tool_choice.function", "name");
    const auto it = std::find(out.names.begin(), out.names.end(), name);
    if (it == out.names.end())
      throw bad_request("tool_choice", "tool_choice: no tool is named '" + name + "'" +
                                           (out.names.empty() ? " (no tools were given)" : ""));
    out.choice = ToolChoice::kNamed;
    named = static_cast<int32_t>(it - out.names.begin());
  } else if (!tool_choice.is_null()) {
    throw bad_request("tool_choice",
                      "tool_choice: expected \"none\", \"auto\", \"required\" or an object");
  }
  if (tools.is_null() && !tool_choice.is_null())
    throw bad_request("tool_choice", "tool_choice: only allowed when tools are given");

  if (out.choice == ToolChoice::kNamed) {
    g->set_root(calls[static_cast<size_t>(named)]);
  } else if (out.choice == ToolChoice::kRequired) {
    std::vector<std::string> literals;
    for (const std::string& n : out.names) literals.push_back(dumped(n));
    g->set_root(calls.size() == 1 ? calls[0] : g->discriminated("\"name\"", literals, calls));
  }
  if (out.choice == ToolChoice::kNamed || out.choice == ToolChoice::kRequired)
    out.grammar = std::move(g);
  return out;
}

std::optional<std::vector<ToolCall>> parse_tool_calls(std::string_view text,
                                                      const std::vector<std::string>& names) {
  text = trimmed(text);
  std::vector<ToolCall> calls;
  if (!text.empty() && text.front() == '{') {
    auto call = call_of(text, names);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    return calls;
  }
  // Hermes: <tool_call>{...}</tool_call>, one or more, whitespace between.
  while (!text.empty()) {
    if (text.substr(0, kOpen.size()) != kOpen) return std::nullopt;
    text.remove_prefix(kOpen.size());
    const size_t end = text.find(kClose);
    if (end == std::string_view::npos) return std::nullopt;
    auto call = call_of(trimmed(text.substr(0, end)), names);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    text = trimmed(text.substr(end + kClose.size()));
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

ToolCallReader::ToolCallReader(const ChatTools& tools, uint64_t id_seed)
    : names_(tools.names), forced_(tools.grammar != nullptr), id_seed_(id_seed) {}

std::string ToolCallReader::call_id(size_t i) const {
  char hex[32];
  std::snprintf(hex, sizeof hex, "%016llx%08llx",
                static_cast<unsigned long long>(model::splitmix64(id_seed_ + 2 * i)),
                static_cast<unsigned long long>(model::splitmix64(id_seed_ + 2 * i + 1) >> 32));
  return std::string("call_") + hex;
}

bool ToolCallReader::may_be_call() const {
  const std::string_view t = trimmed(held_);
  return t.empty() || t.front() == '{' || t.substr(0, kOpen.size()) == kOpen.substr(0, t.size());
}

void ToolCallReader::take(Piece& p) {
  if (content_) return;
  held_ += p.text;
  p.text.clear();
  if (forced_) return take_forced(p);
  if (!may_be_call()) {  // auto: content after all; what was held goes out now
    content_ = true;
    p.text = std::move(held_);
    return;
  }
  if (!p.finish_reason) return;
  std::optional<std::vector<ToolCall>> calls;
  if (*p.finish_reason == "stop") calls = parse_tool_calls(held_, names_);
  if (!calls) {
    p.text = std::move(held_);
    return;
  }
  for (size_t i = 0; i < calls->size(); ++i) {
    (*calls)[i].index = i;
    (*calls)[i].id = call_id(i);
  }
  p.tool_calls = std::move(*calls);
  p.finish_reason = "tool_calls";
}

// The grammar writes {"name": "<name>", "arguments": <object>} with whitespace between tokens:
// once the text reaches the arguments, where they start (and the name); npos before.
size_t ToolCallReader::arguments_start(std::string* name) const {
  size_t at = 0;
  const auto ws = [&] {
    while (at < held_.size() &&
           (held_[at] == ' ' || held_[at] == '\t' || held_[at] == '\n' || held_[at] == '\r'))
      ++at;
  };
  const auto literal = [&](std::string_view s) {
    ws();
    if (held_.compare(at, s.size(), s) != 0) return false;
    at += s.size();
    return true;
  };
  if (!literal("{") || !literal("\"name\"") || !literal(":") || !literal("\"")) return npos;
  const size_t end = held_.find('"', at);  // names have no quote nor escape
  if (end == std::string::npos) return npos;
  *name = held_.substr(at, end - at);
  at = end + 1;
  if (!literal(",") || !literal("\"arguments\"") || !literal(":")) return npos;
  ws();
  return at < held_.size() ? at : npos;  // the arguments' first byte is there
}

void ToolCallReader::take_forced(Piece& p) {
  if (arguments_at_ == npos) {
    std::string name;
    arguments_at_ = arguments_start(&name);
    if (arguments_at_ == npos) {  // cut before the arguments: what there is, as content
      if (p.finish_reason) p.text = std::move(held_);
      return;
    }
    p.tool_calls.push_back({0, call_id(0), name, ""});
    sent_ = arguments_at_;
  }
  // The arguments go out as they come, but for a tail of whitespace and '}' that may be the
  // call object's own end; at the end, up to that end (or all of it, when cut).
  size_t end = held_.size();
  const bool stopped = p.finish_reason && *p.finish_reason == "stop";
  const auto tail = [&](bool braces) {
    while (end > sent_ &&
           (held_[end - 1] == ' ' || held_[end - 1] == '\t' || held_[end - 1] == '\n' ||
            held_[end - 1] == '\r' || (braces && held_[end - 1] == '}')))
      --end;
  };
  if (!p.finish_reason) {
    tail(true);
  } else if (stopped) {
    tail(false);  // the call's closing brace, then the space before it
    if (end > sent_ && held_[end - 1] == '}') --end;
    tail(false);
  }
  const ToolCall piece{0, {}, {}, held_.substr(sent_, end - sent_)};
  if (!piece.arguments.empty()) {
    if (!p.tool_calls.empty())
      p.tool_calls.back().arguments += piece.arguments;
    else
      p.tool_calls.push_back(piece);
  }
  sent_ = end;
  // (A grammar stuck for want of tokens also stops: then what was written is no whole call.)
  if (stopped && call_of(held_, names_)) p.finish_reason = "tool_calls";
}

}  // namespace flashserve::server
