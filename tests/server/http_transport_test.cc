// The HTTP transport alone (server/http_transport.h), over raw sockets: stalled connections do not
// keep others from being served, each deadline closes its connection (not before it), the bound on
// open connections refuses cleanly, limits and malformed requests are answered, pipelined
// requests are answered in order, streams are chunked, a client that hangs up is seen, and a
// client that stops reading ends its response at the write deadline.
//
// Timing: a deadline is checked from below only (a timer never fires early); from above, the
// tests wait up to kPatience, far past any deadline here, so that a slow machine cannot fail them.
#include "server/http_transport.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace fsv = flashserve::server;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

constexpr auto kPatience = 20s;

// What a worker saw, for the tests to look at.
struct Seen {
  std::atomic<bool> write_failed{false};
  std::atomic<bool> gone{false};
  std::atomic<int64_t> written{0};
};

struct Transport {
  std::unique_ptr<fsv::HttpTransport> t;
  std::thread loop;
  int port = 0;
  std::shared_ptr<Seen> seen = std::make_shared<Seen>();

  explicit Transport(fsv::HttpLimits limits) {
    ::signal(SIGPIPE, SIG_IGN);
    auto seen_ = seen;
    // The dispatch runs on the loop's thread, which starts below, once `t` is set.
    t = std::make_unique<fsv::HttpTransport>(
        limits,
        [this, seen_](fsv::HttpRequest req, std::shared_ptr<fsv::HttpResponder> res) {
          if (req.path == "/echo")
            return res->respond(200, "text/plain", req.method + " " + req.body);
          if (req.path == "/stream") {  // ?n pieces of 1000 bytes, or until a write fails
            const int64_t n = req.body.empty() ? 3 : std::stoll(req.body);
            return t->spawn([res, n, seen_] {
              if (!res->begin_stream(200, "text/plain")) return;
              const std::string piece(1000, 'x');
              for (int64_t i = 0; i < n; ++i) {
                if (!res->write(piece)) {
                  seen_->write_failed = true;
                  return;
                }
                ++seen_->written;
              }
              res->end_stream();
            });
          }
          if (req.path == "/big")  // a whole response of ?n bytes, answered at once
            return res->respond(200, "text/plain", std::string(std::stoull(req.body), 'y'));
          if (req.path == "/wait-gone")  // answers only once the client has hung up
            return t->spawn([res, seen_] {
              const auto t0 = Clock::now();
              while (!res->client_gone() && Clock::now() - t0 < kPatience)
                std::this_thread::sleep_for(2ms);
              seen_->gone = res->client_gone();
            });
          res->respond(404, "text/plain", "no route");
        },
        nullptr,
        [](int status, const std::string& message) {
          return json{{"error", {{"message", message}, {"status", status}}}}.dump();
        });
    port = t->bind("127.0.0.1", 0);
    loop = std::thread([this] { t->run(); });
  }
  ~Transport() {
    t->stop();
    loop.join();
  }
  const fsv::HttpTransportStats& stats() const { return t->stats(); }
};

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ADD_FAILURE() << "cannot connect";
    return -1;
  }
  return fd;
}

void send_all(int fd, const std::string& s) {
  size_t at = 0;
  while (at < s.size()) {
    const ssize_t n = ::send(fd, s.data() + at, s.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;
    at += static_cast<size_t>(n);
  }
}

// Reads until EOF (true) or until `done(bytes so far)` says enough (false), kPatience at most.
struct Read {
  std::string bytes;
  bool eof = false;
};
Read read_until(int fd, const std::function<bool(const std::string&)>& done = nullptr) {
  Read r;
  const auto t0 = Clock::now();
  char buf[65536];
  while (Clock::now() - t0 < kPatience) {
    if (done && done(r.bytes)) return r;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      r.eof = true;
      return r;
    }
    r.bytes.append(buf, static_cast<size_t>(n));
  }
  ADD_FAILURE() << "no EOF within the patience; got " << r.bytes.substr(0, 200);
  return r;
}

bool has_response(const std::string& s) {
  const size_t head = s.find("\r\n\r\n");
  if (head == std::string::npos) return false;
  const size_t cl = s.find("Content-Length: ");
  if (cl == std::string::npos || cl > head) return true;
  return s.size() >= head + 4 + std::stoul(s.substr(cl + 16));
}

std::string get(const std::string& path, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + extra + "\r\n";
}

int status_of(const std::string& response) {
  return response.size() > 12 ? std::stoi(response.substr(9, 3)) : -1;
}

std::string body_of(const std::string& response) {
  const size_t head = response.find("\r\n\r\n");
  return head == std::string::npos ? "" : response.substr(head + 4);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

// A thread-per-connection server serves nobody else once its threads wait on stalled sockets;
// here 400 of them (half a request each, a header deadline far away) cost no thread (400 and
// their 400 server ends stay under a descriptor limit of 1024).
TEST(HttpTransport, StalledConnectionsDoNotKeepOthersFromBeingServed) {
  fsv::HttpLimits limits;
  limits.header_timeout = 60s;
  Transport s(limits);
  std::vector<int> stalled;
  for (int i = 0; i < 400; ++i) {
    stalled.push_back(connect_to(s.port));
    send_all(stalled.back(), "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Le");
  }
  const auto t0 = Clock::now();
  while (s.stats().open.load() < 400 && Clock::now() - t0 < kPatience)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(s.stats().open.load(), 400);
  for (int i = 0; i < 20; ++i) {
    const int fd = connect_to(s.port);
    send_all(fd, get("/echo", "Connection: close\r\n"));
    const Read r = read_until(fd);
    EXPECT_EQ(status_of(r.bytes), 200) << r.bytes;
    EXPECT_EQ(body_of(r.bytes), "GET ");
    ::close(fd);
  }
  for (int fd : stalled) ::close(fd);
  EXPECT_EQ(s.stats().header_timeouts.load(), 0);
}

// Half a request's headers: 408 with the error body and closed, at the header deadline and not
// before it.
TEST(HttpTransport, HeadersPastTheirDeadlineGet408AndTheConnectionCloses) {
  fsv::HttpLimits limits;
  limits.header_timeout = 300ms;
  Transport s(limits);
  const auto t0 = Clock::now();
  const int fd = connect_to(s.port);
  send_all(fd, "GET /echo HTTP/1.1\r\nHo");
  const Read r = read_until(fd);
  EXPECT_GE(seconds_since(t0), 0.3);
  EXPECT_TRUE(r.eof);
  EXPECT_EQ(status_of(r.bytes), 408) << r.bytes;
  EXPECT_NE(json::parse(body_of(r.bytes))["error"]["message"].get<std::string>().find(
                "--http-header-timeout"),
            std::string::npos);
  EXPECT_EQ(s.stats().header_timeouts.load(), 1);
  ::close(fd);
  // A connection that never says a thing is stalled too, and closed quietly at the same
  // deadline: there is no request to answer.
  const auto t1 = Clock::now();
  const int silent = connect_to(s.port);
  const Read quiet = read_until(silent);
  EXPECT_GE(seconds_since(t1), 0.3);
  EXPECT_TRUE(quiet.eof);
  EXPECT_TRUE(quiet.bytes.empty()) << quiet.bytes;
  EXPECT_EQ(s.stats().header_timeouts.load(), 2);
  ::close(silent);
}

// A new connection's headers have header_timeout from the accept in all, not from their first
// byte: a client that dribbles its headers does not keep the connection open. The headers begin
// at 0.8 s and end at 1.4 s, past the accept's deadline (1 s) and before a first byte's (1.8 s):
// 408, never the answer.
TEST(HttpTransport, ANewConnectionsHeadersHaveTheirDeadlineFromTheAccept) {
  fsv::HttpLimits limits;
  limits.header_timeout = 1000ms;
  Transport s(limits);
  const auto t0 = Clock::now();
  const int fd = connect_to(s.port);
  std::this_thread::sleep_for(800ms);
  send_all(fd, "GET /echo HTTP/1.1\r\nHo");
  std::this_thread::sleep_for(600ms);
  send_all(fd, "st: x\r\n\r\n");
  const Read r = read_until(fd);
  EXPECT_GE(seconds_since(t0), 1.0);
  EXPECT_TRUE(r.eof);
  EXPECT_EQ(status_of(r.bytes), 408) << r.bytes;
  EXPECT_EQ(s.stats().header_timeouts.load(), 1);
  ::close(fd);
}

TEST(HttpTransport, ABodyPastItsDeadlineGets408AndTheConnectionCloses) {
  fsv::HttpLimits limits;
  limits.body_timeout = 300ms;
  Transport s(limits);
  const int fd = connect_to(s.port);
  // Before the send: the server's clock starts once it has the headers, after this.
  const auto t0 = Clock::now();
  send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789");
  const Read r = read_until(fd);
  EXPECT_GE(seconds_since(t0), 0.3);
  EXPECT_TRUE(r.eof);
  EXPECT_EQ(status_of(r.bytes), 408) << r.bytes;
  EXPECT_EQ(s.stats().body_timeouts.load(), 1);
  ::close(fd);
}

// A keep-alive connection serves request after request, then closes when idle for idle_timeout.
TEST(HttpTransport, AnIdleKeepAliveConnectionClosesAtItsTimeout) {
  fsv::HttpLimits limits;
  limits.idle_timeout = 300ms;
  Transport s(limits);
  const int fd = connect_to(s.port);
  Clock::time_point t0;
  for (int i = 0; i < 3; ++i) {
    // Before the last request is sent: the server's idle clock starts once it has answered it.
    t0 = Clock::now();
    send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n" + std::to_string(i));
    const Read r = read_until(fd, has_response);
    ASSERT_FALSE(r.eof);
    EXPECT_EQ(body_of(r.bytes), "POST " + std::to_string(i));
  }
  const Read r = read_until(fd);
  EXPECT_GE(seconds_since(t0), 0.3);
  EXPECT_TRUE(r.eof);
  EXPECT_TRUE(r.bytes.empty()) << r.bytes;  // closed quietly: there was no request
  EXPECT_EQ(s.stats().idle_timeouts.load(), 1);
  ::close(fd);
}

// Past max_connections a connection gets 503 with Retry-After and is closed; once one closes,
// a new one is served again.
TEST(HttpTransport, ConnectionsPastTheBoundAreRefusedWith503) {
  fsv::HttpLimits limits;
  limits.max_connections = 3;
  limits.header_timeout = 60s;
  Transport s(limits);
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) held.push_back(connect_to(s.port));
  const auto t0 = Clock::now();
  while (s.stats().open.load() < 3 && Clock::now() - t0 < kPatience)
    std::this_thread::sleep_for(1ms);
  const int extra = connect_to(s.port);
  send_all(extra, get("/echo"));
  const Read r = read_until(extra);
  EXPECT_TRUE(r.eof);
  EXPECT_EQ(status_of(r.bytes), 503) << r.bytes;
  EXPECT_NE(r.bytes.find("Retry-After: 1\r\n"), std::string::npos) << r.bytes;
  EXPECT_NE(json::parse(body_of(r.bytes))["error"]["message"].get<std::string>().find(
                "too many open connections"),
            std::string::npos);
  EXPECT_EQ(s.stats().refused.load(), 1);
  ::close(extra);
  ::close(held[0]);
  while (s.stats().open.load() > 2 && Clock::now() - t0 < kPatience)
    std::this_thread::sleep_for(1ms);
  const int next = connect_to(s.port);
  send_all(next, get("/echo", "Connection: close\r\n"));
  EXPECT_EQ(status_of(read_until(next).bytes), 200);
  ::close(next);
  for (size_t i = 1; i < held.size(); ++i) ::close(held[i]);
}

TEST(HttpTransport, LimitsAndMalformedRequestsAreAnsweredThenClosed) {
  fsv::HttpLimits limits;
  limits.max_body_bytes = 1000;
  limits.max_header_bytes = 2000;
  Transport s(limits);
  const auto answer = [&](const std::string& request) {
    const int fd = connect_to(s.port);
    send_all(fd, request);
    const Read r = read_until(fd);
    ::close(fd);
    EXPECT_TRUE(r.eof) << request.substr(0, 80);
    return r.bytes;
  };
  // A declared length past the limit: 413 at once (the body is read and dropped, then closed).
  std::string r = answer("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" +
                         std::string(5000, 'b'));
  EXPECT_EQ(status_of(r), 413) << r;
  // Chunked past the limit.
  std::string chunks;
  for (int i = 0; i < 5; ++i) chunks += "200\r\n" + std::string(512, 'c') + "\r\n";
  r = answer("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks +
             "0\r\n\r\n");
  EXPECT_EQ(status_of(r), 413) << r;
  // Within the limit, chunked: the whole body is handed over.
  r = answer(
      "POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: "
      "chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  EXPECT_EQ(body_of(r), "POST abcde") << r;
  r = answer("GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(3000, 'h') + "\r\n\r\n");
  EXPECT_EQ(status_of(r), 431) << r;
  r = answer("NOT AN HTTP REQUEST\r\n\r\n");
  EXPECT_EQ(status_of(r), 400) << r;
  EXPECT_TRUE(json::parse(body_of(r))["error"].contains("message")) << r;
  r = answer("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: -4\r\n\r\n");
  EXPECT_EQ(status_of(r), 400) << r;
  // Expect: 100-continue within the limit: "100 Continue" first, then the answer.
  const int fd = connect_to(s.port);
  send_all(fd,
           "POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 3\r\n"
           "Expect: 100-continue\r\n\r\n");
  const Read cont =
      read_until(fd, [](const std::string& b) { return b.find("\r\n\r\n") != b.npos; });
  EXPECT_EQ(cont.bytes.rfind("HTTP/1.1 100 Continue\r\n\r\n", 0), 0u) << cont.bytes;
  send_all(fd, "xyz");
  const Read rest = read_until(fd);
  EXPECT_EQ(body_of(rest.bytes.substr(rest.bytes.find("HTTP/1.1 200"))), "POST xyz") << rest.bytes;
  ::close(fd);
}

// Requests sent together are answered in order on the one connection.
TEST(HttpTransport, PipelinedRequestsAreAnsweredInOrder) {
  Transport s(fsv::HttpLimits{});
  const int fd = connect_to(s.port);
  send_all(fd,
           "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nA"
           "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nB"
           "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nC");
  const Read r = read_until(fd);
  const size_t a = r.bytes.find("POST A"), b = r.bytes.find("POST B"), c = r.bytes.find("POST C");
  ASSERT_NE(a, std::string::npos) << r.bytes;
  ASSERT_NE(b, std::string::npos) << r.bytes;
  ASSERT_NE(c, std::string::npos) << r.bytes;
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  ::close(fd);
}

// The answer to HEAD has the headers a GET would get (Content-Length included) and no body
// (RFC 9110): a client reads no body after it, so body bytes would be read as the start of the
// next response on the connection.
TEST(HttpTransport, AHeadAnswerHasNoBodyAndTheConnectionGoesOn) {
  Transport s(fsv::HttpLimits{});
  const int fd = connect_to(s.port);
  send_all(fd,
           "HEAD /big HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n10"
           "HEAD /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
           "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nA");
  const std::string r = read_until(fd).bytes;
  const std::string first = "HTTP/1.1 200 OK\r\n";
  ASSERT_EQ(r.rfind(first, 0), 0u) << r;
  const size_t end1 = r.find("\r\n\r\n");
  ASSERT_NE(end1, std::string::npos) << r;
  EXPECT_NE(r.substr(0, end1).find("Content-Length: 10"), std::string::npos) << r;
  // The next response begins right after the head: no body.
  ASSERT_EQ(r.compare(end1 + 4, 12, "HTTP/1.1 404"), 0) << r;
  const size_t end2 = r.find("\r\n\r\n", end1 + 4);
  ASSERT_NE(end2, std::string::npos) << r;
  ASSERT_EQ(r.compare(end2 + 4, 12, "HTTP/1.1 200"), 0) << r;
  EXPECT_EQ(body_of(r.substr(end2 + 4)), "POST A");
  EXPECT_EQ(r.find("yyyy"), std::string::npos) << r;
  ::close(fd);
}

// A stream is chunked (a worker writes pieces, each waiting for the bytes to go out) and the
// connection serves the next request after it.
TEST(HttpTransport, StreamsAreChunkedAndTheConnectionGoesOn) {
  Transport s(fsv::HttpLimits{});
  const int fd = connect_to(s.port);
  send_all(fd, "POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n3");
  const Read r =
      read_until(fd, [](const std::string& b) { return b.find("\r\n0\r\n\r\n") != b.npos; });
  EXPECT_NE(r.bytes.find("Transfer-Encoding: chunked"), std::string::npos) << r.bytes;
  std::string body = body_of(r.bytes), joined;
  // Each chunk: hex size, CRLF, data, CRLF; the last is 0.
  for (size_t at = 0;;) {
    const size_t eol = body.find("\r\n", at);
    ASSERT_NE(eol, std::string::npos);
    const size_t n = std::stoul(body.substr(at, eol - at), nullptr, 16);
    if (n == 0) break;
    joined += body.substr(eol + 2, n);
    at = eol + 2 + n + 2;
  }
  EXPECT_EQ(joined, std::string(3000, 'x'));
  send_all(fd, get("/echo", "Connection: close\r\n"));
  EXPECT_EQ(body_of(read_until(fd).bytes), "GET ");
  ::close(fd);
}

// A client that hangs up while its request is handled is seen by the handler (client_gone), and a
// half-close reads as gone too.
TEST(HttpTransport, AClientThatHangsUpIsSeenByItsHandler) {
  for (bool half : {false, true}) {
    Transport s(fsv::HttpLimits{});
    const int fd = connect_to(s.port);
    send_all(fd, get("/wait-gone"));
    const auto t0 = Clock::now();
    while (s.stats().workers.load() == 0 && Clock::now() - t0 < kPatience)
      std::this_thread::sleep_for(1ms);
    if (half)
      ::shutdown(fd, SHUT_WR);
    else
      ::close(fd);
    while (s.stats().workers.load() > 0 && Clock::now() - t0 < kPatience)
      std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(s.seen->gone.load()) << (half ? "half-close" : "close");
    if (half) ::close(fd);
  }
}

// A client that does not read its stream: the writes wait until the kernel's buffers are full,
// then the write deadline ends the response (write() is false) and the connection.
TEST(HttpTransport, AClientThatStopsReadingEndsItsStreamAtTheWriteDeadline) {
  fsv::HttpLimits limits;
  limits.write_timeout = 300ms;
  Transport s(limits);
  const int fd = connect_to(s.port);
  int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  send_all(fd, "POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n100000");
  const auto t0 = Clock::now();
  while (!s.seen->write_failed.load() && Clock::now() - t0 < kPatience)
    std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(s.seen->write_failed.load());
  EXPECT_LT(s.seen->written.load(), 100000);
  EXPECT_EQ(s.stats().write_timeouts.load(), 1);
  ::close(fd);
}

// A handler that responded and returned may leave its response queued on the event loop (a
// client that reads slowly): the request counts as responding until its last byte is written,
// so that a server stopping waits for it (Server's shutdown) rather than cut it off.
TEST(HttpTransport, ARequestIsRespondingUntilItsLastByteIsWritten) {
  Transport s(fsv::HttpLimits{});
  const int fd = connect_to(s.port);
  // A fixed receive buffer (no autotuning) and 16 MB: far more than the buffers of both ends
  // hold (the sender's is 4 MB at most by default) while the client does not read.
  int rcvbuf = 64 << 10;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  const size_t size = 16u << 20;
  const std::string n = std::to_string(size);
  send_all(fd, "POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(n.size()) +
                   "\r\n\r\n" + n);
  // The handler answers on the loop's thread; once the first bytes arrive it has returned.
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, static_cast<int>(kPatience / 1ms)), 1);
  EXPECT_EQ(s.stats().responding.load(), 1);
  const Read r = read_until(fd, [size](const std::string& b) {
    const size_t head = b.find("\r\n\r\n");
    return head != std::string::npos && b.size() >= head + 4 + size;
  });
  EXPECT_EQ(status_of(r.bytes), 200);
  EXPECT_EQ(body_of(r.bytes).size(), size);
  const auto t0 = Clock::now();
  while (s.stats().responding.load() != 0 && Clock::now() - t0 < kPatience)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(s.stats().responding.load(), 0);
  ::close(fd);
}

// stop() with a stream in flight and idle connections: every connection closes, the worker's
// writes fail, and stop() returns (it joins the workers).
TEST(HttpTransport, StopClosesEveryConnectionAndJoinsTheWorkers) {
  auto s = std::make_unique<Transport>(fsv::HttpLimits{});
  const int idle = connect_to(s->port);
  const int streaming = connect_to(s->port);
  int small = 4096;
  ::setsockopt(streaming, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  send_all(streaming, "POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n1000000");
  const auto t0 = Clock::now();
  while (s->seen->written.load() == 0 && Clock::now() - t0 < kPatience)
    std::this_thread::sleep_for(1ms);
  std::shared_ptr<Seen> seen = s->seen;
  s.reset();  // stop(), join
  EXPECT_TRUE(seen->write_failed.load());
  EXPECT_TRUE(read_until(idle).eof);
  ::close(idle);
  ::close(streaming);
}
