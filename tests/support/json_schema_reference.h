// A reference for the structured-output tests: whether a text is what server/json_schema.h's
// grammar may write for a schema, decided on nlohmann's parse, with JSON Schema's own reading of
// the subset's keywords (type, properties, required, additionalProperties, items, enum, const,
// anyOf) plus the writing rules the grammar adds: a JSON object at the top level with no
// whitespace around it, each object of a schema with properties writing only those, in the
// schema's order, each once (with `strict` all of them); keys never repeated. Written apart from
// the recognizer (no state machine), so the two can be compared on every short text.
#pragma once

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace flashserve::testing {

using ojson = nlohmann::ordered_json;

inline bool schema_type_is(const ojson& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  if (t == "number") return v.is_number();
  return t == "integer" && v.is_number_integer();  // the grammar writes integers without '.'/e
}

// JSON Schema validation of `v` against the subset, with the grammar's writing rules.
inline bool reference_valid(const ojson& v, const ojson& s, bool strict) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("const")) return v == s["const"];
  if (s.contains("enum"))
    return std::any_of(s["enum"].begin(), s["enum"].end(), [&](const ojson& e) {
      return e == v && e.type() == v.type();  // 1 and 1.0: the text written is the enum's own
    });
  if (s.contains("anyOf"))
    return std::any_of(s["anyOf"].begin(), s["anyOf"].end(),
                       [&](const ojson& b) { return reference_valid(v, b, strict); });
  if (s.contains("type")) {
    const ojson types = s["type"].is_array() ? s["type"] : ojson::array({s["type"]});
    if (std::none_of(types.begin(), types.end(),
                     [&](const ojson& t) { return schema_type_is(v, t.get<std::string>()); }))
      return false;
  }
  if (v.is_object() && s.contains("properties")) {
    const ojson& props = s["properties"];
    std::set<std::string> required;
    for (const auto& [name, sub] : props.items())
      if (strict) required.insert(name);
    if (s.contains("required"))
      for (const ojson& r : s["required"]) required.insert(r.get<std::string>());
    // Only the schema's properties, in its order.
    size_t at = 0;
    std::vector<std::string> order;
    for (const auto& [name, sub] : props.items()) order.push_back(name);
    for (const auto& [key, value] : v.items()) {
      while (at < order.size() && order[at] != key) ++at;
      if (at == order.size()) return false;
      if (!reference_valid(value, props[key], strict)) return false;
    }
    for (const std::string& r : required)
      if (!v.contains(r)) return false;
  } else if (v.is_object() && s.contains("additionalProperties") &&
             s["additionalProperties"] == false) {
    if (!v.empty()) return false;
  }
  if (v.is_array() && s.contains("items"))
    for (const ojson& x : v)
      if (!reference_valid(x, s["items"], strict)) return false;
  return true;
}

// Whether `text` is JSON whose objects never repeat a key.
inline bool reference_parse(const std::string& text, ojson& out) {
  std::vector<std::set<std::string>> open;
  bool repeated = false;
  out = ojson::parse(
      text,
      [&](int, ojson::parse_event_t event, ojson& parsed) {
        if (event == ojson::parse_event_t::object_start) open.emplace_back();
        if (event == ojson::parse_event_t::object_end) open.pop_back();
        if (event == ojson::parse_event_t::key &&
            !open.back().insert(parsed.get<std::string>()).second)
          repeated = true;
        return true;
      },
      /*allow_exceptions=*/false);
  return !out.is_discarded() && !repeated;
}

// What the grammar of `schema` must take as a whole text.
inline bool reference_accepts(const std::string& text, const ojson& schema, bool strict = false) {
  if (text.empty() || text.front() != '{' || text.back() != '}') return false;
  ojson v;
  return reference_parse(text, v) && v.is_object() && reference_valid(v, schema, strict);
}

}  // namespace flashserve::testing
