#include "server/cors.h"

#include <algorithm>
#include <utility>

namespace flashserve::server {

namespace {

class CorsResponder final : public HttpResponder {
 public:
  CorsResponder(std::shared_ptr<HttpResponder> inner, std::string allow_origin)
      : inner_(std::move(inner)), allow_origin_(std::move(allow_origin)) {}
  void respond(int status, std::string_view content_type, std::string body,
               std::vector<HttpHeader> headers, bool close) override {
    inner_->respond(status, content_type, std::move(body), add(std::move(headers)), close);
  }
  bool begin_stream(int status, std::string_view content_type,
                    std::vector<HttpHeader> headers) override {
    return inner_->begin_stream(status, content_type, add(std::move(headers)));
  }
  bool write(std::string_view data) override { return inner_->write(data); }
  void end_stream() override { inner_->end_stream(); }
  bool client_gone() const override { return inner_->client_gone(); }

 private:
  std::vector<HttpHeader> add(std::vector<HttpHeader> headers) const {
    headers.push_back({"Access-Control-Allow-Origin", allow_origin_});
    // A cache must not serve one origin's echoed answer to another.
    if (allow_origin_ != "*") headers.push_back({"Vary", "Origin"});
    return headers;
  }

  std::shared_ptr<HttpResponder> inner_;
  std::string allow_origin_;
};

}  // namespace

std::optional<std::string> cors_allow_origin(const std::vector<std::string>& allowed,
                                             const HttpRequest& req) {
  const std::string origin = req.header("Origin");
  if (origin.empty()) return std::nullopt;
  if (std::find(allowed.begin(), allowed.end(), "*") != allowed.end()) return "*";
  if (std::find(allowed.begin(), allowed.end(), origin) != allowed.end()) return origin;
  return std::nullopt;
}

bool is_cors_preflight(const HttpRequest& req) {
  return req.method == "OPTIONS" && !req.header("Origin").empty() &&
         !req.header("Access-Control-Request-Method").empty();
}

void answer_cors_preflight(const std::vector<std::string>& allowed, const HttpRequest& req,
                           HttpResponder& res) {
  const std::optional<std::string> allow = cors_allow_origin(allowed, req);
  if (!allow) return res.respond(400, "text/plain", "Disallowed CORS origin");
  // The headers the preflight asks for are allowed, as vLLM's default (--allowed-headers '*')
  // does: a browser's openai SDK sends its own (x-stainless-*), and a preflight that leaves any of
  // them out makes the browser block the call.
  std::string asked = req.header("Access-Control-Request-Headers");
  std::vector<HttpHeader> headers = {
      {"Access-Control-Allow-Origin", *allow},
      {"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
      {"Access-Control-Allow-Headers",
       asked.empty() ? std::string("Authorization, Content-Type") : std::move(asked)},
      {"Access-Control-Max-Age", "600"}};
  if (*allow != "*") headers.push_back({"Vary", "Origin"});
  res.respond(204, "text/plain", "", std::move(headers));
}

std::shared_ptr<HttpResponder> with_cors(std::shared_ptr<HttpResponder> inner,
                                         std::string allow_origin) {
  return std::make_shared<CorsResponder>(std::move(inner), std::move(allow_origin));
}

}  // namespace flashserve::server
