// ChatTemplate: tokenizer_config.json's chat_template rendered by our Jinja subset with the
// variables transformers' apply_chat_template passes (messages, add_generation_prompt,
// bos_token, eos_token, and tools when a request has them).
#include <filesystem>

#include "flashserve/error.h"
#include "tokenizer/jinja.h"
#include "tokenizer/json_file.h"
#include "tokenizer/tokenizer.h"

namespace flashserve::tokenizer {

struct ChatTemplate::Program {
  jinja::Template tmpl;
  std::string bos, eos;
};

namespace {

std::string token_text(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return {};
}

// JSON as the template sees it (Python's dicts and lists; a dict's keys in sorted order).
jinja::Value from_json(const nlohmann::json& v) {
  if (v.is_null()) return jinja::Value(jinja::None{});
  if (v.is_boolean()) return jinja::Value(v.get<bool>());
  if (v.is_number_integer()) return jinja::Value(v.get<int64_t>());
  if (v.is_number()) return jinja::Value(v.get<double>());
  if (v.is_string()) return jinja::Value(v.get<std::string>());
  if (v.is_array()) {
    jinja::List list;
    for (const auto& x : v) list.push_back(from_json(x));
    return jinja::Value(std::move(list));
  }
  jinja::Dict dict;
  for (const auto& [key, x] : v.items()) dict.emplace(key, from_json(x));
  return jinja::Value(std::move(dict));
}

jinja::Value parsed(const std::string& json_text) {
  return from_json(parse_json(json_text, "messages"));
}

}  // namespace

ChatTemplate::ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

ChatTemplate ChatTemplate::from_string(std::string source, std::string bos, std::string eos) {
  return ChatTemplate(std::make_shared<const Program>(
      Program{jinja::Template(source), std::move(bos), std::move(eos)}));
}

ChatTemplate ChatTemplate::from_file(const std::string& path, std::string bos, std::string eos) {
  try {
    return from_string(read_file(path, "--chat-template"), std::move(bos), std::move(eos));
  } catch (const Error& e) {
    throw in_file(e, path);
  }
}

ChatTemplate ChatTemplate::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;  // the throwing overloads would escape as filesystem_error, not Error
  const std::string path = (fs::path(model_dir) / "tokenizer_config.json").string();
  const nlohmann::json config =
      parse_json(read_file(path, "tokenizer_config.json"), "tokenizer_config.json");
  std::string bos = token_text(config, "bos_token"), eos = token_text(config, "eos_token");
  std::string source;
  const auto it = config.find("chat_template");
  if (it != config.end() && it->is_string()) {
    source = it->get<std::string>();
  } else if (it != config.end() && it->is_array()) {  // [{"name": ..., "template": ...}]
    // Compared, not converted: a name or template of another JSON type threw nlohmann's
    // type_error, which is not an Error and escaped the server's load.
    for (const auto& t : *it)
      if (t.is_object() && t.contains("name") && t.at("name") == "default" &&
          t.contains("template") && t.at("template").is_string())
        source = t.at("template").get<std::string>();
    if (source.empty())
      throw Error(ErrorKind::kUnsupported, "tokenizer_config.json: chat_template",
                  "a list of templates without a \"default\" one; pass --chat-template FILE");
  } else if (const fs::path side = fs::path(model_dir) / "chat_template.jinja";
             fs::exists(side, ec)) {
    return from_file(side.string(), std::move(bos), std::move(eos));  // newer transformers
  } else {
    throw Error(ErrorKind::kInvalidArgument, "tokenizer_config.json: chat_template",
                "missing in '" + path + "'; pass a template with --chat-template FILE");
  }
  try {
    return from_string(std::move(source), std::move(bos), std::move(eos));
  } catch (const Error& e) {
    throw in_file(e, path);
  }
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const std::string& tools_json) const {
  jinja::List list;
  for (const ChatMessage& m : messages) {
    jinja::Dict d{{"role", jinja::Value(m.role)}, {"content", jinja::Value(m.content)}};
    if (!m.tool_calls_json.empty()) d.emplace("tool_calls", parsed(m.tool_calls_json));
    if (!m.tool_call_id.empty()) d.emplace("tool_call_id", jinja::Value(m.tool_call_id));
    list.emplace_back(std::move(d));
  }
  jinja::Dict globals{{"messages", jinja::Value(std::move(list))},
                      {"add_generation_prompt", jinja::Value(add_generation_prompt)},
                      {"bos_token", jinja::Value(program_->bos)},
                      {"eos_token", jinja::Value(program_->eos)}};
  if (!tools_json.empty()) globals.emplace("tools", parsed(tools_json));
  return program_->tmpl.render(globals);
}

}  // namespace flashserve::tokenizer
