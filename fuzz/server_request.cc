// Fuzzes the HTTP server's request parsing (server/openai_request.h): the first byte picks the
// endpoint, the rest is the JSON body. Every input is either refused with an ApiError of status 400
// whose body is valid JSON, or parsed into a request that keeps the schema's promises: a prompt
// (text or non-negative ids) or messages, max_tokens >= 1 when given, sampling parameters the
// engine accepts, at most 4 non-empty stop strings. Anything else (another exception, a crash, a
// sanitizer report) is a bug.
// Registration (fuzz/CMakeLists.txt): flashserve_fuzz_target(server_request flashserve_server)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "flashserve/error.h"
#include "server/openai_request.h"

namespace fsv = flashserve::server;

namespace {
[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "server_request fuzz: %s\n", what);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const fsv::Endpoint endpoint = data[0] & 1 ? fsv::Endpoint::kChat : fsv::Endpoint::kCompletions;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const fsv::GenerationRequest r = fsv::parse_request(body, endpoint);
    if (endpoint == fsv::Endpoint::kChat) {
      if (r.messages.empty()) fail("chat request without messages");
      for (const auto& m : r.messages)
        if (m.role.empty()) fail("message without a role");
    } else if (!r.prompt_text && r.prompt_ids.empty()) {
      fail("completion without a prompt");
    }
    if (r.prompt_text && r.prompt_text->empty()) fail("empty text prompt accepted");
    for (int32_t id : r.prompt_ids)
      if (id < 0) fail("negative prompt id");
    for (int32_t id : r.stop_token_ids)
      if (id < 0) fail("negative stop token id");
    if (r.max_tokens && *r.max_tokens < 1) fail("max_tokens < 1 accepted");
    if (r.stop.size() > fsv::kMaxStopStrings) fail("too many stop strings");
    for (const auto& s : r.stop)
      if (s.empty()) fail("empty stop string");
    if (r.include_usage && !r.stream) fail("include_usage without stream");
    try {
      r.sampling.validate();
    } catch (const flashserve::Error&) {
      fail("sampling parameters the engine refuses were accepted");
    }
  } catch (const fsv::ApiError& e) {
    if (e.status != 400) fail("a refusal that is not 400");
    if (!nlohmann::json::accept(e.body())) fail("an error body that is not JSON");
  }
  return 0;
}
