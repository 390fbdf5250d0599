#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace flashserve::server {

std::string ApiError::type() const {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 503:
      return "service_unavailable_error";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string ApiError::body() const {
  nlohmann::json e = {
      {"message", message}, {"type", type()}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return nlohmann::json{{"error", e}}.dump(-1, ' ', false,
                                           nlohmann::json::error_handler_t::replace);
}

ApiError bad_request(std::string param, std::string message, std::string code) {
  return {400, std::move(message), std::move(param), std::move(code)};
}

ApiError from_error(const Error& e, const std::string& param) {
  switch (e.kind()) {
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kUnsupported:
      return {400, e.what(), param.empty() ? e.argument() : param, {}};
    default:
      return {500, e.what(), {}, {}};
  }
}

}  // namespace flashserve::server
