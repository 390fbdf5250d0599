// Typed access to the fields of a config.json object, each error naming the file and the key:
// shared by the config reader (config.cc) and the RoPE reader (rope_config.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "flashserve/error.h"

namespace flashserve::model::config_json {

using nlohmann::json;

[[noreturn]] inline void bad(const std::string& source, const std::string& field,
                             const std::string& what,
                             ErrorKind kind = ErrorKind::kInvalidArgument) {
  throw Error(kind, source + ": " + field, what);
}

// A field that may be absent or null (Hugging Face writes null for "not set").
inline bool present(const json& j, const char* key) {
  return j.contains(key) && !j.at(key).is_null();
}

inline int64_t get_int(const json& j, const char* key, const std::string& source, bool required,
                       int64_t fallback) {
  if (!present(j, key)) {
    if (required) bad(source, key, "missing");
    return fallback;
  }
  const json& v = j.at(key);
  if (!v.is_number_integer()) bad(source, key, "must be an integer, not " + v.dump());
  if (v.is_number_unsigned() && v.get<uint64_t>() > std::numeric_limits<int64_t>::max())
    bad(source, key, v.dump() + " is beyond 64-bit integers");  // get<int64_t> would wrap
  return v.get<int64_t>();
}

inline double get_double(const json& j, const char* key, const std::string& source,
                         double fallback) {
  if (!present(j, key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_number()) bad(source, key, "must be a number, not " + v.dump());
  return v.get<double>();
}

inline bool get_bool(const json& j, const char* key, const std::string& source, bool fallback) {
  if (!present(j, key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_boolean()) bad(source, key, "must be true or false, not " + v.dump());
  return v.get<bool>();
}

// bos/eos may be one id or a list (Llama 3 instruct lists several end tokens), or absent: empty.
// Every id is checked against the int32 ids the engine uses (a plain cast would turn 2^32 + 1
// into 1); validate() then checks them against vocab_size.
inline std::vector<int32_t> get_tokens(const json& j, const char* key, const std::string& source) {
  if (!present(j, key)) return {};
  const json& v = j.at(key);
  if (v.is_array() && v.empty()) bad(source, key, "is an empty list");
  std::vector<int32_t> ids;
  for (const json& id : v.is_array() ? v : json::array({v})) {
    if (!id.is_number_integer()) bad(source, key, "must be a token id, not " + v.dump());
    if (id.is_number_unsigned() ? id.get<uint64_t>() > std::numeric_limits<int32_t>::max()
                                : id.get<int64_t>() < -1)
      bad(source, key, v.dump() + " is not a token id (0 to 2^31 - 1, or -1 for none)");
    const auto t = static_cast<int32_t>(id.get<int64_t>());
    if (t >= 0 && std::find(ids.begin(), ids.end(), t) == ids.end()) ids.push_back(t);
  }
  return ids;
}

// A string field of an object that may be absent; anything but a string is refused (nlohmann's
// value() would throw its own type_error for a number).
inline std::string get_string(const json& j, const char* key, const std::string& source,
                              const std::string& fallback) {
  if (!present(j, key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_string()) bad(source, key, "must be a string, not " + v.dump());
  return v.get<std::string>();
}

}  // namespace flashserve::model::config_json
