// Top-level fields of a request body read with their objects' keys in the order written
// (nlohmann::ordered_json), for what keeps meaning in that order: a JSON schema's properties are
// written in the schema's order, and a tool's parameters reach the chat template as given.
// nlohmann's own ordered parse looks each key up linearly (quadratic in an object's size), so this
// is a SAX reader that finds duplicates through a hash per open object: linear in the body.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>

namespace flashserve::server {

// The values of the top-level `fields` of `body` (a JSON object already parsed once: malformed
// text gives an empty map). A key written twice keeps its last value, as nlohmann::json does.
std::map<std::string, nlohmann::ordered_json> ordered_fields(std::string_view body,
                                                             const std::set<std::string>& fields);

}  // namespace flashserve::server
