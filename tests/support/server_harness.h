// The HTTP server in process for tests: a byte-level codec (one token per byte), the server run on
// its own thread with a cpp-httplib client (`Running`), the events of an SSE body, and the step
// fault scenario that the CPU test (an executor that throws) and the GPU test (a real device fault
// on the CUDA runner, tests/server_gpu/) share: which requests must end how, checked the same way.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "engine/executor.h"
#include "server/server.h"
#include "server/text_codec.h"

namespace flashserve::testing {

using json = nlohmann::json;

// Waits (polling every millisecond) until `done` or `limit`, whichever first; returns done().
// Tests use generous limits: a hang fails the test instead of the suite, and a slow machine passes.
inline bool wait_until(const std::function<bool()>& done, std::chrono::seconds limit) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!done() && std::chrono::steady_clock::now() - t0 < limit)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done();
}

class ByteStream final : public server::TextStream {
 public:
  std::string push(int32_t t) override { return std::string(1, static_cast<char>(t)); }
  std::string flush() override { return {}; }
};

class ByteCodec : public server::TextCodec {
 public:
  std::optional<std::vector<int32_t>> encode(std::string_view text, size_t max_ids) const override {
    if (text.size() > max_ids) return std::nullopt;
    return std::vector<int32_t>(text.begin(), text.end());
  }
  std::unique_ptr<server::TextStream> stream(std::span<const int32_t>, bool) const override {
    return std::make_unique<ByteStream>();
  }
  std::string decode(std::span<const int32_t> ids, bool) const override {
    return std::string(ids.begin(), ids.end());
  }
  std::string render_chat(const std::vector<server::ChatMessage>& messages,
                          const std::string&) const override {
    std::string out;
    for (const auto& m : messages) out += m.role + ": " + m.content + "\n";
    return out + "assistant:";
  }
  std::optional<std::vector<int32_t>> encode_rendered(std::string_view text,
                                                      size_t max_ids) const override {
    return encode(text, max_ids);
  }
  std::string token_bytes(int32_t id) const override {
    return std::string(1, static_cast<char>(id));
  }
};

// A ByteCodec whose encoding of the text "hold" blocks until release(): a /tokenize request of it
// keeps a response in flight for as long as a test needs (the server's drain waits for it).
class HoldingCodec final : public ByteCodec {
 public:
  struct Hold {
    std::mutex mu;
    std::condition_variable cv;
    bool entered = false, released = false;
    void release() {
      std::lock_guard<std::mutex> lock(mu);
      released = true;
      cv.notify_all();
    }
    bool has_entered() {
      std::lock_guard<std::mutex> lock(mu);
      return entered;
    }
  };
  explicit HoldingCodec(std::shared_ptr<Hold> hold) : hold_(std::move(hold)) {}
  std::optional<std::vector<int32_t>> encode(std::string_view text, size_t max_ids) const override {
    if (text == "hold") {
      std::unique_lock<std::mutex> lock(hold_->mu);
      hold_->entered = true;
      hold_->cv.wait(lock, [&] { return hold_->released; });
    }
    return ByteCodec::encode(text, max_ids);
  }

 private:
  std::shared_ptr<Hold> hold_;
};

struct Running {
  std::unique_ptr<server::Server> server;
  std::thread thread;
  int port = 0;
  bool expect_failure = false;        // run() is to throw (an engine that fails)
  std::atomic<bool> returned{false};  // run() has returned
  std::string run_error;              // what it threw, once returned
  Running(server::ServerOptions o, server::Server::Loader load, bool expect_failure = false)
      : expect_failure(expect_failure) {
    ::signal(SIGPIPE, SIG_IGN);
    o.port = 0;
    if (o.served_model_names.empty()) o.served_model_names = {"m"};
    server = std::make_unique<server::Server>(o, std::move(load));
    port = server->bind();
    thread = std::thread([this] {
      try {
        server->run();
      } catch (const std::exception& e) {
        run_error = e.what();
        if (!this->expect_failure) ADD_FAILURE() << e.what();
      }
      returned = true;
    });
  }
  ~Running() {
    server->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(10);
    return c;
  }
  httplib::Result post(const std::string& path, const json& body,
                       const httplib::Headers& headers = {}) const {
    return client().Post(path.c_str(), headers, body.dump(), "application/json");
  }
  // POSTs `body` and hands each piece of the response body to `receive` (false: hang up).
  void post_streaming(const json& body, std::function<bool()> receive) const {
    httplib::Client c = client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return receive(); };
    httplib::Response res;
    httplib::Error err;
    c.send(req, res, err);
  }
  // POSTs `body` to /v1/completions on a socket of its own, which the caller closes (to hang up).
  int post_raw(const json& body) const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const std::string text = body.dump();
    const std::string request =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
        "Content-Type: application/json\r\nContent-Length: " +
        std::to_string(text.size()) + "\r\n\r\n" + text;
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::send(fd, request.data(), request.size(), 0) != static_cast<ssize_t>(request.size()))
      ADD_FAILURE() << "could not send the request";
    return fd;
  }
  // Waits (5 s at most) until no KV block is used and no request is in flight.
  void wait_idle() const {
    const auto t0 = std::chrono::steady_clock::now();
    while ((metric("flashserve_kv_blocks_used") != 0 ||
            metric("flashserve_http_requests_in_flight") != 0) &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  double metric(const std::string& name) const {
    auto r = client().Get("/metrics");
    const std::regex line("\n" + name + " ([0-9.e+-]+)\n");
    std::smatch m;
    if (!r || !std::regex_search(r->body, m, line)) return -1;
    return std::stod(m[1]);
  }
};

// The events' JSON objects of an SSE body (without [DONE]).
std::vector<json> sse_chunks(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  for (size_t end; (end = body.find("\n\n", pos)) != std::string::npos; pos = end + 2) {
    const std::string event = body.substr(pos, end - pos);
    if (event != "data: [DONE]") out.push_back(json::parse(event.substr(6)));
  }
  return out;
}

// Runs `inner`'s steps, each 5 ms longer (so that a request of 60 tokens cannot end before the next
// one arrives); holds the first step that has two or more requests until the test arms the fault,
// and from then on calls `fault` before each step: it throws (a failing executor), or breaks the
// device so that the step's own CUDA calls fail.
class HeldFaultExecutor final : public engine::Executor {
 public:
  struct Control {
    std::atomic<bool> armed{false};
    std::atomic<bool> holding{false};  // a step with two requests waits for `armed`
  };
  HeldFaultExecutor(std::shared_ptr<Control> c, std::unique_ptr<engine::Executor> inner,
                    std::function<void()> fault)
      : c_(std::move(c)), inner_(std::move(inner)), fault_(std::move(fault)) {}
  std::vector<int32_t> execute(const serve::Batch& batch) override {
    if (batch.entries.size() >= 2) {
      c_->holding = true;
      while (!c_->armed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (c_->armed)
      fault_();
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return inner_->execute(batch);
  }
  std::vector<model::SampledLogprobs> take_logprobs() override { return inner_->take_logprobs(); }
  double now() const override { return inner_->now(); }
  void wait_until(double t) override { inner_->wait_until(t); }
  std::string describe() const override { return "held fault over " + inner_->describe(); }

 private:
  std::shared_ptr<Control> c_;
  std::unique_ptr<engine::Executor> inner_;
  std::function<void()> fault_;
};

// What the clients of a failing step got (status -1: no answer).
struct StepFaultOutcome {
  struct Reply {
    int status = -1;
    std::string body;
    std::string retry_after;
  };
  Reply streamed, whole, waiting, health;
  bool held = false, queued = false, stopped = false;
};

// The scenario, on a server whose engine runs a HeldFaultExecutor with two sequences at most, whose
// codec is a HoldingCodec of `hold` and whose model's vocabulary has ids 1-3: a streamed and a
// whole request run in the held step, a third waits behind them; the fault is armed; each client's
// answer is kept. Meanwhile a /tokenize of "hold" keeps a response in flight, so that the server,
// which stops once the engine failed, drains (its 2 s at most) instead of closing at once, and
// /health, probed every millisecond from the arming on, is seen answering something other than
// 200 (its first such answer is kept); then the hold is released. Every wait is bounded (20 s,
// 120 s for the server's stop).
inline StepFaultOutcome drive_step_fault(const Running& s, HeldFaultExecutor::Control& control,
                                         HoldingCodec::Hold& hold) {
  using Reply = StepFaultOutcome::Reply;
  StepFaultOutcome o;
  const auto post = [&](Reply& got, const std::string& path, const json& body) {
    if (auto r = s.post(path, body)) got = {r->status, r->body, r->get_header_value("Retry-After")};
  };
  Reply tokenized;
  std::thread t([&] { post(tokenized, "/tokenize", {{"model", "m"}, {"prompt", "hold"}}); });
  const bool holding = wait_until([&] { return hold.has_entered(); }, std::chrono::seconds(20));
  const json common = {{"model", "m"}, {"max_tokens", 60}, {"ignore_eos", true}};
  const auto request = [&](json prompt, bool stream) {
    json body = common;
    body["prompt"] = std::move(prompt);
    body["stream"] = stream;
    return body;
  };
  std::thread a([&] { post(o.streamed, "/v1/completions", request(json::array({1}), true)); });
  std::thread b([&] { post(o.whole, "/v1/completions", request(json::array({1, 2}), false)); });
  o.held = wait_until([&] { return control.holding.load(); }, std::chrono::seconds(20));
  std::thread c([&] { post(o.waiting, "/v1/completions", request(json::array({3}), false)); });
  // All three submitted: 1 + 2 + 1 prompt tokens.
  o.queued = wait_until([&] { return s.metric("flashserve_prompt_tokens_total") == 4; },
                        std::chrono::seconds(20));
  std::thread probe([&] {
    if (!holding) return;  // no drain to probe in
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      auto r = s.client().Get("/health");
      if (!r) return;  // the server is gone: the 503 was not seen
      if (r->status != 200) {
        o.health = {r->status, r->body, r->get_header_value("Retry-After")};
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  control.armed = true;  // unconditionally: a held step must never wait forever
  a.join();
  b.join();
  c.join();
  probe.join();
  hold.release();
  t.join();
  o.stopped = wait_until([&] { return s.returned.load(); }, std::chrono::seconds(120));
  return o;
}

// What every failing step must give: the stream an engine_failed error event, then [DONE]; the
// whole and the waiting request 500 engine_failed; /health 503 engine_failed with Retry-After; the
// server stopped on its own with "a step failed: <why>", the same why the clients were told.
inline void expect_step_fault_outcome(const StepFaultOutcome& o, const Running& s) {
  ASSERT_TRUE(o.held) << "no step ran both requests";
  ASSERT_TRUE(o.queued) << "the third request was not submitted";
  ASSERT_TRUE(o.stopped) << "the server did not stop";
  const std::string said = "a step failed: ";  // run()'s Error: "engine: a step failed: <why>"
  const size_t at = s.run_error.find(said);
  ASSERT_NE(at, std::string::npos) << s.run_error;
  const std::string why = s.run_error.substr(at + said.size());
  EXPECT_FALSE(why.empty());
  ASSERT_EQ(o.streamed.status, 200);
  ASSERT_GE(o.streamed.body.size(), 14u);
  EXPECT_EQ(o.streamed.body.substr(o.streamed.body.size() - 14), "data: [DONE]\n\n");
  const std::vector<json> chunks = sse_chunks(o.streamed.body);
  ASSERT_FALSE(chunks.empty());
  const json& error = chunks.back()["error"];
  EXPECT_EQ(error["code"], "engine_failed") << o.streamed.body;
  EXPECT_EQ(error["type"], "server_error");
  EXPECT_NE(error["message"].get<std::string>().find(why), std::string::npos) << error;
  for (const StepFaultOutcome::Reply* r : {&o.whole, &o.waiting}) {
    EXPECT_EQ(r->status, 500) << r->body;
    if (r->status == 500) EXPECT_EQ(json::parse(r->body)["error"]["code"], "engine_failed");
  }
  EXPECT_EQ(o.health.status, 503) << o.health.body;
  if (o.health.status == 503) {
    EXPECT_EQ(json::parse(o.health.body)["error"]["code"], "engine_failed");
    EXPECT_EQ(o.health.retry_after, "1");
  }
}

}  // namespace flashserve::testing
