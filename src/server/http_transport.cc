#include "server/http_transport.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "flashserve/error.h"

namespace flashserve::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

namespace {

// How long a connection we are closing waits for the client's EOF (reading and dropping what it
// still sends) before it is closed anyway: closing with unread data resets the connection, and
// the client can then lose the answer it has not read yet.
constexpr std::chrono::milliseconds kLinger{2000};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

std::string_view to_std(beast::string_view s) {
  return {s.data(), s.size()};
}
beast::string_view to_beast(std::string_view s) {
  return {s.data(), s.size()};
}

std::string seconds_text(std::chrono::milliseconds d) {
  std::ostringstream os;
  os << static_cast<double>(d.count()) / 1000.0 << " s";
  return os.str();
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

class Connection;

struct HttpTransport::Impl {
  HttpLimits limits;
  Dispatch dispatch;
  OnResponse on_response;
  ErrorBody error_body;
  // Before the loop: a connection that the loop's destructor lets go of still counts itself out.
  HttpTransportStats stats;
  // Every connection not yet destroyed, open or not, by address (a connection is destroyed on
  // whichever thread lets go of it last: hence the lock). stop() shuts them; once the loop has
  // stopped, run() empties their write queues, whose callbacks hold their own connection:
  // handlers the stopped loop never ran would otherwise leave each such connection owning itself.
  std::mutex live_mu;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> live;
  net::io_context ioc{1};
  net::executor_work_guard<net::io_context::executor_type> work{ioc.get_executor()};
  tcp::acceptor acceptor{ioc};
  net::steady_timer accept_retry{ioc};
  std::atomic<bool> stopping{false};

  // Workers are detached threads, counted: each one's stack and thread state go back as it ends
  // (a finished thread not yet joined keeps them), and stop() waits for the count to be 0.
  std::mutex workers_mu;
  std::condition_variable workers_cv;
  int64_t workers = 0;
  bool workers_closed = false;  // stop() has waited for them all: no more

  void accept();
  void join_workers();
  std::vector<std::shared_ptr<Connection>> live_connections();
};

// One client connection, from accept to close: reads a request (headers, then body, each under
// its deadline), hands it to the dispatch, writes what its responder sends, then reads the next one
// (keep-alive) or closes. Lives on the event loop's thread; its responder, on a worker's, reaches
// it only by posting there.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpTransport::Impl& t, tcp::socket socket, bool counted)
      : t_(t), socket_(std::move(socket)), timer_(t.ioc), counted_(counted) {
    fd_ = socket_.native_handle();
    if (counted_) ++t_.stats.open;
  }
  ~Connection() {
    if (counted_) --t_.stats.open;
    std::lock_guard<std::mutex> lock(t_.live_mu);
    t_.live.erase(this);
  }

  void start() {
    enlist();
    read_header();
  }

  // Too many connections: a 503 and closed, without reading a request.
  void refuse() {
    enlist();
    fail(503,
         "The server has too many open connections (" + std::to_string(t_.limits.max_connections) +
             "); retry later",
         /*linger=*/true, {{"Retry-After", "1"}});
  }

  // stop(): a connection a handler holds is shut down (its writes fail at once, its handler
  // sees the client gone) and closed when the handler lets go; any other is closed now.
  void shut() {
    if (busy_) {
      error_code ec;
      socket_.shutdown(tcp::socket::shutdown_both, ec);
      socket_.cancel(ec);
    } else {
      close();
    }
  }

  bool client_gone() const {
    if (write_failed_.load()) return true;
    char c;
    const ssize_t r = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0) return true;
    return r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }

  // The loop has stopped: the queued writes and their callbacks are dropped unrun (see live).
  void abandon() {
    std::deque<Pending> dropped;
    dropped.swap(queue_);
  }

  // Queues bytes to write (in order); `done(ok)` runs once they are written or failed. Event loop.
  void enqueue(std::string bytes, std::function<void(bool)> done) {
    queue_.push_back({std::move(bytes), std::move(done)});
    kick();
  }

  // The handler let go of the request, every byte it sent written: the next request, or close.
  void request_done(bool close_after) {
    busy_ = false;
    --t_.stats.responding;
    if (closed_) return;
    if (close_after || write_failed_ || !keep_alive_ || t_.stopping.load()) return linger_close();
    read_header();
  }

  bool keep_alive() const { return keep_alive_; }
  unsigned version() const { return version_; }
  bool head() const { return head_; }
  HttpTransport::Impl& transport() { return t_; }

 private:
  void enlist() {
    std::lock_guard<std::mutex> lock(t_.live_mu);
    t_.live.emplace(this, weak_from_this());
  }

  enum class Phase { kIdle, kHeader, kBody, kBusy, kLinger, kClosed };
  enum class Deadline { kIdle, kHeader, kBody, kWrite, kLinger };

  void arm(std::chrono::milliseconds d, Deadline what) {
    arm_until(std::chrono::steady_clock::now() + d, what);
  }
  void arm_until(std::chrono::steady_clock::time_point at, Deadline what) {
    const uint64_t gen = ++timer_gen_;
    timer_.expires_at(at);
    timer_.async_wait([self = shared_from_this(), gen, what](error_code ec) {
      if (ec || gen != self->timer_gen_) return;
      self->on_deadline(what);
    });
  }
  void disarm() {
    ++timer_gen_;
    timer_.cancel();
  }

  void on_deadline(Deadline what) {
    if (closed_) return;
    error_code ec;
    switch (what) {
      case Deadline::kIdle:
        // No byte of a request: closed quietly, there is nothing to answer. A 408 written into
        // a connection that a client's pool holds unused (an HTTP client may open one and not
        // send on it, as node's fetch does when a request is aborted while it connects) would be
        // read as the answer to whatever request the client sends on it next.
        ++(requests_ == 0 ? t_.stats.header_timeouts : t_.stats.idle_timeouts);
        return close();
      case Deadline::kHeader:
        ++t_.stats.header_timeouts;
        phase_ = Phase::kLinger;  // the read's handler sees it was cancelled for this
        socket_.cancel(ec);
        return fail(408,
                    "No complete request headers within " + seconds_text(t_.limits.header_timeout) +
                        " (--http-header-timeout)",
                    /*linger=*/false);
      case Deadline::kBody:
        ++t_.stats.body_timeouts;
        phase_ = Phase::kLinger;
        socket_.cancel(ec);
        return fail(408,
                    "The request body did not arrive within " +
                        seconds_text(t_.limits.body_timeout) + " (--http-body-timeout)",
                    /*linger=*/false);
      case Deadline::kWrite:
        // A client that stopped reading: the write fails, its handler sees the client gone.
        ++t_.stats.write_timeouts;
        socket_.shutdown(tcp::socket::shutdown_both, ec);
        socket_.cancel(ec);
        return;
      case Deadline::kLinger:
        return close();
    }
  }

  // The next request: its headers within header_timeout of its first byte. A keep-alive
  // connection waits for that byte at most idle_timeout; a new one has header_timeout from the
  // accept for the whole of its headers (a client that connects and says nothing is a stalled
  // one). Either closes quietly if no byte came (see Deadline::kIdle), with a 408 if part of the
  // headers did.
  void read_header() {
    using Clock = std::chrono::steady_clock;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(t_.limits.max_header_bytes));
    parser_->body_limit(t_.limits.max_body_bytes);
    if (buffer_.size() > 0) return start_header(Clock::now() + t_.limits.header_timeout);
    const bool fresh = requests_ == 0;
    const Clock::time_point header_deadline = Clock::now() + t_.limits.header_timeout;
    // A read, not a wait for readability: Asio tries a read at once, so bytes that came before it
    // was started are not missed (a wait on the edge-triggered epoll would miss them and the
    // client's next request would sit there until the idle deadline).
    phase_ = Phase::kIdle;
    arm_until(fresh ? header_deadline : Clock::now() + t_.limits.idle_timeout, Deadline::kIdle);
    socket_.async_read_some(buffer_.prepare(16 << 10), [self = shared_from_this(), fresh,
                                                        header_deadline](error_code ec, size_t n) {
      if (self->phase_ != Phase::kIdle) return;
      if (ec) return self->close();
      self->buffer_.commit(n);
      self->start_header(fresh ? header_deadline : Clock::now() + self->t_.limits.header_timeout);
    });
  }

  void start_header(std::chrono::steady_clock::time_point deadline) {
    phase_ = Phase::kHeader;
    arm_until(deadline, Deadline::kHeader);
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](error_code ec, size_t) {
                              if (self->phase_ != Phase::kHeader) return;
                              self->on_header(ec);
                            });
  }

  // A read that failed: the client went away (closed quietly), or sent what is no HTTP request
  // or too much of it (answered, then closed).
  void on_read_error(error_code ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted ||
        ec == http::error::partial_message)
      return close();
    if (ec == http::error::body_limit)
      return fail(
          413,
          "The request body is larger than " + std::to_string(t_.limits.max_body_bytes) + " bytes",
          /*linger=*/true);
    if (ec == http::error::header_limit)
      return fail(431,
                  "The request headers are larger than " +
                      std::to_string(t_.limits.max_header_bytes) + " bytes",
                  /*linger=*/true);
    fail(400, "Malformed HTTP request (" + ec.message() + ")", /*linger=*/true);
  }

  void on_header(error_code ec) {
    if (ec) return on_read_error(ec);
    ++requests_;
    if (parser_->is_done()) return dispatch();
    phase_ = Phase::kBody;
    arm(t_.limits.body_timeout, Deadline::kBody);
    const auto& h = parser_->get();
    // curl and others send Expect: 100-continue before a large body and wait for this (or 1 s).
    if (iequals(to_std(h[http::field::expect]), "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(socket_, net::buffer(kContinue),
                       [self = shared_from_this()](error_code ec, size_t) {
                         if (self->phase_ != Phase::kBody) return;
                         if (ec) return self->close();
                         self->read_body();
                       });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](error_code ec, size_t) {
                       if (self->phase_ != Phase::kBody) return;
                       if (ec) return self->on_read_error(ec);
                       self->dispatch();
                     });
  }

  void dispatch();

  void kick() {
    while (!writing_ && !queue_.empty()) {
      Pending& p = queue_.front();
      if (!p.bytes.empty() && !write_failed_ && !closed_) {
        writing_ = true;
        arm(t_.limits.write_timeout, Deadline::kWrite);
        net::async_write(socket_, net::buffer(p.bytes),
                         [self = shared_from_this()](error_code ec, size_t) {
                           self->writing_ = false;
                           self->disarm();
                           if (ec) self->write_failed_ = true;
                           self->pop(!ec);
                           self->kick();
                         });
        return;
      }
      pop(!write_failed_ && !closed_);
    }
  }
  void pop(bool ok) {
    std::function<void(bool)> done = std::move(queue_.front().done);
    queue_.pop_front();
    if (done) done(ok);
  }

  // An error the transport answers itself; the connection closes after it.
  void fail(int status, const std::string& message, bool linger,
            std::vector<HttpHeader> extra = {}) {
    if (closed_) return;
    phase_ = Phase::kLinger;
    http::response<http::string_body> res{static_cast<http::status>(status), version_};
    res.set(http::field::content_type, "application/json");
    for (const HttpHeader& h : extra) res.set(h.name, h.value);
    res.keep_alive(false);
    res.body() = t_.error_body(status, message);
    res.prepare_payload();
    std::ostringstream os;
    os << res;
    if (t_.on_response) t_.on_response(status);
    enqueue(os.str(), [self = shared_from_this(), linger](bool) {
      if (linger)
        self->linger_close();
      else
        self->close();
    });
  }

  // Closes after the client's EOF (what it still sends is read and dropped, up to drain_bytes) or
  // kLinger: see kLinger.
  void linger_close() {
    if (closed_) return;
    phase_ = Phase::kLinger;
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    arm(kLinger, Deadline::kLinger);
    drain();
  }
  void drain() {
    drain_buffer_.resize(16 << 10);
    socket_.async_read_some(net::buffer(drain_buffer_),
                            [self = shared_from_this()](error_code ec, size_t n) {
                              if (self->closed_) return;
                              self->drained_ += n;
                              if (ec || self->drained_ > self->t_.limits.drain_bytes)
                                return self->close();
                              self->drain();
                            });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    phase_ = Phase::kClosed;
    disarm();
    error_code ec;
    if (busy_) {  // the handler still holds it: closed when it lets go (see shut())
      socket_.shutdown(tcp::socket::shutdown_both, ec);
      socket_.cancel(ec);
    } else {
      socket_.close(ec);
    }
  }

  struct Pending {
    std::string bytes;  // empty: a marker, its done() runs once what came before is written
    std::function<void(bool)> done;
  };

  HttpTransport::Impl& t_;
  tcp::socket socket_;
  net::steady_timer timer_;
  uint64_t timer_gen_ = 0;
  const bool counted_;
  int fd_ = -1;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::kHeader;
  int64_t requests_ = 0;
  bool keep_alive_ = true;
  unsigned version_ = 11;
  bool head_ = false;  // the request is a HEAD: its answer has no body
  bool busy_ = false;  // a responder holds the request: the socket is not closed under it
  bool closed_ = false;
  bool writing_ = false;
  std::atomic<bool> write_failed_{false};
  std::deque<Pending> queue_;
  std::vector<char> drain_buffer_;
  size_t drained_ = 0;
};

namespace {

// A worker waits for its write to be done on the event loop's thread.
struct WriteWait {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false, ok = false;
  void set(bool r) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      ok = r;
    }
    cv.notify_all();
  }
  bool wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return ok;
  }
};

class Responder final : public HttpResponder {
 public:
  explicit Responder(std::shared_ptr<Connection> c)
      : c_(std::move(c)),
        keep_alive_(c_->keep_alive()),
        version_(c_->version()),
        head_(c_->head()) {}

  ~Responder() override {
    if (!answered_) {
      respond(500, "application/json",
              c_->transport().error_body(500, "Internal error: the request got no response"), {},
              true);
    }
    // A stream that did not end cannot be followed by another request on this connection.
    const bool close_after = close_after_ || (streaming_ && !ended_);
    // Behind what it sent: the next request's deadline starts once those bytes are written.
    post([close_after](Connection& c) {
      c.enqueue({}, [self = c.shared_from_this(), close_after](bool) {
        self->request_done(close_after);
      });
    });
    c_.reset();
  }

  void respond(int status, std::string_view content_type, std::string body,
               std::vector<HttpHeader> headers, bool close) override {
    if (answered_) return;
    answered_ = true;
    close_after_ = close;
    http::response<http::string_body> res{static_cast<http::status>(status), version_};
    res.set(http::field::content_type, to_beast(content_type));
    for (const HttpHeader& h : headers) res.set(h.name, h.value);
    res.keep_alive(keep_alive_ && !close);
    if (keep_alive_ && !close) advertise_idle_timeout(res);
    res.body() = std::move(body);
    res.prepare_payload();
    std::ostringstream os;
    // HEAD: the head a GET would get, Content-Length included, without the body (RFC 9110); the
    // client reads no body, so its bytes would be taken for the next response's.
    if (head_)
      os << res.base();
    else
      os << res;
    count(status);
    send(os.str(), nullptr);
  }

  bool begin_stream(int status, std::string_view content_type,
                    std::vector<HttpHeader> headers) override {
    if (answered_) return false;
    answered_ = streaming_ = true;
    http::response<http::empty_body> res{static_cast<http::status>(status), version_};
    res.set(http::field::content_type, to_beast(content_type));
    for (const HttpHeader& h : headers) res.set(h.name, h.value);
    // HTTP/1.0 has no chunks: the body ends where the connection does.
    chunked_ = version_ >= 11;
    if (chunked_)
      res.chunked(true);
    else
      close_after_ = true;
    res.keep_alive(keep_alive_ && chunked_);
    if (keep_alive_ && chunked_) advertise_idle_timeout(res);
    std::ostringstream os;
    os << res.base();
    count(status);
    return ok_ = send_and_wait(os.str());
  }

  bool write(std::string_view data) override {
    if (!streaming_ || ended_ || !ok_) return false;
    if (data.empty() || head_) return true;  // HEAD: no body (see respond)
    std::string framed;
    if (chunked_) {
      char size[32];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      framed.reserve(data.size() + 16);
      framed += size;
      framed += data;
      framed += "\r\n";
    } else {
      framed = data;
    }
    return ok_ = send_and_wait(std::move(framed));
  }

  void end_stream() override {
    if (!streaming_ || ended_) return;
    ended_ = true;
    if (ok_ && chunked_ && !head_) ok_ = send_and_wait("0\r\n\r\n");
    if (!ok_) close_after_ = true;
  }

  bool client_gone() const override { return c_->client_gone(); }

 private:
  // Keep-Alive: timeout=N tells the client when we close an idle connection, so that it stops
  // reusing it before then (undici, the openai SDK's client, drops it a second early) instead
  // of sending a request as we close and getting "other side closed".
  template <class Message>
  void advertise_idle_timeout(Message& res) const {
    const auto s =
        std::chrono::duration_cast<std::chrono::seconds>(c_->transport().limits.idle_timeout);
    res.set(http::field::keep_alive, "timeout=" + std::to_string(std::max<int64_t>(1, s.count())));
  }
  void count(int status) {
    if (c_->transport().on_response) c_->transport().on_response(status);
  }
  template <class F>
  void post(F f) {
    net::post(c_->transport().ioc, [c = c_, f = std::move(f)]() mutable { f(*c); });
  }
  void send(std::string bytes, std::function<void(bool)> done) {
    post([bytes = std::move(bytes), done = std::move(done)](Connection& c) mutable {
      c.enqueue(std::move(bytes), std::move(done));
    });
  }
  bool send_and_wait(std::string bytes) {
    auto w = std::make_shared<WriteWait>();
    send(std::move(bytes), [w](bool ok) { w->set(ok); });
    return w->wait();
  }

  std::shared_ptr<Connection> c_;
  const bool keep_alive_;
  const unsigned version_;
  const bool head_;
  bool answered_ = false, streaming_ = false, ended_ = false, chunked_ = true, ok_ = true;
  bool close_after_ = false;
};

}  // namespace

void Connection::dispatch() {
  phase_ = Phase::kBusy;
  busy_ = true;
  ++t_.stats.responding;  // until request_done(): its responder's last byte is written
  disarm();
  http::request<http::string_body> msg = parser_->release();
  parser_.reset();
  keep_alive_ = msg.keep_alive();
  version_ = msg.version();
  head_ = msg.method() == http::verb::head;
  HttpRequest req;
  req.method = std::string(to_std(msg.method_string()));
  const std::string_view target = to_std(msg.target());
  req.path = std::string(target.substr(0, target.find('?')));
  for (const auto& f : msg)
    req.headers.emplace_back(std::string(to_std(f.name_string())), std::string(to_std(f.value())));
  req.body = std::move(msg.body());
  auto responder = std::make_shared<Responder>(shared_from_this());
  try {
    t_.dispatch(std::move(req), std::move(responder));
  } catch (const std::exception& e) {
    // A dispatch that threw (a thread that could not be started, say): its responder, if it was
    // dropped unanswered, answers 500.
    std::fprintf(stderr, "flashserve serve: dispatch failed: %s\n", e.what());
  }
}

void HttpTransport::Impl::accept() {
  acceptor.async_accept([this](error_code ec, tcp::socket socket) {
    if (stopping.load()) return;
    if (ec) {
      if (ec == net::error::operation_aborted) return;
      // Out of descriptors (EMFILE) or a connection reset before it was accepted: try again
      // shortly rather than spin.
      accept_retry.expires_after(std::chrono::milliseconds(20));
      accept_retry.async_wait([this](error_code e) {
        if (!e && !stopping.load()) accept();
      });
      return;
    }
    ++stats.accepted;
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);  // SSE events go out as they are written
    if (stats.open.load() >= limits.max_connections) {
      ++stats.refused;
      std::make_shared<Connection>(*this, std::move(socket), /*counted=*/false)->refuse();
    } else {
      std::make_shared<Connection>(*this, std::move(socket), /*counted=*/true)->start();
    }
    accept();
  });
}

// Held while the caller works on them (shut or abandoned outside the lock: either may let the
// last reference go, and a connection's destructor takes the lock).
std::vector<std::shared_ptr<Connection>> HttpTransport::Impl::live_connections() {
  std::vector<std::shared_ptr<Connection>> out;
  std::lock_guard<std::mutex> lock(live_mu);
  for (auto& [p, weak] : live)
    if (auto c = weak.lock()) out.push_back(std::move(c));
  return out;
}

void HttpTransport::Impl::join_workers() {
  std::unique_lock<std::mutex> lock(workers_mu);
  workers_cv.wait(lock, [&] { return workers == 0; });
  workers_closed = true;
}

HttpTransport::HttpTransport(HttpLimits limits, Dispatch dispatch, OnResponse on_response,
                             ErrorBody error_body)
    : impl_(std::make_unique<Impl>()) {
  impl_->limits = limits;
  impl_->dispatch = std::move(dispatch);
  impl_->on_response = std::move(on_response);
  impl_->error_body = std::move(error_body);
}

HttpTransport::~HttpTransport() {
  stop();
}

int HttpTransport::bind(const std::string& host, int port) {
  Impl& t = *impl_;
  // Each connection is a descriptor: take what the hard limit allows, and keep 64 for the rest of
  // the process (model files, the listening socket, pipes).
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rlimit raised = rl;
      raised.rlim_cur = rl.rlim_max;
      if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
    }
    const int64_t room = static_cast<int64_t>(rl.rlim_cur) - 64;
    if (rl.rlim_cur != RLIM_INFINITY && t.limits.max_connections > room) {
      std::fprintf(stderr,
                   "flashserve serve: --max-connections %lld cut to %lld: the descriptor limit "
                   "(ulimit -n) is %lld\n",
                   static_cast<long long>(t.limits.max_connections),
                   static_cast<long long>(std::max<int64_t>(room, 1)),
                   static_cast<long long>(rl.rlim_cur));
      t.limits.max_connections = std::max<int64_t>(room, 1);
    }
  }
  error_code ec;
  tcp::resolver resolver(t.ioc);
  const auto found = resolver.resolve(host, std::to_string(port),
                                      tcp::resolver::numeric_service | tcp::resolver::passive, ec);
  if (ec || found.empty())
    throw Error(ErrorKind::kInvalidArgument, "--host",
                "cannot resolve " + host + ": " + ec.message());
  const tcp::endpoint ep = found.begin()->endpoint();
  t.acceptor.open(ep.protocol(), ec);
  if (!ec) t.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) t.acceptor.bind(ep, ec);
  if (!ec) t.acceptor.listen(SOMAXCONN, ec);
  if (ec) {
    error_code ignored;
    t.acceptor.close(ignored);
    if (port == 0)
      throw Error(ErrorKind::kInvalidArgument, "--host",
                  "cannot bind " + host + ": " + ec.message());
    throw Error(ErrorKind::kInvalidArgument, "--port",
                "cannot bind " + host + ":" + std::to_string(port) + " (in use?): " + ec.message());
  }
  t.accept();
  return t.acceptor.local_endpoint().port();
}

void HttpTransport::run() {
  Impl& t = *impl_;
  if (t.stopping.load()) return;
  t.ioc.run();
  // Stopped (stop() joined the workers first, so no responder posts any more).
  for (auto& c : t.live_connections()) c->abandon();
}

void HttpTransport::stop() {
  Impl& t = *impl_;
  if (t.stopping.exchange(true)) return;
  net::post(t.ioc, [&t] {
    error_code ec;
    t.acceptor.close(ec);
    t.accept_retry.cancel();
    for (auto& c : t.live_connections()) c->shut();
  });
  // The workers first, while the loop still runs: their writes end (failed, if the shutdown
  // above came first), then their responders let go.
  t.join_workers();
  t.work.reset();
  t.ioc.stop();
}

void HttpTransport::spawn(std::function<void()> work) {
  Impl& t = *impl_;
  {
    std::lock_guard<std::mutex> lock(t.workers_mu);
    if (t.workers_closed) return;  // stopped: `work` is dropped, its responder answers 500
    ++t.workers;
    ++t.stats.workers;
  }
  try {
    std::thread([&t, work = std::move(work)]() mutable {
      try {
        work();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "flashserve serve: a request's worker failed: %s\n", e.what());
      }
      work = nullptr;  // its responder (and connection) let go while the transport surely lives
      std::unique_lock<std::mutex> lock(t.workers_mu);
      --t.workers;
      --t.stats.workers;
      // The lock is held, and the notification sent, only once this thread is done: stop() cannot
      // return (and the transport go) while it still runs.
      std::notify_all_at_thread_exit(t.workers_cv, std::move(lock));
    }).detach();
  } catch (...) {  // no thread (EAGAIN): the work is dropped, its responder answers 500
    std::lock_guard<std::mutex> lock(t.workers_mu);
    --t.workers;
    --t.stats.workers;
    throw;
  }
}

const HttpTransportStats& HttpTransport::stats() const {
  return impl_->stats;
}
const HttpLimits& HttpTransport::limits() const {
  return impl_->limits;
}

}  // namespace flashserve::server
