// An error as the OpenAI API reports it: an HTTP status and the body
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// Every refusal of the server is one of these; a flashserve::Error from a layer below becomes one
// through from_error (ErrorKind decides the status).
#pragma once

#include <string>

#include "flashserve/error.h"

namespace flashserve::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the request field at fault ("" when none: JSON null)
  std::string code;   // a machine-readable code ("" when none: JSON null)

  // OpenAI's `type` for the status: invalid_request_error, authentication_error, ...
  std::string type() const;
  // The JSON body (invalid UTF-8 in a message, e.g. an echoed path, becomes U+FFFD).
  std::string body() const;
};

ApiError bad_request(std::string param, std::string message, std::string code = {});

// kInvalidArgument -> 400 naming the argument; kUnsupported -> 400 (well-formed, not served);
// kCuda / kInternal -> 500.
ApiError from_error(const Error& e, const std::string& param = {});

}  // namespace flashserve::server
