// JSON whose objects may not repeat a key. nlohmann (like Python's json) keeps the last value of a
// repeated key without a word; in a safetensors header or a shard index a repeated key is a
// tensor listed twice, and keeping one of the two silently is a wrong answer, so these files are
// parsed with this instead.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "flashserve/error.h"

namespace flashserve::model {

// Throws Error(kInvalidArgument, source, what + " is not valid JSON: ...") or
// Error(kInvalidArgument, source, what + " has the key 'k' twice in one object").
inline nlohmann::json parse_unique_json(std::string_view text, const std::string& source,
                                        const std::string& what) {
  using nlohmann::json;
  std::vector<std::set<std::string>> keys;  // one set per object being parsed
  std::string repeated;
  const json::parser_callback_t seen = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == json::parse_event_t::key && !keys.empty() && repeated.empty()) {
      if (!keys.back().insert(parsed.get<std::string>()).second)
        repeated = parsed.get<std::string>();
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), seen);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kInvalidArgument, source, what + " is not valid JSON: " + e.what());
  }
  if (!repeated.empty())
    throw Error(ErrorKind::kInvalidArgument, source,
                what + " has the key '" + repeated + "' twice in one object");
  return j;
}

}  // namespace flashserve::model
