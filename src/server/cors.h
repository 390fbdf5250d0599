// CORS for browser clients (--allowed-origins): which origins may call, the preflight answer, and
// a responder that adds the allow header to every response of a request from an allowed origin,
// streamed or not, errors included (a browser hides a response without it from the page, so a
// 401 or a 400 would read as a network failure).
//
// Rules, as vLLM's (Starlette's CORSMiddleware) with credentials off: an allowed list with "*"
// answers `Access-Control-Allow-Origin: *`; otherwise a listed origin is echoed back with
// `Vary: Origin`; any other origin gets no CORS header (the browser then blocks the page's read).
// Preflights (OPTIONS with Origin and Access-Control-Request-Method) are 204 with the methods
// GET, POST, OPTIONS and the headers they ask for (Access-Control-Request-Headers; without it,
// Authorization, Content-Type), as under vLLM's default --allowed-headers '*'; 400 for an origin
// not allowed.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/http_transport.h"

namespace flashserve::server {

// The Access-Control-Allow-Origin value for `req` ("*" or its origin), or nullopt when it has no
// Origin header or its origin is not allowed.
std::optional<std::string> cors_allow_origin(const std::vector<std::string>& allowed,
                                             const HttpRequest& req);

// Whether `req` is a CORS preflight.
bool is_cors_preflight(const HttpRequest& req);

// Answers a preflight: 204 with the allow headers, or 400 when the origin is not allowed.
void answer_cors_preflight(const std::vector<std::string>& allowed, const HttpRequest& req,
                           HttpResponder& res);

// `inner`, adding `Access-Control-Allow-Origin: allow_origin` (and Vary: Origin unless "*") to
// its response.
std::shared_ptr<HttpResponder> with_cors(std::shared_ptr<HttpResponder> inner,
                                         std::string allow_origin);

}  // namespace flashserve::server
