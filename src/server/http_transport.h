// The HTTP/1.1 transport of `flashserve serve`: an event loop (Boost.Asio) that owns every
// connection, parses requests with Boost.Beast, and hands each complete request to the server's
// dispatch function. No thread is tied to a socket: a connection that is idle, slow or stalled
// costs a descriptor, a timer and a small buffer, not a thread (docs/server.md, "Transport").
//
//   HttpTransport t(limits, [](HttpRequest req, std::shared_ptr<HttpResponder> r) { ... });
//   int port = t.bind("127.0.0.1", 0);
//   t.run();   // until stop(), from another thread
//
// dispatch() runs on the event loop's thread and must not block: it answers at once
// (HttpResponder::respond) or hands the request to a worker thread (spawn), which may block
// (HttpResponder::write waits until the bytes are written or the client is gone).
//
// What the transport enforces on every connection, whatever the routes:
// - deadlines: the request's headers within header_timeout of its first byte (or of the accept),
//   its body within body_timeout of its headers, the next request of a keep-alive connection
//   within idle_timeout; a response write that makes no progress for write_timeout ends it;
// - at most max_connections open at once: one more is answered 503 and closed;
// - headers of at most max_header_bytes (431), a body of at most max_body_bytes (413), then the
//   connection closes, after the rest of the body was read and dropped (up to drain_bytes) so
//   that the client reads the answer instead of a reset.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashserve::server {

struct HttpLimits {
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds body_timeout{60'000};
  std::chrono::milliseconds idle_timeout{5'000};
  std::chrono::milliseconds write_timeout{30'000};
  // Open connections at once (also cut to what the descriptor limit allows, see bind()).
  int64_t max_connections = 16384;
  size_t max_header_bytes = 64 << 10;
  size_t max_body_bytes = 8 << 20;
  size_t drain_bytes = 64 << 20;  // of an oversized body, read and dropped before closing
};

// Counters of the transport, for /metrics. Any thread.
struct HttpTransportStats {
  std::atomic<int64_t> open{0};             // connections open now
  std::atomic<int64_t> accepted{0};         // connections accepted, refused ones included
  std::atomic<int64_t> refused{0};          // over max_connections: answered 503 and closed
  std::atomic<int64_t> header_timeouts{0};  // closed at their header deadline
  std::atomic<int64_t> body_timeouts{0};    // closed at their body deadline
  std::atomic<int64_t> idle_timeouts{0};    // keep-alive connections closed when idle
  std::atomic<int64_t> write_timeouts{0};   // a client that stopped reading its response
  std::atomic<int64_t> workers{0};          // worker threads running now
  // Requests handed to a handler whose response is not yet all written (or failed): a handler
  // that returned may have left its response queued on the event loop.
  std::atomic<int64_t> responding{0};
};

struct HttpRequest {
  std::string method;
  std::string path;  // the target without its query
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // The first header of this name (case-insensitive), or "".
  std::string header(std::string_view name) const;
};

struct HttpHeader {
  std::string name, value;
};

// The answer to one request, from any thread: either respond() once, or begin_stream(), write()
// any number of times and end_stream(). Dropping it unanswered answers 500; dropping it lets the
// connection go on to its next request (or close). The answer to a HEAD request goes without its
// body (the head a GET would get).
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  // A whole response. `close`: the connection closes after it.
  virtual void respond(int status, std::string_view content_type, std::string body,
                       std::vector<HttpHeader> headers = {}, bool close = false) = 0;
  // A response whose body comes in pieces (chunked). Blocks until the head is written; false:
  // the client is gone. Not from the event loop's thread.
  virtual bool begin_stream(int status, std::string_view content_type,
                            std::vector<HttpHeader> headers = {}) = 0;
  // Blocks until `data` is written; false: the client is gone (or stopped reading past the
  // write deadline, or the transport is stopping). Not from the event loop's thread.
  virtual bool write(std::string_view data) = 0;
  virtual void end_stream() = 0;
  // Whether the client has closed its end (EOF or an error on a peek that does not wait). A client
  // that half-closes (shutdown(SHUT_WR)) while it waits for the answer reads as gone, as in
  // servers that abort on EOF. Any thread, cheap: one recv(MSG_PEEK | MSG_DONTWAIT).
  virtual bool client_gone() const = 0;
};

class HttpTransport {
 public:
  using Dispatch = std::function<void(HttpRequest, std::shared_ptr<HttpResponder>)>;
  // Called with each response's status as it is sent (for the metrics), on any thread.
  using OnResponse = std::function<void(int status)>;
  // The body of an error the transport answers itself (a timeout, a malformed request, too many
  // connections): the server gives its own error format.
  using ErrorBody = std::function<std::string(int status, const std::string& message)>;

  HttpTransport(HttpLimits limits, Dispatch dispatch, OnResponse on_response, ErrorBody error_body);
  ~HttpTransport();  // stop()

  // Binds and listens (backlog SOMAXCONN); returns the port (port 0: a free one). Raises the
  // descriptor soft limit to the hard one, and cuts max_connections to what it leaves. Throws
  // Error naming --host (cannot resolve or bind with port 0) or --port (cannot bind it).
  int bind(const std::string& host, int port);
  // Runs the event loop on this thread until stop().
  void run();
  // Stops accepting, closes every connection, joins the worker threads and ends run(). Any thread
  // but the event loop's or a worker's; idempotent.
  void stop();
  // Runs `work` on a thread of its own, joined by stop(); counted in stats().workers.
  void spawn(std::function<void()> work);

  const HttpTransportStats& stats() const;
  const HttpLimits& limits() const;

  struct Impl;  // the event loop, its connections and workers (http_transport.cc)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashserve::server
