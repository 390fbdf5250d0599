// The thread-safe way into an engine, for the HTTP server: any thread submits a request and gets
// a TokenStream; one loop thread owns the Engine, drains the submissions and aborts each step,
// steps, and pushes each request's new tokens into its stream. Closing a stream (or dropping the
// last reference to it) aborts its request.
//
// Thread safety by construction: the Engine is touched only by the loop thread; submitters and
// readers share only the Inbox (one mutex) and each stream's own state (one mutex each), and the
// loop never holds both locks at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace flashserve::engine {

class EngineLoop;
struct Inbox;

// Wakes a reader that waits on several streams at once (the n choices of one HTTP request)
// when any of them gets tokens or ends. Any thread.
class StreamSignal {
 public:
  // How many times it was raised so far: read it before looking at the streams, then wait past it,
  // and a push in between is not missed.
  uint64_t count() const;
  // Waits up to `timeout` for count() to pass `seen`; true if it did.
  bool wait_past(uint64_t seen, std::chrono::milliseconds timeout) const;
  void raise();

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  uint64_t count_ = 0;
};

// One request's tokens as they come. Read from one thread (the caller's).
class TokenStream {
 public:
  ~TokenStream();  // aborts the request if it is still running
  int64_t id() const { return id_; }
  // Waits for tokens or the end: appends the new tokens to `out` (and, when the request asked for
  // logprobs and `logprobs` is given, one SampledLogprobs per token to it) and returns true, or
  // returns false once the request has finished and every token was read.
  bool read(std::vector<int32_t>& out, std::vector<model::SampledLogprobs>* logprobs = nullptr);
  // Every remaining token, until the end.
  std::vector<int32_t> read_all();
  // Waits up to `timeout` for tokens or the end; true when read() would not block.
  bool wait(std::chrono::milliseconds timeout);
  // From now on each push (tokens, or the end) also raises `signal`.
  void raise_on_push(std::shared_ptr<StreamSignal> signal);
  // Why it finished (kNone while it runs).
  serve::FinishReason finish_reason() const;
  // Prompt tokens the engine found in its prefix cache (known once a token came).
  int64_t cached_tokens() const;
  // Stops the request (its blocks are freed by the next step); later reads see kAbort.
  void close();

 private:
  friend class EngineLoop;
  TokenStream(int64_t id, std::shared_ptr<Inbox> inbox) : id_(id), inbox_(std::move(inbox)) {}
  void push(const std::vector<int32_t>& tokens, std::vector<model::SampledLogprobs> logprobs,
            serve::FinishReason finish, int64_t cached_tokens = 0);

  const int64_t id_;
  std::shared_ptr<Inbox> inbox_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> pending_;
  std::vector<model::SampledLogprobs> pending_logprobs_;
  serve::FinishReason finish_ = serve::FinishReason::kNone;
  int64_t cached_tokens_ = 0;
  bool closed_ = false;
  std::shared_ptr<StreamSignal> signal_;
};

// What the loop last saw of its engine, refreshed after every step and every batch of aborts (so
// a dropped stream's blocks show as free at once). For metrics; any thread.
struct LoopStats {
  int64_t steps = 0;
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  // Prefix caching: prompt tokens admitted requests looked up in cached blocks, and found.
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
};

class EngineLoop {
 public:
  // Starts the loop thread, which owns `engine` from now on.
  explicit EngineLoop(std::unique_ptr<Engine> engine);
  ~EngineLoop();  // stop()
  // Queues a request; the loop adds it at its next step. A request the engine would refuse is
  // refused here, in the caller's thread, with its Error, and changes nothing.
  std::shared_ptr<TokenStream> submit(NewRequest request);
  // Aborts every request, finishes their streams with kAbort and joins the loop thread. A step
  // that throws stops the loop the same way (submit then says why).
  void stop();
  // Steps the loop has run (for tests and metrics).
  int64_t steps() const;
  // Why the loop stopped on its own (the message of a step that threw); "" while it runs or
  // when stop() stopped it.
  std::string failure() const;
  LoopStats stats() const;

 private:
  void run();

  std::unique_ptr<Engine> engine_;
  std::shared_ptr<Inbox> inbox_;
  std::thread thread_;
};

}  // namespace flashserve::engine
