#include "tokenizer/json_file.h"

#include "common/read_file.h"

namespace flashserve::tokenizer {

std::string read_file(const std::string& path, const std::string& what) {
  // The checked reader refuses a directory (which read as an empty file, then "not valid JSON")
  // and a named pipe (whose open blocked forever).
  try {
    return flashserve::read_file(path);
  } catch (const Error& e) {  // e: "PATH: why"
    const std::string why = std::string(e.what()).substr(e.argument().size() + 2);
    throw Error(e.kind(), what, "cannot read '" + path + "': " + why);
  }
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
