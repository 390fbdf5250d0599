#include "tokenizer/json_file.h"

#include <fstream>
#include <sstream>

namespace flashserve::tokenizer {

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kInvalidArgument, what, "cannot read '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json parse_json(std::string_view text, const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kInvalidArgument, what, std::string("not valid JSON: ") + e.what());
  }
}

Error in_file(const Error& e, const std::string& path) {
  std::string message = e.what();
  if (!e.argument().empty()) message.erase(0, e.argument().size() + 2);  // "argument: " prefix
  return Error(e.kind(), e.argument(), message + " (in '" + path + "')");
}

}  // namespace flashserve::tokenizer
