#include "server/openai_request.h"

#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "model/json_grammar.h"
#include "server/json_schema.h"
#include "server/ordered_fields.h"
#include "server/tool_calls.h"

namespace flashserve::server {

namespace {

using json = nlohmann::json;

std::string type_name(const json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number_float()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

[[noreturn]] void wrong_type(const std::string& name, const char* expected, const json& v) {
  throw bad_request(name, name + ": expected " + expected + ", got " + type_name(v));
}

std::string range_text(int64_t lo, int64_t hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

int64_t get_int(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  // An integer literal beyond 64 bits (10^30) reaches us as a float: it is out of range, not of
  // the wrong type.
  if (v.is_number_float()) {
    const double x = v.get<double>();
    if (std::isfinite(x) && x == std::floor(x) && (x < -0x1p63 || x >= 0x1p63))
      throw bad_request(name, name + ": " + v.dump() + " is outside " + range_text(lo, hi));
  }
  if (!v.is_number_integer()) wrong_type(name, "an integer", v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    throw bad_request(name, name + ": " + v.dump() + " is above " + std::to_string(hi));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    throw bad_request(name, name + ": " + std::to_string(x) + " is outside " + range_text(lo, hi));
  return x;
}

double get_real(const json& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) wrong_type(name, "a number", v);
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi))
    throw bad_request(name, name + ": " + v.dump() + " is outside [" + json(lo).dump() + ", " +
                                json(hi).dump() + "]");
  return x;
}

bool get_bool(const json& v, const std::string& name) {
  if (!v.is_boolean()) wrong_type(name, "a boolean", v);
  return v.get<bool>();
}

std::string get_string(const json& v, const std::string& name) {
  if (!v.is_string()) wrong_type(name, "a string", v);
  return v.get<std::string>();
}

std::vector<int32_t> get_ids(const json& v, const std::string& name) {
  if (!v.is_array()) wrong_type(name, "an array of token ids", v);
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    ids.push_back(static_cast<int32_t>(get_int(v[i], name + "[" + std::to_string(i) + "]", 0,
                                               std::numeric_limits<int32_t>::max())));
  return ids;
}

Prompt one_prompt(const json& v, const std::string& name) {
  Prompt p;
  if (v.is_string()) {
    p.text = v.get<std::string>();
    if (p.text->empty()) throw bad_request(name, name + ": empty");
  } else if (v.is_array()) {
    // Token ids: an element of another type is named ("prompt[0]: expected an integer, got a
    // boolean"), not the whole prompt.
    if (v.empty()) throw bad_request(name, name + ": empty");
    p.ids = get_ids(v, name);
  } else {
    wrong_type(name, "a string or an array of token ids", v);
  }
  return p;
}

void parse_prompt(const json& v, GenerationRequest& r) {
  // OpenAI's forms: a string, an array of strings, an array of token ids, an array of arrays of
  // token ids. Each prompt of a batch is its own n choices.
  if (v.is_array() && !v.empty() && (v[0].is_string() || v[0].is_array())) {
    if (v.size() > kMaxPrompts)
      throw bad_request("prompt", "prompt: at most " + std::to_string(kMaxPrompts) +
                                      " prompts in a batch (got " + std::to_string(v.size()) + ")");
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string name = "prompt[" + std::to_string(i) + "]";
      if (!v[i].is_string() && !v[i].is_array())
        wrong_type(name, "a string or an array of token ids", v[i]);
      // A batch is all strings or all arrays of token ids (OpenAI's string[] | int[][]).
      if (v[i].is_string() != v[0].is_string())
        wrong_type(
            name,
            v[0].is_string() ? "a string, as prompt[0]" : "an array of token ids, as prompt[0]",
            v[i]);
      r.prompts.push_back(one_prompt(v[i], name));
    }
    return;
  }
  if (v.is_array() && v.empty()) throw bad_request("prompt", "prompt: empty");
  r.prompts.push_back(one_prompt(v, "prompt"));
}

// logit_bias: {"token id": bias}, OpenAI's form (keys are strings of decimal ids), biases in
// OpenAI's [-100, 100].
std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& v) {
  if (!v.is_object()) wrong_type("logit_bias", "an object of token ids to biases", v);
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, value] : v.items()) {
    const std::string name = "logit_bias." + key;
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || key.empty() || id < 0 ||
        id > std::numeric_limits<int32_t>::max() || (key.size() > 1 && key[0] == '0'))
      throw bad_request("logit_bias", "logit_bias: '" + key + "' is not a token id");
    out.emplace_back(static_cast<int32_t>(id),
                     static_cast<float>(get_real(value, name, -100, 100)));
  }
  return out;
}

std::string message_content(const json& v, const std::string& name) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) wrong_type(name, "a string or an array of text parts", v);
  // The parts form: [{"type": "text", "text": "..."}]; only text parts.
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string part = name + "[" + std::to_string(i) + "]";
    const json& p = v[i];
    if (!p.is_object()) wrong_type(part, "an object", p);
    const auto type = p.find("type");
    if (type == p.end() || !type->is_string() || type->get<std::string>() != "text")
      throw bad_request(part, part + ": only parts of type \"text\" are supported");
    const auto t = p.find("text");
    if (t == p.end()) throw bad_request(part + ".text", part + ".text: missing");
    text += get_string(*t, part + ".text");
    for (const auto& [key, value] : p.items())
      if (key != "type" && key != "text")
        throw bad_request(part + "." + key,
                          "Unrecognized argument supplied in " + part + ": " + key);
  }
  return text;
}

// An assistant message's tool_calls: [{id, type "function", function {name, arguments}}], as a
// JSON array for the chat template with each arguments string parsed into its object (as vLLM
// hands them to templates: `arguments | tojson` writes the object).
std::string message_tool_calls(const json& v, const std::string& name) {
  if (!v.is_array() || v.empty()) wrong_type(name, "a non-empty array of tool calls", v);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = name + "[" + std::to_string(i) + "]";
    const json& c = v[i];
    if (!c.is_object()) wrong_type(at, "an object", c);
    for (const auto& [key, value] : c.items())
      if (key != "id" && key != "type" && key != "function")
        throw bad_request(at + "." + key, "Unrecognized argument supplied in " + at + ": " + key);
    const std::string id = c.contains("id") ? get_string(c["id"], at + ".id") : std::string();
    if (!c.contains("type") || get_string(c["type"], at + ".type") != "function")
      throw bad_request(at + ".type", at + ".type: only \"function\" is supported");
    if (!c.contains("function") || !c["function"].is_object())
      throw bad_request(at + ".function", at + ".function: expected an object");
    const json& fn = c["function"];
    for (const auto& [key, value] : fn.items())
      if (key != "name" && key != "arguments")
        throw bad_request(at + ".function." + key,
                          "Unrecognized argument supplied in " + at + ".function: " + key);
    if (!fn.contains("name"))
      throw bad_request(at + ".function.name", at + ".function.name: missing");
    if (!fn.contains("arguments"))
      throw bad_request(at + ".function.arguments", at + ".function.arguments: missing");
    const std::string args = get_string(fn["arguments"], at + ".function.arguments");
    auto parsed = nlohmann::ordered_json::parse(args, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded())
      throw bad_request(at + ".function.arguments",
                        at + ".function.arguments: not JSON text (a JSON object as a string)");
    out.push_back({{"id", id},
                   {"type", "function"},
                   {"function",
                    {{"name", get_string(fn["name"], at + ".function.name")},
                     {"arguments", std::move(parsed)}}}});
  }
  return out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void parse_messages(const json& v, GenerationRequest& r) {
  if (!v.is_array()) wrong_type("messages", "an array", v);
  if (v.empty()) throw bad_request("messages", "messages: empty");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string name = "messages[" + std::to_string(i) + "]";
    const json& m = v[i];
    if (!m.is_object()) wrong_type(name, "an object", m);
    ChatMessage msg;
    for (const auto& [key, value] : m.items()) {
      if (key == "role") {
        msg.role = get_string(value, name + ".role");
        if (msg.role != "system" && msg.role != "developer" && msg.role != "user" &&
            msg.role != "assistant" && msg.role != "tool")
          throw bad_request(name + ".role",
                            name + ".role: '" + msg.role +
                                "' is not one of system, developer, user, assistant, tool");
      } else if (key == "content") {
        if (!value.is_null()) msg.content = message_content(value, name + ".content");
      } else if (key == "tool_calls") {
        if (!value.is_null()) msg.tool_calls_json = message_tool_calls(value, name + ".tool_calls");
      } else if (key == "tool_call_id") {
        if (!value.is_null()) msg.tool_call_id = get_string(value, name + ".tool_call_id");
      } else if (key == "name") {
        if (!value.is_null()) get_string(value, name + ".name");  // accepted, not used
      } else {
        throw bad_request(name + "." + key,
                          "Unrecognized argument supplied in " + name + ": " + key);
      }
    }
    if (msg.role.empty()) throw bad_request(name + ".role", name + ".role: missing");
    // null is "not given": content is required, but for an assistant's tool calls.
    // An assistant's calls without content reach the template with content "" (as vLLM passes
    // them to templates that take text content).
    const bool no_content = !m.contains("content") || m["content"].is_null();
    if (no_content && (msg.role != "assistant" || msg.tool_calls_json.empty()))
      throw bad_request(name + ".content", name + ".content: missing");
    if (!msg.tool_calls_json.empty() && msg.role != "assistant")
      throw bad_request(name + ".tool_calls", name + ".tool_calls: only in an assistant's message");
    if (msg.role == "tool" && msg.tool_call_id.empty())
      throw bad_request(name + ".tool_call_id",
                        name + ".tool_call_id: missing (a tool's message answers a call)");
    if (msg.role != "tool" && !msg.tool_call_id.empty())
      throw bad_request(name + ".tool_call_id", name + ".tool_call_id: only in a tool's message");
    r.messages.push_back(std::move(msg));
  }
}

void parse_stop(const json& v, GenerationRequest& r) {
  if (v.is_string()) {
    r.stop.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > kMaxStopStrings)
      throw bad_request("stop", "stop: at most " + std::to_string(kMaxStopStrings) +
                                    " sequences (got " + std::to_string(v.size()) + ")");
    for (size_t i = 0; i < v.size(); ++i)
      r.stop.push_back(get_string(v[i], "stop[" + std::to_string(i) + "]"));
  } else {
    wrong_type("stop", "a string or an array of strings", v);
  }
  for (const std::string& s : r.stop)
    if (s.empty()) throw bad_request("stop", "stop: an empty stop sequence");
}

// A parameter flashserve has only at its neutral value: accepted there, refused elsewhere.
void neutral_only(const json& v, const std::string& name, const json& neutral, const char* why) {
  if (v != neutral)
    throw bad_request(name, name + ": only " + neutral.dump() + " is supported (" + why + ")");
}

// response_format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema",
// "json_schema": {name, description?, schema, strict?}}; the checks on its form, on the parsed
// body (the schema itself is read in order, from ordered_fields). Returns the type.
std::string response_format_type(const json& v) {
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string())
    throw bad_request("response_format",
                      "response_format: expected an object with a \"type\" (\"text\", "
                      "\"json_object\" or \"json_schema\")");
  const std::string type = v["type"];
  if (type != "text" && type != "json_object" && type != "json_schema")
    throw bad_request("response_format", "response_format: unknown type \"" + type +
                                             "\" (\"text\", \"json_object\" or \"json_schema\")");
  for (const auto& item : v.items())
    if (item.key() != "type" && (type != "json_schema" || item.key() != "json_schema"))
      throw bad_request(
          "response_format",
          "response_format: the field \"" + item.key() + "\" is not supported (only " +
              (type == "json_schema" ? "\"type\" and \"json_schema\")" : "\"type\")"));
  return type;
}

// json_schema's object, read in order: the schema compiled (server/json_schema.h).
std::shared_ptr<const model::JsonGrammar> json_schema_format(const nlohmann::ordered_json& v) {
  const std::string at = "response_format.json_schema";
  if (!v.is_object()) throw bad_request(at, at + ": expected an object {name, schema, strict?}");
  const auto get = [&](const char* key) -> const nlohmann::ordered_json* {
    const auto it = v.find(key);
    return it == v.end() || it->is_null() ? nullptr : &*it;
  };
  for (const auto& [key, value] : v.items())
    if (key != "name" && key != "description" && key != "schema" && key != "strict")
      throw bad_request(at + "." + key, "Unrecognized argument supplied in " + at + ": " + key);
  const auto* name = get("name");
  if (!name) throw bad_request(at + ".name", at + ".name: missing");
  if (!name->is_string() || name->get<std::string>().empty() ||
      name->get<std::string>().size() > 64)
    throw bad_request(at + ".name", at + ".name: expected a string of 1 to 64 characters");
  if (const auto* d = get("description"); d && !d->is_string())
    throw bad_request(at + ".description", at + ".description: expected a string");
  bool strict = false;
  if (const auto* st = get("strict")) {
    if (!st->is_boolean()) throw bad_request(at + ".strict", at + ".strict: expected a boolean");
    strict = st->get<bool>();
  }
  const auto* schema = get("schema");
  if (!schema) throw bad_request(at + ".schema", at + ".schema: missing");
  return json_schema_grammar(*schema, at + ".schema", strict);
}

// Whether the JSON text nests arrays and objects deeper than `limit`, by a scan that skips
// strings. A request is a few levels deep; refusing deeper text before parsing keeps a body of
// 8 MB of '[' from costing hundreds of MB of parse tree.
bool nests_deeper_than(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// The body as a JSON object, or the 400 saying why not.
json parse_body(std::string_view body) {
  if (nests_deeper_than(body, kMaxJsonDepth))
    throw bad_request({},
                      "The request body nests arrays and objects deeper than " +
                          std::to_string(kMaxJsonDepth) + " levels",
                      "invalid_json");
  json doc = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    throw bad_request({}, "The request body is not valid JSON (UTF-8 text in RFC 8259 syntax)",
                      "invalid_json");
  if (!doc.is_object()) throw bad_request({}, "The request body must be a JSON object");
  return doc;
}

std::string get_model(const json& v) {
  std::string m = get_string(v, "model");
  if (m.empty()) throw bad_request("model", "model: empty");
  return m;
}

// Chat's response_format and tools, read from the body again with their keys in order.
void structured_output(std::string_view body, const std::string& format, bool tools_given,
                       GenerationRequest& r) {
  if (format == "json_object") r.grammar = model::JsonGrammar::any_object();
  if (format != "json_schema" && !tools_given) return;
  auto fields = ordered_fields(body, {"response_format", "tools", "tool_choice"});
  if (format == "json_schema")
    r.grammar = json_schema_format(fields["response_format"]["json_schema"]);
  if (!tools_given) return;
  r.tools = parse_tools(fields["tools"], fields["tool_choice"]);
  if (r.tools.choice != ToolChoice::kNone) {
    if (r.grammar)
      throw bad_request("response_format",
                        "response_format: " + format +
                            " is not supported beside tools unless tool_choice is \"none\"");
    r.grammar = r.tools.grammar;
  }
}

// A grammar ends the output where its text is whole (the stop and eos tokens are allowed then
// and only then): a request that would keep it going past that has no tokens left to sample.
void grammar_ends_the_output(const GenerationRequest& r) {
  if (!r.grammar) return;
  const std::string what = r.tools.grammar ? "a forced tool call" : "response_format";
  if (r.sampling.min_tokens > 0)
    throw bad_request("min_tokens", "min_tokens: not with " + what +
                                        " (its grammar decides where the output ends)");
  if (r.ignore_eos)
    throw bad_request("ignore_eos", "ignore_eos: not with " + what +
                                        " (its grammar decides where the output ends)");
}

}  // namespace

TokenizeRequest parse_tokenize_request(std::string_view body) {
  const json doc = parse_body(body);
  TokenizeRequest r;
  GenerationRequest chat;
  for (const auto& [key, v] : doc.items()) {
    if (v.is_null()) continue;
    if (key == "model")
      r.model = get_model(v);
    else if (key == "prompt")
      r.prompt = get_string(v, "prompt");
    else if (key == "messages")
      parse_messages(v, chat);
    else if (key == "return_token_strs")
      r.return_token_strs = get_bool(v, "return_token_strs");
    else if (key == "add_special_tokens")
      // A prompt gets the tokenizer's special tokens, messages the template's own (vLLM's
      // defaults for each), as the generation endpoints encode them.
      neutral_only(v, "add_special_tokens", !doc.contains("messages"),
                   "encoded as the generation endpoints encode it");
    else if (key == "add_generation_prompt")
      neutral_only(v, "add_generation_prompt", true, "rendered as chat renders it");
    else
      throw bad_request(key, "Unrecognized request argument supplied: " + key);
  }
  r.messages = std::move(chat.messages);
  if (r.prompt.has_value() == !r.messages.empty())
    throw bad_request("prompt", "prompt: give a prompt or messages (one of them)");
  return r;
}

DetokenizeRequest parse_detokenize_request(std::string_view body) {
  const json doc = parse_body(body);
  DetokenizeRequest r;
  bool have_tokens = false;
  for (const auto& [key, v] : doc.items()) {
    if (v.is_null()) continue;
    if (key == "model") {
      r.model = get_model(v);
    } else if (key == "tokens") {
      r.tokens = get_ids(v, "tokens");
      have_tokens = true;
    } else {
      throw bad_request(key, "Unrecognized request argument supplied: " + key);
    }
  }
  if (!have_tokens) throw bad_request("tokens", "tokens: missing");
  return r;
}

GenerationRequest parse_request(std::string_view body, Endpoint endpoint) {
  const json doc = parse_body(body);

  GenerationRequest r;
  r.endpoint = endpoint;
  // Without a temperature a request samples at 1, OpenAI's documented default and vLLM's (the
  // engine's own default, 0, is greedy: n choices would all be the same text).
  r.sampling.temperature = 1.0f;
  const bool chat = endpoint == Endpoint::kChat;
  bool have_input = false;
  std::optional<json> stream_options;
  bool chat_logprobs = false;           // chat: logprobs true
  std::optional<int64_t> top_logprobs;  // chat: top_logprobs given
  std::optional<int64_t> max_tokens, max_completion_tokens;
  std::string format = "text";  // chat: response_format's type
  bool tools_given = false;     // chat: tools or tool_choice
  using Field = std::function<void(const json&)>;
  const std::map<std::string, Field> fields = {
      {"model", [&](const json& v) { r.model = get_model(v); }},
      {chat ? "messages" : "prompt",
       [&](const json& v) {
         chat ? parse_messages(v, r) : parse_prompt(v, r);
         have_input = true;
       }},
      {"max_tokens", [&](const json& v) { max_tokens = get_int(v, "max_tokens", 1, INT64_MAX); }},
      {"temperature",
       [&](const json& v) {
         r.sampling.temperature = static_cast<float>(get_real(v, "temperature", 0, 2));
       }},
      {"top_p",
       [&](const json& v) {
         r.sampling.top_p = static_cast<float>(get_real(v, "top_p", 0, 1));
         if (!(r.sampling.top_p > 0))
           throw bad_request("top_p",
                             "top_p: " + v.dump() +
                                 (v.get<double>() > 0 ? " rounds to 0 in float32; " : " ") +
                                 "must be > 0");
       }},
      // -1 is vLLM's "off", 0 ours.
      {"top_k",
       [&](const json& v) {
         r.sampling.top_k =
             static_cast<int32_t>(std::max<int64_t>(0, get_int(v, "top_k", -1, INT32_MAX)));
       }},
      {"seed",
       [&](const json& v) {
         r.sampling.seed = static_cast<uint64_t>(get_int(v, "seed", INT64_MIN, INT64_MAX));
         r.seed_given = true;
       }},
      {"stop", [&](const json& v) { parse_stop(v, r); }},
      {"stop_token_ids", [&](const json& v) { r.stop_token_ids = get_ids(v, "stop_token_ids"); }},
      {"ignore_eos", [&](const json& v) { r.ignore_eos = get_bool(v, "ignore_eos"); }},
      {"stream", [&](const json& v) { r.stream = get_bool(v, "stream"); }},
      {"stream_options", [&](const json& v) { stream_options = v; }},
      {"n", [&](const json& v) { r.n = static_cast<int32_t>(get_int(v, "n", 1, kMaxChoices)); }},
      {"user", [&](const json& v) { get_string(v, "user"); }},
      {"presence_penalty",
       [&](const json& v) {
         r.sampling.presence_penalty = static_cast<float>(get_real(v, "presence_penalty", -2, 2));
       }},
      {"frequency_penalty",
       [&](const json& v) {
         r.sampling.frequency_penalty = static_cast<float>(get_real(v, "frequency_penalty", -2, 2));
       }},
      {"repetition_penalty",
       [&](const json& v) {
         r.sampling.repetition_penalty =
             static_cast<float>(get_real(v, "repetition_penalty", 0, 100));
         if (!(r.sampling.repetition_penalty > 0))
           throw bad_request("repetition_penalty",
                             "repetition_penalty: " + v.dump() + " must be > 0");
       }},
      {"min_p",
       [&](const json& v) { r.sampling.min_p = static_cast<float>(get_real(v, "min_p", 0, 1)); }},
      {"min_tokens",
       [&](const json& v) { r.sampling.min_tokens = get_int(v, "min_tokens", 0, INT64_MAX); }},
      {"logit_bias", [&](const json& v) { r.sampling.logit_bias = parse_logit_bias(v); }},
      {"skip_special_tokens",
       [&](const json& v) { r.skip_special_tokens = get_bool(v, "skip_special_tokens"); }},
      {"include_stop_str_in_output",
       [&](const json& v) {
         r.include_stop_str_in_output = get_bool(v, "include_stop_str_in_output");
       }},
  };
  // Fields of one endpoint only; null is "not given" for them too.
  auto endpoint_field = [&](const std::string& key, const json& v) {
    static const std::map<std::string, bool> only = {
        {"max_completion_tokens", true},
        {"top_logprobs", true},
        {"response_format", true},
        {"tools", true},
        {"tool_choice", true},
        {"parallel_tool_calls", true},
        {"logprobs", true},  // both endpoints, different types
        {"echo", false},
        {"best_of", false},
        {"suffix", false}};
    const auto k = only.find(key);
    if (k == only.end() || (k->second && !chat && key != "logprobs")) return false;
    if (!k->second && chat) return false;
    if (v.is_null()) return true;
    if (chat) {
      if (key == "max_completion_tokens") {
        max_completion_tokens = get_int(v, "max_completion_tokens", 1, INT64_MAX);
      } else if (key == "logprobs")
        chat_logprobs = get_bool(v, "logprobs");
      else if (key == "top_logprobs")
        top_logprobs = get_int(v, "top_logprobs", 0, kMaxChatTopLogprobs);
      else if (key == "response_format")
        format = response_format_type(v);
      else if (key == "tools" || key == "tool_choice")
        tools_given = true;
      else if (key == "parallel_tool_calls")
        // Accepted either way: a constrained call is one call, and "auto" reads as many as the
        // output holds.
        get_bool(v, "parallel_tool_calls");
      else
        return false;
    } else {
      if (key == "logprobs")
        r.logprobs = static_cast<int32_t>(get_int(v, "logprobs", 0, kMaxCompletionLogprobs));
      else if (key == "echo")
        r.echo = get_bool(v, "echo");
      else if (key == "best_of")
        neutral_only(v, "best_of", 1, "one candidate per request");
      else if (key == "suffix")
        neutral_only(v, "suffix", nullptr, "no insertion");
      else
        return false;
    }
    return true;
  };
  for (const auto& [key, value] : doc.items()) {
    const auto f = fields.find(key);
    if (f == fields.end() && !endpoint_field(key, value))
      throw bad_request(key, "Unrecognized request argument supplied: " + key);
    if (value.is_null()) continue;  // not given
    if (f != fields.end()) f->second(value);
  }
  // Chat's two names of one limit: both given with different values is a request that cannot
  // be read one way (which one would win?), so it is refused.
  if (max_tokens && max_completion_tokens && *max_tokens != *max_completion_tokens)
    throw bad_request("max_completion_tokens",
                      "max_completion_tokens: " + std::to_string(*max_completion_tokens) +
                          " differs from max_tokens " + std::to_string(*max_tokens) +
                          "; give one of them");
  r.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  if (max_completion_tokens) r.max_tokens_param = "max_completion_tokens";
  if (r.max_tokens && r.sampling.min_tokens > *r.max_tokens)
    throw bad_request("min_tokens", "min_tokens: " + std::to_string(r.sampling.min_tokens) +
                                        " is more than " + r.max_tokens_param + " " +
                                        std::to_string(*r.max_tokens));
  // The prompt's logprobs are not computed: echo gives its text, not its tokens' entries.
  if (r.echo && r.logprobs >= 0)
    throw bad_request("echo", "echo: not with logprobs (the prompt's logprobs are not computed)");
  if (chat) {
    if (top_logprobs && !chat_logprobs)
      throw bad_request("top_logprobs", "top_logprobs: only allowed when logprobs is true");
    if (chat_logprobs) r.logprobs = static_cast<int32_t>(top_logprobs.value_or(0));
  }
  if (chat) {
    structured_output(body, format, tools_given, r);
    grammar_ends_the_output(r);
  }
  if (!have_input)
    throw bad_request(chat ? "messages" : "prompt",
                      std::string(chat ? "messages" : "prompt") + ": missing");
  if (stream_options) {
    if (!r.stream)
      throw bad_request("stream_options", "stream_options: only allowed when stream is true");
    if (!stream_options->is_object()) wrong_type("stream_options", "an object", *stream_options);
    for (const auto& [key, value] : stream_options->items()) {
      if (key != "include_usage")
        throw bad_request("stream_options." + key,
                          "Unrecognized argument supplied in stream_options: " + key);
      if (!value.is_null()) r.include_usage = get_bool(value, "stream_options.include_usage");
    }
  }
  return r;
}

}  // namespace flashserve::server
