#include "server/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <stdexcept>
#include <vector>

#include "server/api_error.h"

namespace flashserve::server {
namespace {

using ojson = nlohmann::ordered_json;
using Grammar = model::JsonGrammar;
using Kind = Grammar::Kind;

constexpr const char* kSubset =
    "type, properties, required, additionalProperties, items, enum, const, anyOf and the "
    "annotations title, description, default, examples, $comment, $schema";
// Schemas nest at most this deep (the recognizer's stack holds kMaxDepth open containers).
constexpr int kMaxSchemaDepth = 24;

const std::set<std::string> kAnnotations = {"title",    "description", "default",
                                            "examples", "$comment",    "$schema"};
const std::set<std::string> kKeywords = {"type",  "properties", "required", "additionalProperties",
                                         "items", "enum",       "const",    "anyOf"};
const std::vector<std::string> kTypes = {"object",  "array",   "string", "number",
                                         "integer", "boolean", "null"};

// The JSON types a value has, as `type` names them (an integer is a number too).
bool has_type(const ojson& v, const std::string& type) {
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "integer")
    return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                     v.get<double>() == std::floor(v.get<double>()));
  if (type == "number") return v.is_number();
  if (type == "object") return v.is_object();
  return type == "array" && v.is_array();
}

class Compiler {
 public:
  Compiler(Grammar& g, bool strict) : g_(g), strict_(strict) {}

  int32_t compile(const ojson& s, const std::string& path, int depth) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return Grammar::kAnyValue;
      throw bad_request(path, path + ": the schema false admits no value");
    }
    if (!s.is_object()) throw bad_request(path, path + ": expected a schema (an object)");
    if (depth > kMaxSchemaDepth)
      throw bad_request(path, path + ": schemas nested deeper than " +
                                  std::to_string(kMaxSchemaDepth) + " levels are not supported");
    for (const auto& [key, value] : s.items()) {
      if (kKeywords.count(key)) continue;
      if (!kAnnotations.count(key))
        throw bad_request(path + "." + key, path + ": the keyword '" + key +
                                                "' is not supported (the subset: " + kSubset + ")");
      if ((key == "title" || key == "description" || key == "$comment" || key == "$schema") &&
          !value.is_string())
        throw bad_request(path + "." + key, path + "." + key + ": expected a string");
    }
    const std::vector<std::string> types = type_list(s, path);
    if (s.contains("enum") || s.contains("const")) return literal_set(s, path, types);
    if (s.contains("anyOf")) return any_of(s, path, depth);
    // Keywords of one type beside a `type` that does not include it would constrain nothing.
    for (const char* k : {"properties", "required", "additionalProperties"})
      if (s.contains(k) && !types.empty() && !contains(types, "object"))
        throw bad_request(path + "." + k,
                          path + "." + k + ": only with type object (the type is not object)");
    if (s.contains("items") && !types.empty() && !contains(types, "array"))
      throw bad_request(path + ".items", path + ".items: only with type array");
    std::vector<std::string> kinds = types;
    if (kinds.empty()) {
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
        kinds = {"object"};
      else if (s.contains("items"))
        kinds = {"array"};
      else
        return Grammar::kAnyValue;
    }
    if (contains(kinds, "number"))  // an integer is a number: one branch covers both
      kinds.erase(std::remove(kinds.begin(), kinds.end(), "integer"), kinds.end());
    std::vector<int32_t> nodes;
    for (const std::string& t : kinds) nodes.push_back(of_type(t, s, path, depth));
    if (nodes.size() == 1) return nodes[0];
    return union_of(nodes, path + ".type", path + ".type");
  }

 private:
  static bool contains(const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  }

  int32_t add(const std::string& path, const std::function<int32_t()>& make) {
    try {
      return make();
    } catch (const std::length_error& e) {
      throw bad_request(path, path + ": the schema is too large (" + e.what() + ")");
    }
  }

  static std::vector<std::string> type_list(const ojson& s, const std::string& path) {
    const auto t = s.find("type");
    if (t == s.end()) return {};
    const std::string at = path + ".type";
    std::vector<std::string> out;
    const ojson list = t->is_array() ? *t : ojson::array({*t});
    if (list.empty()) throw bad_request(at, at + ": an empty list of types");
    for (const ojson& x : list) {
      if (!x.is_string()) throw bad_request(at, at + ": expected a type name or a list of them");
      const std::string name = x.get<std::string>();
      if (!contains(kTypes, name))
        throw bad_request(at, at + ": '" + name +
                                  "' is not a type (object, array, string, number, integer, "
                                  "boolean, null)");
      if (contains(out, name)) throw bad_request(at, at + ": '" + name + "' twice");
      out.push_back(name);
    }
    return out;
  }

  int32_t literal_set(const ojson& s, const std::string& path,
                      const std::vector<std::string>& types) {
    for (const char* k : {"properties", "required", "additionalProperties", "items", "anyOf"})
      if (s.contains(k))
        throw bad_request(path + "." + k, path + "." + k + ": not beside enum or const");
    if (s.contains("enum") && s.contains("const"))
      throw bad_request(path + ".const", path + ".const: not beside enum (give one of them)");
    const bool is_enum = s.contains("enum");
    const std::string at = path + (is_enum ? ".enum" : ".const");
    const ojson values = is_enum ? s.at("enum") : ojson::array({s.at("const")});
    if (!values.is_array()) throw bad_request(at, at + ": expected an array");
    if (values.empty()) throw bad_request(at, at + ": empty (no value would validate)");
    std::vector<std::string> texts;
    for (size_t i = 0; i < values.size(); ++i) {
      const ojson& v = values[i];
      const std::string vat = is_enum ? at + "[" + std::to_string(i) + "]" : at;
      if (v.is_object() || v.is_array())
        throw bad_request(vat, vat + ": only strings, numbers, booleans and null are supported");
      if (!types.empty() &&
          std::none_of(types.begin(), types.end(), [&](const auto& t) { return has_type(v, t); }))
        throw bad_request(vat, vat + ": " + v.dump() + " is not of the schema's type");
      const std::string text = v.dump(-1, ' ', false, ojson::error_handler_t::strict);
      if (!contains(texts, text)) texts.push_back(text);
    }
    return add(at, [&] { return g_.literals(texts); });
  }

  int32_t union_of(const std::vector<int32_t>& nodes, const std::string& param,
                   const std::string& at) {
    uint8_t clash = 0;
    const int32_t n = add(at, [&] { return g_.any_of(nodes, &clash); });
    if (n < 0)
      throw bad_request(param, at + ": branches that may start with the same byte ('" +
                                   std::string(1, static_cast<char>(clash)) +
                                   "') are not supported (each branch must start differently: "
                                   "an object, an array, a string, a number, a boolean, null)");
    return n;
  }

  int32_t any_of(const ojson& s, const std::string& path, int depth) {
    const std::string at = path + ".anyOf";
    for (const char* k : {"type", "properties", "required", "additionalProperties", "items"})
      if (s.contains(k))
        throw bad_request(path + "." + k,
                          path + "." + k + ": not beside anyOf (put it in each branch)");
    const ojson& branches = s.at("anyOf");
    if (!branches.is_array() || branches.empty())
      throw bad_request(at, at + ": expected a non-empty array of schemas");
    std::vector<int32_t> nodes;
    for (size_t i = 0; i < branches.size(); ++i)
      nodes.push_back(compile(branches[i], at + "[" + std::to_string(i) + "]", depth + 1));
    return union_of(nodes, at, at);
  }

  int32_t of_type(const std::string& t, const ojson& s, const std::string& path, int depth) {
    if (t == "object") return object(s, path, depth);
    if (t == "array") {
      const int32_t items = s.contains("items") ? compile(s.at("items"), path + ".items", depth + 1)
                                                : Grammar::kAnyValue;
      return add(path, [&] { return g_.array(items); });
    }
    if (t == "string") return add(path, [&] { return g_.scalar(Kind::kString); });
    if (t == "number") return add(path, [&] { return g_.scalar(Kind::kNumber); });
    if (t == "integer") return add(path, [&] { return g_.scalar(Kind::kInteger); });
    if (t == "boolean") return add(path, [&] { return g_.literals({"true", "false"}); });
    return add(path, [&] { return g_.literals({"null"}); });
  }

  int32_t object(const ojson& s, const std::string& path, int depth) {
    bool additional = true;
    if (const auto a = s.find("additionalProperties"); a != s.end()) {
      if (!a->is_boolean())
        throw bad_request(path + ".additionalProperties",
                          path +
                              ".additionalProperties: only true or false is supported (not a "
                              "schema)");
      additional = a->get<bool>();
    }
    std::vector<std::string> required;
    if (const auto r = s.find("required"); r != s.end()) {
      const std::string at = path + ".required";
      if (!r->is_array()) throw bad_request(at, at + ": expected an array of property names");
      for (const ojson& name : *r) {
        if (!name.is_string()) throw bad_request(at, at + ": expected an array of property names");
        required.push_back(name.get<std::string>());
      }
    }
    const auto props = s.find("properties");
    if (props == s.end()) {
      if (!required.empty())
        throw bad_request(path + ".required", path + ".required: '" + required.front() +
                                                  "' is not in properties (an object schema "
                                                  "without properties writes no property)");
      // Any object; none at all without additional properties.
      return additional ? Grammar::kAnyObject : add(path, [&] { return g_.object({}); });
    }
    if (!props->is_object())
      throw bad_request(path + ".properties", path + ".properties: expected an object of schemas");
    for (const std::string& name : required)
      if (!props->contains(name))
        throw bad_request(path + ".required", path + ".required: '" + name +
                                                  "' is not in properties (only the properties "
                                                  "named are written)");
    std::vector<Grammar::Property> properties;
    for (const auto& [name, sub] : props->items()) {
      const int32_t value = compile(sub, path + ".properties." + name, depth + 1);
      properties.push_back({ojson(name).dump(-1, ' ', false, ojson::error_handler_t::strict), value,
                            strict_ || contains(required, name)});
    }
    return add(path, [&] { return g_.object(properties); });
  }

  Grammar& g_;
  bool strict_;
};

}  // namespace

int32_t compile_json_schema(const ojson& schema, const std::string& path, bool strict,
                            Grammar& grammar) {
  try {
    return Compiler(grammar, strict).compile(schema, path, 0);
  } catch (const ojson::type_error& e) {  // a string that is not UTF-8 (dump's strict mode)
    throw bad_request(path, path + ": " + e.what());
  }
}

std::shared_ptr<const Grammar> json_schema_grammar(const ojson& schema, const std::string& path,
                                                   bool strict) {
  auto g = std::make_shared<Grammar>();
  const int32_t root = compile_json_schema(schema, path, strict, *g);
  if (g->node(root).kind != Kind::kObject)
    throw bad_request(path, path +
                                ": the top level must be an object schema ({\"type\": \"object\", "
                                "...}): a completion is one JSON object");
  g->set_root(root);
  return g;
}

}  // namespace flashserve::server
