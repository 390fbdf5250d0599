#include "engine/front_door.h"

#include <iterator>
#include <utility>

#include "flashserve/error.h"

namespace flashserve::engine {

// What other threads hand the loop: submissions and aborts, under one mutex.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<NewRequest, std::shared_ptr<TokenStream>>> adds;
  std::vector<int64_t> aborts;
  bool stopping = false;
  std::string error;  // why the loop stopped on its own (a step threw)
  int64_t next_id = 0;
  LoopStats stats;

  void abort(int64_t id) {
    {
      std::lock_guard<std::mutex> lock(mu);
      aborts.push_back(id);
    }
    cv.notify_one();
  }
};

uint64_t StreamSignal::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

bool StreamSignal::wait_past(uint64_t seen, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return count_ != seen; });
}

void StreamSignal::raise() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++count_;
  }
  cv_.notify_all();
}

TokenStream::~TokenStream() {
  // The loop holds only weak references, so this runs when the caller lets go of the stream.
  bool running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running = finish_ == serve::FinishReason::kNone;
  }
  if (running) inbox_->abort(id_);
}

bool TokenStream::read(std::vector<int32_t>& out, std::vector<model::SampledLogprobs>* logprobs) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !pending_.empty() || finish_ != serve::FinishReason::kNone; });
  if (pending_.empty()) return false;
  out.insert(out.end(), pending_.begin(), pending_.end());
  pending_.clear();
  if (logprobs)
    logprobs->insert(logprobs->end(), std::make_move_iterator(pending_logprobs_.begin()),
                     std::make_move_iterator(pending_logprobs_.end()));
  pending_logprobs_.clear();
  return true;
}

bool TokenStream::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout,
                      [&] { return !pending_.empty() || finish_ != serve::FinishReason::kNone; });
}

void TokenStream::raise_on_push(std::shared_ptr<StreamSignal> signal) {
  std::lock_guard<std::mutex> lock(mu_);
  signal_ = std::move(signal);
}

std::vector<int32_t> TokenStream::read_all() {
  std::vector<int32_t> out;
  while (read(out)) {
  }
  return out;
}

serve::FinishReason TokenStream::finish_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finish_;
}

int64_t TokenStream::cached_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_tokens_;
}

void TokenStream::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || finish_ != serve::FinishReason::kNone) return;
    closed_ = true;
  }
  inbox_->abort(id_);
}

void TokenStream::push(const std::vector<int32_t>& tokens,
                       std::vector<model::SampledLogprobs> logprobs, serve::FinishReason finish,
                       int64_t cached_tokens) {
  std::shared_ptr<StreamSignal> signal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_ != serve::FinishReason::kNone) return;  // already ended (stop() after a finish)
    if (!tokens.empty()) cached_tokens_ = cached_tokens;
    pending_.insert(pending_.end(), tokens.begin(), tokens.end());
    pending_logprobs_.insert(pending_logprobs_.end(), std::make_move_iterator(logprobs.begin()),
                             std::make_move_iterator(logprobs.end()));
    finish_ = finish;
    signal = signal_;
  }
  cv_.notify_all();
  if (signal) signal->raise();
}

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine)
    : engine_(std::move(engine)), inbox_(std::make_shared<Inbox>()) {
  if (!engine_) throw Error(ErrorKind::kInvalidArgument, "engine", "null");
  inbox_->stats.kv_blocks_total = engine_->blocks().num_blocks();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() {
  stop();
}

std::shared_ptr<TokenStream> EngineLoop::submit(NewRequest request) {
  // The engine's configuration does not change once it is made: checking against it here is safe.
  engine_->check_request(request);
  std::shared_ptr<TokenStream> stream;
  {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    if (inbox_->stopping)
      throw Error(ErrorKind::kInvalidArgument, "engine",
                  inbox_->error.empty() ? "is stopping" : "stopped: " + inbox_->error);
    request.id = inbox_->next_id++;
    request.arrival_time = -1;  // stamped by the loop when it adds the request
    stream.reset(new TokenStream(request.id, inbox_));
    inbox_->adds.emplace_back(std::move(request), stream);
  }
  inbox_->cv.notify_one();
  return stream;
}

int64_t EngineLoop::steps() const {
  std::lock_guard<std::mutex> lock(inbox_->mu);
  return inbox_->stats.steps;
}

std::string EngineLoop::failure() const {
  std::lock_guard<std::mutex> lock(inbox_->mu);
  return inbox_->error;
}

LoopStats EngineLoop::stats() const {
  std::lock_guard<std::mutex> lock(inbox_->mu);
  return inbox_->stats;
}

void EngineLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(inbox_->mu);
    if (inbox_->stopping && !thread_.joinable()) return;
    inbox_->stopping = true;
  }
  inbox_->cv.notify_one();
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::run() {
  // Only weak references: a stream its caller dropped is aborted by its destructor, not kept
  // alive by the loop.
  std::unordered_map<int64_t, std::weak_ptr<TokenStream>> streams;
  auto deliver = [&](int64_t id, const std::vector<int32_t>& tokens,
                     std::vector<model::SampledLogprobs> logprobs, serve::FinishReason finish,
                     int64_t cached = 0) {
    auto it = streams.find(id);
    if (it == streams.end()) return;
    if (auto s = it->second.lock()) s->push(tokens, std::move(logprobs), finish, cached);
    if (finish != serve::FinishReason::kNone) streams.erase(it);
  };
  for (;;) {
    std::deque<std::pair<NewRequest, std::shared_ptr<TokenStream>>> adds;
    std::vector<int64_t> aborts;
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(inbox_->mu);
      inbox_->cv.wait(lock, [&] {
        return inbox_->stopping || !inbox_->adds.empty() || !inbox_->aborts.empty() ||
               engine_->has_work();
      });
      adds.swap(inbox_->adds);
      aborts.swap(inbox_->aborts);
      stopping = inbox_->stopping;
    }
    for (auto& [request, stream] : adds) {
      const int64_t id = request.id;
      streams[id] = stream;
      try {
        engine_->add_request(std::move(request));
      } catch (const Error&) {
        // Checked at submit; only an engine that changed its mind gets here.
        deliver(id, {}, {}, serve::FinishReason::kAbort);
      }
    }
    adds.clear();  // the loop keeps no strong reference to a stream
    for (int64_t id : aborts) engine_->abort(id);
    if (stopping) {
      for (auto& [id, weak] : streams) {
        engine_->abort(id);
        if (auto s = weak.lock()) s->push({}, {}, serve::FinishReason::kAbort);
      }
      engine_->step();  // reports the aborts; runs nothing
      return;
    }
    StepResult r;
    try {
      r = engine_->step();
    } catch (const std::exception& e) {
      // A failed step (a device error, say) leaves the engine unusable: end every stream and
      // refuse new requests rather than take the process down from the loop thread. Requests
      // submitted while the step ran are still in the inbox: they end too (their readers would
      // otherwise wait for ever).
      std::deque<std::pair<NewRequest, std::shared_ptr<TokenStream>>> late;
      {
        std::lock_guard<std::mutex> lock(inbox_->mu);
        inbox_->stopping = true;
        inbox_->error = *e.what() ? e.what() : "a step threw";
        late.swap(inbox_->adds);
      }
      for (auto& [id, weak] : streams)
        if (auto st = weak.lock()) st->push({}, {}, serve::FinishReason::kAbort);
      for (auto& [request, stream] : late) stream->push({}, {}, serve::FinishReason::kAbort);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(inbox_->mu);
      LoopStats& st = inbox_->stats;
      ++st.steps;
      st.running = engine_->scheduler().num_running();
      st.waiting = engine_->scheduler().num_waiting();
      st.kv_blocks_used = engine_->blocks().num_used();
      st.prefix_queried_tokens = engine_->scheduler().prefix_queried_tokens();
      st.prefix_hit_tokens = engine_->scheduler().prefix_hit_tokens();
    }
    for (RequestOutput& out : r.outputs)
      deliver(out.id, out.new_tokens, std::move(out.logprobs), out.finish, out.cached_tokens);
  }
}

}  // namespace flashserve::engine
