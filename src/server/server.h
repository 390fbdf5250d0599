// The OpenAI-compatible HTTP server: a route table over the event-driven transport
// (server/http_transport.h), in front of the engine's
// thread-safe front door (engine/front_door.h). It listens before the model is loaded and answers
// 503 until the loader is done, so clients and probes can tell "loading" from "down".
//
//   Server s(options, [] { return load_backend(...); });
//   s.bind();   // the port (options.port 0: a free one)
//   s.run();    // serves until stop(); throws if the loader threw
//
// Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, POST /tokenize,
// POST /detokenize, GET /version, GET /health, GET /metrics (the GET routes take HEAD too).
// Another method on one of them is 405 with Allow; another path 404. The /v1 routes, /tokenize
// and /detokenize need `Authorization: Bearer <key>` with one of the api keys when any is set.
// With allowed origins, every response carries CORS headers for them and OPTIONS preflights are
// answered (server/cors.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/front_door.h"
#include "server/http_transport.h"
#include "server/text_codec.h"

namespace flashserve::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> api_keys;  // none: no authentication
  // The names clients may send as `model` (at least one); the first is the default, used when a
  // request leaves `model` out.
  std::vector<std::string> served_model_names;
  // CORS: origins ("*": any) whose browsers may call; none: no CORS headers, and a preflight
  // is an OPTIONS like any other (405 on a route, 404 elsewhere).
  std::vector<std::string> allowed_origins;
  // Generation requests in flight at once (n choices count n); one more is refused at once with
  // 503 (overloaded) and Retry-After. Each holds a worker thread while it runs.
  int64_t max_concurrent_requests = 1024;
  size_t max_body_bytes = 8 << 20;  // larger bodies get 413
  // Connections: deadlines, the bound on open ones (max_body_bytes above is the body limit).
  HttpLimits http;
  // Bytes of text prompts (and rendered chats) tokenized at once; later ones wait their turn
  // (server/byte_budget.h). Bounds the tokenizer's memory, about 25 bytes per byte at worst.
  size_t tokenize_budget_bytes = 64 << 20;
};

// What serves generation once the model is loaded.
struct Backend {
  std::unique_ptr<engine::EngineLoop> loop;
  std::unique_ptr<TextCodec> codec;  // null: the model directory has no tokenizer
  int64_t max_model_len = 0;
  // The engine caches prompt blocks: a request's other choices are submitted once its first
  // has prefilled, and find the prompt's blocks instead of computing them again.
  bool prefix_caching = false;
};

class Server {
 public:
  using Loader = std::function<Backend()>;
  Server(ServerOptions options, Loader load);
  ~Server();
  // Binds the listening socket and starts the loader; returns the port. Throws Error naming
  // --host / --port when the address cannot be bound.
  int bind();
  // Serves until stop(). Throws the loader's error (the process should exit) if loading failed,
  // and Error(kInternal, "engine") if the engine failed (a step threw) and the server stopped.
  void run();
  void stop();
  bool ready() const { return ready_.load(); }

 private:
  struct State;
  std::unique_ptr<State> s_;
  std::atomic<bool> ready_{false};
};

}  // namespace flashserve::server
