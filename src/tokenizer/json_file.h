// Reading the JSON files of a model directory with errors that name the file.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "flashserve/error.h"

namespace flashserve::tokenizer {

// `what` names the file in errors ("tokenizer.json").
std::string read_file(const std::string& path, const std::string& what);
nlohmann::json parse_json(std::string_view text, const std::string& what);
// The same error with the path of the file it came from in its message.
Error in_file(const Error& e, const std::string& path);

}  // namespace flashserve::tokenizer
