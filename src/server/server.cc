#include "server/server.h"

#include <malloc.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>
#include <utility>

#include "flashserve/error.h"
#include "flashserve/version.h"
#include "server/api_error.h"
#include "server/byte_budget.h"
#include "server/cors.h"
#include "server/http_transport.h"
#include "server/json_constraint.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/output_assembler.h"
#include "server/prometheus.h"
#include "server/tool_calls.h"
#include "tokenizer/utf8.h"

namespace flashserve::server {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A 503 says when to come back (the loading, overloaded and connection-limit refusals pass; a
// stopped engine does not come back, but a client that retries finds the server gone or restarted).
void send_error(HttpResponder& res, const ApiError& e) {
  std::vector<HttpHeader> headers;
  if (e.status == 503) headers.push_back({"Retry-After", "1"});
  res.respond(e.status, "application/json", e.body(), std::move(headers));
}

void send_json(HttpResponder& res, const json& body) {
  res.respond(200, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace));
}

// Resident memory of this process, from /proc (0 where there is none).
double resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  double pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0;
  return pages_resident * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

// Bytes the C heap has handed out and not had back (glibc's count over all arenas; 0 elsewhere).
// Unlike resident memory it does not move with the allocator's free lists or with thread stacks,
// so a rise in it that outlasts the requests is memory still held for them.
double heap_in_use_bytes() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 m = ::mallinfo2();
  return static_cast<double>(m.uordblks) + static_cast<double>(m.hblkhd);
#else
  return 0;
#endif
}

// Whether `given` is `secret`, in a time that depends on the length of `given` alone: a
// comparison that stops at the first wrong byte tells a client, by its timing, how much of a
// guessed API key is right.
bool same_secret(std::string_view given, std::string_view secret) {
  if (secret.empty()) return false;
  unsigned char diff = given.size() == secret.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ secret[i % secret.size()]);
  return diff == 0;
}

// A seed for a request that gave none: different for every request, so that sampling with
// temperature > 0 is not the same draw each time.
uint64_t fresh_seed() {
  static std::atomic<uint64_t> counter{std::random_device{}()};
  return model::splitmix64(counter.fetch_add(1));
}

// A response's id after its prefix: 32 random hex digits (as vLLM's), unique across the server's
// restarts too, which a count from 0 is not (clients and logs key completions by their id).
std::string fresh_id() {
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(fresh_seed()),
                static_cast<unsigned long long>(fresh_seed()));
  return hex;
}

}  // namespace

namespace {

// Slots of the server's requests in flight (--max-concurrent-requests), given back when dropped.
// A generation request takes one when it arrives (on the event loop's thread, so that one past
// the bound is refused at once), and one more per choice past the first once its body is parsed.
class Slots {
 public:
  Slots(std::atomic<int64_t>* count, int64_t n) : count_(count), n_(n) {}
  Slots(Slots&& o) noexcept : count_(std::exchange(o.count_, nullptr)), n_(o.n_) {}
  Slots& operator=(Slots&&) = delete;
  ~Slots() {
    if (count_) count_->fetch_sub(n_);
  }
  // Takes `more` slots if that stays within `bound`; false (nothing taken) otherwise.
  bool grow(int64_t more, int64_t bound) {
    if (count_->fetch_add(more) + more > bound) {
      count_->fetch_sub(more);
      return false;
    }
    n_ += more;
    return true;
  }

 private:
  std::atomic<int64_t>* count_ = nullptr;
  int64_t n_ = 0;
};

ApiError overloaded(int64_t bound) {
  return ApiError{503,
                  "The server is overloaded (" + std::to_string(bound) +
                      " requests in flight, --max-concurrent-requests); retry later",
                  {},
                  "overloaded"};
}

}  // namespace

// What the server measures, as the client sees it: times are taken when the HTTP handler gets the
// tokens from the engine's stream (a token read together with earlier ones has a gap of 0).
struct Metrics {
  Histogram ttft{"flashserve_time_to_first_token_seconds",
                 "Time from the request's arrival at the server to its first token.",
                 {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5,
                  10, 20, 40, 80}};
  Histogram tbt{"flashserve_time_between_tokens_seconds",
                "Gap between consecutive tokens of a request (inter-token latency).",
                {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                 0.75, 1, 2.5}};
  Histogram e2e{"flashserve_e2e_request_latency_seconds",
                "Time from the request's arrival to its last token.",
                {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120}};
  std::atomic<int64_t> prompt_tokens{0}, generation_tokens{0};
  std::mutex mu;
  std::map<std::string, int64_t> finished;  // by finish reason
  std::map<int, int64_t> responses;         // by HTTP status

  void count_finish(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu);
    ++finished[reason];
  }
  void count_response(int status) {
    std::lock_guard<std::mutex> lock(mu);
    ++responses[status];
  }
};

// One choice of a request from submission to its last token: reads the engine's stream, turns
// ids into text, applies stop strings, measures. Owned by its Response.
struct Generation {
  std::shared_ptr<engine::TokenStream> stream;
  bool logprobs = false;             // the request asked for them
  const TextCodec* codec = nullptr;  // for the logprobs' token bytes; null without a tokenizer
  int64_t text_offset = 0;           // code points of the tokens' texts so far (logprobs)
  OutputAssembler output;
  Metrics* metrics = nullptr;
  const engine::EngineLoop* loop = nullptr;  // to tell a stopping engine from a failed one
  Clock::time_point arrival;
  double last_token = 0;
  int64_t tokens_read = 0;  // from the engine, all of them (for the latency metrics)
  bool first_chunk = true;
  bool done = false;
  // Why the choice is an error instead of a finish: the engine stopped (503), or a failure
  // while generating (500); the response then ends with it.
  std::optional<ApiError> failure;

  std::string echo;  // the prompt's text, sent before the first token's (echo)
  std::unique_ptr<ToolCallReader> tool_calls;  // chat with tools (not "none"): the output as calls

  Generation(std::unique_ptr<TextStream> text, std::vector<std::string> stop, bool include_stop)
      : output(std::move(text), std::move(stop), include_stop) {}
  ~Generation() {
    if (stream) stream->close();  // a client gone mid-stream: its request is aborted now
  }

  // Whether take() has something to read without waiting.
  bool ready() const { return !done && stream->wait(std::chrono::milliseconds(0)); }

  // The next piece of output, once ready(); returns false once it is the last.
  bool take(Piece& p) {
    std::vector<int32_t> got;
    std::vector<model::SampledLogprobs> lps;
    std::vector<model::SampledLogprobs>* lp = logprobs ? &lps : nullptr;
    stream->read(got, lp);
    serve::FinishReason fr = stream->finish_reason();
    // Finished: whatever was pushed with the finish is there to read without waiting.
    if (fr != serve::FinishReason::kNone)
      while (stream->read(got, lp)) {
      }
    std::vector<TokenLogprobs> entries;
    for (const model::SampledLogprobs& s : lps) entries.push_back(logged(s));
    const double t = seconds_since(arrival);
    for (size_t i = 0; i < got.size(); ++i) {
      if (tokens_read++ == 0)
        metrics->ttft.observe(t);
      else
        metrics->tbt.observe(i == 0 ? t - last_token : 0.0);
    }
    if (!got.empty()) last_token = t;
    metrics->generation_tokens += static_cast<int64_t>(got.size());
    output.take(got, std::move(entries), fr, p);
    if (!echo.empty()) p.text.insert(0, std::exchange(echo, {}));
    if (tool_calls) tool_calls->take(p);
    const char* reason = output.finish_reason();
    if (!reason) return true;
    if (output.stopped_by_string()) stream->close();  // the engine's request still runs
    if (std::string(reason) == "abort") {
      // The engine ended it: it is stopping (SIGTERM), or a step failed, which ends every
      // request of that step and the engine with them (the server then exits, Server::run).
      const std::string failed = loop ? loop->failure() : std::string();
      if (failed.empty())
        failure =
            ApiError{503, "the engine ended the request (it is stopping)", {}, "engine_stopped"};
      else
        failure =
            ApiError{500, "The engine failed while generating: " + failed, {}, "engine_failed"};
      p.finish_reason.reset();
    }
    return finish(reason);
  }

  // The client hung up, or another choice failed, before the end: the request is aborted now.
  void abort() {
    if (done) return;
    stream->close();
    finish("abort");
  }

  // take(), but a failure while generating (a detokeniser that throws, say) ends this choice
  // with an error, which the response sends (streamed: an error event, then [DONE]).
  bool take_or_fail(Piece& p) {
    try {
      return take(p);
    } catch (const std::exception& e) {
      stream->close();
      p = Piece{};
      failure = ApiError{500, std::string("Internal error while generating: ") + e.what(), {}, {}};
      return finish("abort");
    }
  }

 private:
  LoggedToken logged(const model::TokenLogprob& t) const {
    if (codec) {
      try {
        return {codec->token_bytes(t.token), true, t.logprob};
      } catch (const Error&) {
        // An id of the model's padded vocabulary that the tokenizer lacks (an alternative the
        // model ranks high, say): named by its id, as without a tokenizer.
      }
    }
    return {"token_id:" + std::to_string(t.token), false, t.logprob};
  }
  TokenLogprobs logged(const model::SampledLogprobs& s) {
    TokenLogprobs out{logged(s.sampled), {}, text_offset};
    for (const model::TokenLogprob& t : s.top) out.top.push_back(logged(t));
    // Offsets count code points of each token's own text, as vLLM's do (Python's len).
    for (unsigned char c : tokenizer::utf8::lossy(out.sampled.bytes))
      text_offset += (c & 0xC0) != 0x80;
    return out;
  }

  bool finish(const char* reason) {
    done = true;
    metrics->e2e.observe(seconds_since(arrival));
    metrics->count_finish(reason);
    return false;
  }
};

// One generation request's response: its choices (n of them, each its own sequence in the
// engine) and what they share. Shared by the handler and (streaming) the content provider; it
// holds one of the server's in-flight slots until it is destroyed.
struct Response {
  ResponseHead head;
  bool include_usage = false;
  int64_t prompt_tokens = 0;  // of every prompt, once each
  int32_t choices_per_prompt = 1;
  std::vector<std::unique_ptr<Generation>> choices;
  // Raised by every choice's stream when it gets tokens or ends.
  std::shared_ptr<engine::StreamSignal> signal = std::make_shared<engine::StreamSignal>();
  const HttpResponder* client;  // the client's connection, looked at while tokens are awaited
  bool gone = false;  // the client hung up: every choice was aborted, nobody reads the response
  Slots slots;        // of the server's requests in flight: one per choice
  size_t last = 0;    // the choice that gave the last piece (the next look starts after it)

  Response(const HttpResponder* client, Slots slots) : client(client), slots(std::move(slots)) {}
  ~Response() {
    choices.clear();  // aborts what still runs, before the slots are given back
  }

  Usage usage() const {
    Usage u{prompt_tokens, 0};
    for (const auto& c : choices) u.completion_tokens += c->output.completion_tokens();
    // Each prompt counts once: its first choice's hits (the others find its blocks too).
    for (size_t i = 0; i < choices.size(); i += static_cast<size_t>(choices_per_prompt))
      u.cached_tokens += choices[i]->stream->cached_tokens();
    return u;
  }
  // The first choice's failure, which ends the whole response.
  const std::optional<ApiError>& failure() const {
    static const std::optional<ApiError> none;
    for (const auto& c : choices)
      if (c->failure) return c->failure;
    return none;
  }

  void abort_all() {
    for (auto& c : choices) c->abort();
  }

  // The next piece of any choice, whose index goes to `which`; returns false once it is the last
  // one, or the client is gone (`gone`), or a choice failed (failure()).
  bool next(Piece& p, size_t& which) {
    for (;;) {
      // The client is looked at before each piece and every 50 ms while none come (the request
      // waits in the queue, or prefills a long prompt): one that hung up is aborted before it
      // costs its prefill, which matters most when the server is overloaded and clients time
      // out. (A streamed response also learns it when a write fails, but only once tokens come.)
      if (client->client_gone()) {
        gone = true;
        abort_all();
        return false;
      }
      const uint64_t seen = signal->count();  // a push after this wakes the wait below
      for (size_t k = 1; k <= choices.size(); ++k) {
        const size_t i = (last + k) % choices.size();  // each choice in turn, none starved
        Generation& c = *choices[i];
        if (!c.ready()) continue;
        last = which = i;
        c.take_or_fail(p);
        if (c.failure) {
          abort_all();
          return false;
        }
        return std::any_of(choices.begin(), choices.end(), [](const auto& o) { return !o->done; });
      }
      if (std::all_of(choices.begin(), choices.end(), [](const auto& c) { return c->done; }))
        return false;
      signal->wait_past(seen, std::chrono::milliseconds(50));
    }
  }
};

struct Server::State {
  ServerOptions o;
  Loader load;
  std::atomic<bool>* ready = nullptr;
  std::unique_ptr<HttpTransport> http;
  std::thread loader;
  std::mutex mu;
  std::condition_variable cv;  // stopping, for the loader thread's watch of the engine
  std::exception_ptr load_error;
  std::string engine_failure;  // why the engine's loop stopped on its own (a step threw)
  std::atomic<bool> stopping{false};
  Backend backend;  // written once by the loader before *ready is set, then only read
  std::atomic<int64_t> in_flight{0};
  // Structured output (response_format json_object / json_schema, tool calls): the tokenizer's
  // vocabulary as a trie, built at the first such request (a few hundred ms for a 128k
  // vocabulary) and shared by all.
  std::once_flag json_trie_once;
  std::shared_ptr<const VocabTrie> json_trie;
  Metrics metrics;
  Clock::time_point started = Clock::now();
  std::unique_ptr<ByteBudget> tokenize_budget;  // of o.tokenize_budget_bytes

  std::optional<ApiError> check_auth(const HttpRequest& req) const {
    if (o.api_keys.empty()) return std::nullopt;
    // Every key is compared, whichever matches: the time says nothing about which one did.
    bool match = false;
    for (const std::string& key : o.api_keys)
      match |= same_secret(req.header("Authorization"), "Bearer " + key);
    if (match) return std::nullopt;
    return ApiError{401,
                    "Incorrect or missing API key: send the header 'Authorization: Bearer <key>'",
                    {},
                    "invalid_api_key"};
  }

  // "'a', 'b'": the names a request may give as `model`.
  std::string served_names() const {
    std::string out;
    for (const std::string& name : o.served_model_names)
      out += (out.empty() ? "'" : ", '") + name + "'";
    return out;
  }

  std::optional<ApiError> check_ready() const {
    if (ready->load()) {
      // A failed engine serves nothing more: probes see it at once, and the server exits.
      const std::string failed = backend.loop->failure();
      if (failed.empty()) return std::nullopt;
      return ApiError{
          503, "The engine failed (the server is stopping): " + failed, {}, "engine_failed"};
    }
    return ApiError{503, "The model is loading; retry shortly", {}, "model_loading"};
  }

  void health(const HttpRequest&, HttpResponder& res) {
    if (auto e = check_ready()) return send_error(res, *e);
    send_json(res, {{"status", "ok"}});
  }

  void models(const HttpRequest& req, HttpResponder& res) {
    if (auto e = check_auth(req)) return send_error(res, *e);
    if (auto e = check_ready()) return send_error(res, *e);
    const auto created = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    json data = json::array();
    for (const std::string& name : o.served_model_names)
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", created},
                      {"owned_by", "flashserve"},
                      {"root", o.served_model_names.front()},
                      {"max_model_len", backend.max_model_len}});
    send_json(res, {{"object", "list"}, {"data", std::move(data)}});
  }

  void prometheus(const HttpRequest&, HttpResponder& res) {
    std::string out;
    engine::LoopStats st;
    if (ready->load()) st = backend.loop->stats();
    render_metric(out, "flashserve_model_loaded", "gauge", "1 once the model serves requests.",
                  ready->load() ? 1 : 0);
    render_metric(out, "flashserve_requests_running", "gauge",
                  "Requests in the engine's running batch.", static_cast<double>(st.running));
    render_metric(out, "flashserve_requests_waiting", "gauge",
                  "Requests queued in the engine, not yet running.",
                  static_cast<double>(st.waiting));
    render_metric(out, "flashserve_http_requests_in_flight", "gauge",
                  "Generation requests the HTTP server is serving (n choices count n).",
                  static_cast<double>(in_flight.load()));
    render_metric(out, "flashserve_kv_blocks_used", "gauge", "Paged-KV blocks in use.",
                  static_cast<double>(st.kv_blocks_used));
    render_metric(out, "flashserve_kv_blocks_total", "gauge", "Paged-KV blocks in the pool.",
                  static_cast<double>(st.kv_blocks_total));
    render_metric(out, "flashserve_engine_steps_total", "counter", "Engine steps run.",
                  static_cast<double>(st.steps));
    render_metric(out, "flashserve_prefix_cache_queries_total", "counter",
                  "Prompt tokens looked up in the prefix cache (full blocks).",
                  static_cast<double>(st.prefix_queried_tokens));
    render_metric(out, "flashserve_prefix_cache_hits_total", "counter",
                  "Prompt tokens found in the prefix cache (not computed again).",
                  static_cast<double>(st.prefix_hit_tokens));
    render_metric(out, "flashserve_prompt_tokens_total", "counter", "Prompt tokens submitted.",
                  static_cast<double>(metrics.prompt_tokens.load()));
    render_metric(out, "flashserve_generation_tokens_total", "counter",
                  "Tokens generated and delivered to the HTTP server.",
                  static_cast<double>(metrics.generation_tokens.load()));
    const HttpTransportStats& hs = http->stats();
    render_metric(out, "flashserve_http_connections_open", "gauge", "HTTP connections open now.",
                  static_cast<double>(hs.open.load()));
    render_metric(out, "flashserve_http_connections_accepted_total", "counter",
                  "HTTP connections accepted (refused ones included).",
                  static_cast<double>(hs.accepted.load()));
    render_metric(out, "flashserve_http_connections_refused_total", "counter",
                  "HTTP connections refused past --max-connections (503, closed).",
                  static_cast<double>(hs.refused.load()));
    out +=
        "# HELP flashserve_http_timeouts_total HTTP connections closed at a deadline, by "
        "deadline.\n# TYPE flashserve_http_timeouts_total counter\n";
    for (const auto& [what, n] :
         {std::pair{"header", &hs.header_timeouts}, std::pair{"body", &hs.body_timeouts},
          std::pair{"idle", &hs.idle_timeouts}, std::pair{"write", &hs.write_timeouts}})
      out += std::string("flashserve_http_timeouts_total{deadline=\"") + what + "\"} " +
             std::to_string(n->load()) + "\n";
    render_metric(out, "flashserve_http_workers", "gauge",
                  "Threads serving generation requests now (one per request).",
                  static_cast<double>(hs.workers.load()));
    render_metric(out, "process_resident_memory_bytes", "gauge", "Resident memory in bytes.",
                  resident_bytes());
    render_metric(out, "flashserve_heap_in_use_bytes", "gauge",
                  "C heap bytes allocated and not yet freed (glibc; 0 elsewhere).",
                  heap_in_use_bytes());
    metrics.ttft.render(out);
    metrics.tbt.render(out);
    metrics.e2e.render(out);
    vllm_metrics(out, st);
    {
      std::lock_guard<std::mutex> lock(metrics.mu);
      out += "# HELP flashserve_requests_finished_total Generation requests finished, by reason.\n";
      out += "# TYPE flashserve_requests_finished_total counter\n";
      for (const auto& [reason, n] : metrics.finished)
        out += "flashserve_requests_finished_total{finish_reason=\"" + reason + "\"} " +
               std::to_string(n) + "\n";
      out += "# HELP flashserve_http_responses_total HTTP responses, by status code.\n";
      out += "# TYPE flashserve_http_responses_total counter\n";
      for (const auto& [status, n] : metrics.responses)
        out += "flashserve_http_responses_total{code=\"" + std::to_string(status) + "\"} " +
               std::to_string(n) + "\n";
    }
    res.respond(200, "text/plain; version=0.0.4", std::move(out));
  }

  // vLLM's names for what /metrics shows as flashserve_*, so that vLLM's dashboards and
  // autoscalers find them: the same counts (one observation each), labelled with the model as
  // vLLM labels them.
  void vllm_metrics(std::string& out, const engine::LoopStats& st) {
    std::string label = "model_name=\"";
    for (const char c : o.served_model_names.front()) {
      if (c == '\\' || c == '"') label += '\\';
      label += c == '\n' ? std::string("\\n") : std::string(1, c);
    }
    label += "\"";
    const double usage = st.kv_blocks_total > 0 ? static_cast<double>(st.kv_blocks_used) /
                                                      static_cast<double>(st.kv_blocks_total)
                                                : 0.0;
    render_metric(out, "vllm:num_requests_running", "gauge",
                  "Number of requests in model execution batches.", static_cast<double>(st.running),
                  label);
    render_metric(out, "vllm:num_requests_waiting", "gauge",
                  "Number of requests waiting to be processed.", static_cast<double>(st.waiting),
                  label);
    render_metric(out, "vllm:gpu_cache_usage_perc", "gauge",
                  "KV-cache usage. 1 means 100 percent usage (the KV pool, on any device).", usage,
                  label);
    render_metric(out, "vllm:kv_cache_usage_perc", "gauge",
                  "KV-cache usage. 1 means 100 percent usage.", usage, label);
    render_metric(out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                  static_cast<double>(metrics.prompt_tokens.load()), label);
    render_metric(out, "vllm:generation_tokens_total", "counter",
                  "Number of generation tokens processed.",
                  static_cast<double>(metrics.generation_tokens.load()), label);
    render_metric(out, "vllm:prefix_cache_queries_total", "counter",
                  "Prefix cache queries, in terms of number of queried tokens.",
                  static_cast<double>(st.prefix_queried_tokens), label);
    render_metric(out, "vllm:prefix_cache_hits_total", "counter",
                  "Prefix cache hits, in terms of number of cached tokens.",
                  static_cast<double>(st.prefix_hit_tokens), label);
    metrics.ttft.render(out, "vllm:time_to_first_token_seconds", label);
    metrics.tbt.render(out, "vllm:time_per_output_token_seconds", label);
    metrics.e2e.render(out, "vllm:e2e_request_latency_seconds", label);
    std::lock_guard<std::mutex> lock(metrics.mu);
    out += "# HELP vllm:request_success_total Count of successfully processed requests.\n";
    out += "# TYPE vllm:request_success_total counter\n";
    for (const auto& [reason, n] : metrics.finished)
      if (reason != "abort")
        out += "vllm:request_success_total{" + label + ",finished_reason=\"" + reason + "\"} " +
               std::to_string(n) + "\n";
  }

  // The model a request names ("" : the default, the first served name), or 404.
  std::string served_model(const std::string& asked) const {
    if (asked.empty()) return o.served_model_names.front();
    if (std::find(o.served_model_names.begin(), o.served_model_names.end(), asked) ==
        o.served_model_names.end())
      throw ApiError{
          404,
          "The model '" + asked + "' does not exist (this server serves " + served_names() + ")",
          "model", "model_not_found"};
    return asked;
  }

  // vLLM's POST /tokenize: {count, max_model_len, tokens, token_strs}.
  void tokenize(const HttpRequest& req, HttpResponder& res) {
    if (auto e = check_auth(req)) return send_error(res, *e);
    if (auto e = check_ready()) return send_error(res, *e);
    try {
      const TokenizeRequest t = parse_tokenize_request(req.body);
      served_model(t.model);
      GenerationRequest g;
      g.endpoint = t.prompt ? Endpoint::kCompletions : Endpoint::kChat;
      g.messages = t.messages;
      Prompt p{t.prompt, {}};
      if (!backend.codec)
        throw bad_request(t.prompt ? "prompt" : "messages",
                          "this model has no tokenizer (tokenizer.json)");
      // Counted whatever its length (the limit is for what generates), within the budget.
      const std::vector<int32_t> ids = *prompt_ids(g, &p, SIZE_MAX);
      json strs = nullptr;
      if (t.return_token_strs) {
        strs = json::array();
        for (int32_t id : ids)
          strs.push_back(tokenizer::utf8::lossy(backend.codec->token_bytes(id)));
      }
      send_json(res, {{"count", ids.size()},
                      {"max_model_len", backend.max_model_len},
                      {"tokens", ids},
                      {"token_strs", strs}});
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      send_error(res, from_error(e));
    }
  }

  // vLLM's POST /detokenize: {prompt}.
  void detokenize(const HttpRequest& req, HttpResponder& res) {
    if (auto e = check_auth(req)) return send_error(res, *e);
    if (auto e = check_ready()) return send_error(res, *e);
    try {
      const DetokenizeRequest d = parse_detokenize_request(req.body);
      served_model(d.model);
      if (!backend.codec)
        throw bad_request("tokens", "tokens: this model has no tokenizer (tokenizer.json)");
      send_json(res, {{"prompt", backend.codec->decode(d.tokens, /*skip_special_tokens=*/true)}});
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      send_error(res, from_error(e, "tokens"));
    }
  }

  // The token ids of chat's rendered messages, or of one completions prompt, from whichever form
  // the request used; nullopt for a text prompt (or chat) with more than max_ids tokens, found
  // without tokenizing all of it.
  std::optional<std::vector<int32_t>> prompt_ids(const GenerationRequest& g, const Prompt* prompt,
                                                 size_t max_ids) const {
    const TextCodec* codec = backend.codec.get();
    if (g.endpoint == Endpoint::kChat) {
      if (!codec)
        throw bad_request(
            "messages",
            "messages: this model has no tokenizer (tokenizer.json) and chat template, "
            "so chat messages cannot be turned into a prompt; use /v1/completions "
            "with a prompt of token ids");
      try {
        const std::string rendered = codec->render_chat(g.messages, g.tools.json);
        const ByteBudget::Hold hold = tokenize_budget->acquire(rendered.size());
        return codec->encode_rendered(rendered, max_ids);
      } catch (const Error& e) {
        throw from_error(e, "messages");
      }
    }
    if (prompt->text) {
      if (!codec)
        throw bad_request("prompt",
                          "prompt: this model has no tokenizer (tokenizer.json), so a text prompt "
                          "cannot be tokenized; send the prompt as an array of token ids");
      const ByteBudget::Hold hold = tokenize_budget->acquire(prompt->text->size());
      return codec->encode(*prompt->text, max_ids);
    }
    return prompt->ids;
  }

  // A generation request, on a worker thread of its own (it blocks while its tokens come), with
  // the one slot it took on arrival. The transport has read its whole body within the limits.
  void generate(const HttpRequest& req, HttpResponder& res, Endpoint endpoint, Slots slots,
                Clock::time_point arrival) {
    if (auto e = check_auth(req)) return send_error(res, *e);
    if (auto e = check_ready()) return send_error(res, *e);
    try {
      generate_checked(req.body, res, endpoint, std::move(slots), arrival);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      // From a layer below (the tokenizer, say): its kind decides 400 or 500.
      send_error(res, from_error(e));
    }
  }

  void generate_checked(const std::string& body, HttpResponder& res, Endpoint endpoint, Slots slots,
                        Clock::time_point arrival) {
    GenerationRequest g = parse_request(body, endpoint);
    // No model: the first served name (vLLM's default); else one of them, echoed back.
    g.model = served_model(g.model);
    const char* input = endpoint == Endpoint::kChat ? "messages" : "prompt";
    if (!g.stop.empty() && !backend.codec)
      throw bad_request("stop",
                        "stop: stop strings need the model's tokenizer, which it has not; use "
                        "stop_token_ids");
    const int64_t limit = backend.max_model_len;
    // Each prompt (chat: the rendered messages) with its own checks; a batch of prompts gives
    // n choices each, choice p * n + j being prompt p's j-th (as vLLM numbers them).
    struct PromptRun {
      std::vector<int32_t> ids;
      int64_t max_tokens = 0;
      std::string echo;  // the text the choices start with (echo)
    };
    std::vector<PromptRun> runs;
    const size_t num_prompts = endpoint == Endpoint::kChat ? 1 : g.prompts.size();
    for (size_t k = 0; k < num_prompts; ++k) {
      const Prompt* prompt = endpoint == Endpoint::kChat ? nullptr : &g.prompts[k];
      const std::optional<std::vector<int32_t>> within =
          prompt_ids(g, prompt, static_cast<size_t>(limit));
      const auto too_long = [&](const std::string& count) {
        return bad_request(input,
                           "This model's maximum context length is " + std::to_string(limit) +
                               " tokens. However, your " + input + " has " + count +
                               " tokens, and at least one token must be generated.",
                           "context_length_exceeded");
      };
      if (!within) throw too_long("more than " + std::to_string(limit));
      PromptRun run;
      run.ids = *within;
      if (run.ids.empty()) throw bad_request(input, std::string(input) + ": no tokens");
      const int64_t n = static_cast<int64_t>(run.ids.size());
      if (n >= limit) throw too_long(std::to_string(n));
      run.max_tokens = g.max_tokens.value_or(
          endpoint == Endpoint::kChat ? limit - n : std::min<int64_t>(16, limit - n));
      if (run.max_tokens > limit - n)
        throw bad_request(g.max_tokens_param,
                          "This model's maximum context length is " + std::to_string(limit) +
                              " tokens. However, you requested " + std::to_string(n) + " + " +
                              std::to_string(run.max_tokens) + " tokens (" + std::to_string(n) +
                              " in the " + input + ", " + std::to_string(run.max_tokens) +
                              " in the completion). Reduce the " + input + " or max_tokens.",
                          "context_length_exceeded");
      if (g.sampling.min_tokens > run.max_tokens)
        throw bad_request("min_tokens", "min_tokens: " + std::to_string(g.sampling.min_tokens) +
                                            " is more than the " + std::to_string(run.max_tokens) +
                                            " tokens this prompt may generate");
      if (g.echo)
        run.echo = prompt->text    ? *prompt->text
                   : backend.codec ? backend.codec->decode(run.ids, g.skip_special_tokens)
                                   : std::string();
      runs.push_back(std::move(run));
    }
    if (g.grammar) {
      if (!backend.codec || backend.codec->vocab_size() <= 0)
        throw bad_request(g.tools.grammar ? "tool_choice" : "response_format",
                          std::string(g.tools.grammar ? "tool_choice" : "response_format") +
                              ": structured output needs the model's tokenizer "
                              "(tokenizer.json), which this model directory lacks");
      std::call_once(json_trie_once, [&] {
        json_trie = VocabTrie::build(*backend.codec, backend.codec->vocab_size());
      });
    }
    engine::NewRequest nr;
    nr.sampling = g.sampling;
    nr.stop_token_ids = g.stop_token_ids;
    if (backend.codec && !g.ignore_eos)
      for (int32_t id : backend.codec->eos_token_ids()) nr.stop_token_ids.push_back(id);
    nr.ignore_eos = g.ignore_eos;
    nr.logprobs = g.logprobs;

    // Each choice is a sequence in flight: n choices of each prompt take as many of the server's
    // slots (so neither n nor a batch can multiply what --max-concurrent-requests bounds).
    const int64_t choices = g.n * static_cast<int64_t>(runs.size());
    if (choices > o.max_concurrent_requests)
      throw bad_request(runs.size() > 1 ? "prompt" : "n",
                        std::string(runs.size() > 1 ? "prompt: " : "n: ") +
                            std::to_string(choices) + " choices are more than this server's " +
                            std::to_string(o.max_concurrent_requests) +
                            " requests in flight (--max-concurrent-requests)");
    if (!slots.grow(choices - 1, o.max_concurrent_requests))
      throw overloaded(o.max_concurrent_requests);
    // From here on, resp gives the slots back.
    auto resp = std::make_unique<Response>(&res, std::move(slots));
    resp->include_usage = g.include_usage;
    resp->head.endpoint = endpoint;
    resp->head.id = (endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + fresh_id();
    resp->head.created = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    resp->head.model = g.model;
    resp->head.logprobs = g.logprobs >= 0;
    for (const PromptRun& run : runs) resp->prompt_tokens += static_cast<int64_t>(run.ids.size());
    resp->choices_per_prompt = g.n;
    // Each choice is its own sequence, with its own seed: the request's seed + its index (so a
    // seeded request gives the same choices again), or a fresh one.
    const auto submit = [&](size_t k, int32_t j) {
      const PromptRun& run = runs[k];
      auto c = std::make_unique<Generation>(
          backend.codec ? backend.codec->stream(run.ids, g.skip_special_tokens) : nullptr, g.stop,
          g.include_stop_str_in_output);
      c->metrics = &metrics;
      c->loop = backend.loop.get();
      c->arrival = arrival;
      c->logprobs = g.logprobs >= 0;
      c->codec = backend.codec.get();
      c->echo = run.echo;
      const uint64_t index = k * static_cast<uint64_t>(g.n) + static_cast<uint64_t>(j);
      nr.prompt = run.ids;
      nr.max_tokens = run.max_tokens;
      nr.sampling.seed = g.seed_given ? g.sampling.seed + index : fresh_seed();
      // Each choice its own grammar state, and (tools) its own reading of the output as calls.
      nr.constraint = g.grammar ? std::make_shared<JsonConstraint>(json_trie, g.grammar) : nullptr;
      if (g.tools.choice != ToolChoice::kNone)
        c->tool_calls = std::make_unique<ToolCallReader>(g.tools, fresh_seed());
      try {
        c->stream = backend.loop->submit(nr);
        c->stream->raise_on_push(resp->signal);
      } catch (const Error& e) {       // the choices submitted before are aborted with them
        if (e.argument() == "engine")  // stopping (SIGTERM), or failed (a step threw)
          throw ApiError{503,
                         e.what(),
                         {},
                         backend.loop->failure().empty() ? "engine_stopped" : "engine_failed"};
        const std::string what = e.what();
        throw from_error(e, what.find("stop_token_ids") != std::string::npos ? "stop_token_ids"
                            : what.find("logit_bias") != std::string::npos   ? "logit_bias"
                                                                             : input);
      }
      return c;
    };
    std::vector<std::vector<std::unique_ptr<Generation>>> by_prompt(runs.size());
    for (size_t k = 0; k < runs.size(); ++k) by_prompt[k].push_back(submit(k, 0));
    for (size_t k = 0; k < runs.size(); ++k)
      for (int32_t j = 1; j < g.n; ++j) {
        // With prefix caching, a prompt's other choices wait for its first to be prefilled (its
        // first token, or its end), so that they take its blocks rather than compute them too.
        if (j == 1 && backend.prefix_caching)
          while (!by_prompt[k][0]->stream->wait(std::chrono::milliseconds(50)))
            if (res.client_gone())  // by_prompt's choices are aborted as it goes
              return res.respond(499, "application/json", "");  // nginx's "client closed request"
        by_prompt[k].push_back(submit(k, j));
      }
    for (auto& choices_of_prompt : by_prompt)
      for (auto& c : choices_of_prompt) resp->choices.push_back(std::move(c));
    metrics.prompt_tokens += resp->prompt_tokens;

    if (!g.stream) {
      std::vector<Piece> all(resp->choices.size());
      bool more = true;
      while (more) {
        Piece p;
        size_t which = 0;
        more = resp->next(p, which);
        if (resp->gone)  // nginx's "client closed request": nobody reads it
          return res.respond(499, "application/json", "");
        if (resp->failure()) throw *resp->failure();
        Piece& a = all[which];
        a.text += p.text;
        a.token_ids.insert(a.token_ids.end(), p.token_ids.begin(), p.token_ids.end());
        a.logprobs.insert(a.logprobs.end(), p.logprobs.begin(), p.logprobs.end());
        for (const ToolCall& t : p.tool_calls) a.add_tool_call(t);
        if (p.finish_reason) a.finish_reason = p.finish_reason;
      }
      return send_json(res, full_response(resp->head, all, resp->usage()));
    }
    // Streamed: each piece as it comes. Returning drops `resp`, which aborts what still runs
    // (a client gone, a failed write).
    if (!res.begin_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}})) return;
    for (;;) {
      Piece p;
      size_t which = 0;
      const bool more = resp->next(p, which);
      if (resp->gone) return;  // nobody reads it
      const std::optional<ApiError>& failure = resp->failure();
      Generation& c = *resp->choices[which];
      std::string out;
      if (!failure && (c.first_chunk || !p.text.empty() || !p.token_ids.empty() ||
                       !p.logprobs.empty() || !p.tool_calls.empty() || p.finish_reason))
        out += sse_event(chunk(resp->head, p, which, c.first_chunk, resp->include_usage));
      if (!failure) c.first_chunk = false;
      if (!more) {
        if (failure) out += sse_event(json::parse(failure->body()));
        if (resp->include_usage) out += sse_event(usage_chunk(resp->head, resp->usage()));
        out += kSseDone;
      }
      if (!out.empty() && !res.write(out)) return;
      if (!more) return res.end_stream();
    }
  }

  // SIGTERM, stop(), or a failed engine: the engine first, so that its streams end (an error event
  // and [DONE]) and the handlers waiting on them return; their responses are given 2 s to be
  // written (a client that does not read is not waited for longer), then the transport closes
  // every connection and joins the workers.
  void shutdown() {
    if (stopping.exchange(true)) return;
    cv.notify_all();
    if (ready->load()) backend.loop->stop();
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    // Every response written, not only every handler returned: a request that failed has its
    // error queued on the event loop after its slot is given back, and stop() would cut it off.
    while (http->stats().responding.load() > 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    http->stop();
  }

  // A route of dispatch()'s table (kRoutes, the one place that names each path and its methods):
  // a path the table does not list is answered 404, a listed one asked with another method 405.
  struct Route {
    std::string_view path;
    bool post;  // POST only; otherwise GET and HEAD
    void (*handle)(State&, HttpRequest&&, std::shared_ptr<HttpResponder>);
  };
  // What the transport hands over, on the event loop's thread: the cheap routes are answered
  // here; a generation request takes a slot (or is refused at once) and gets a worker thread.
  void dispatch(HttpRequest req, std::shared_ptr<HttpResponder> res) {
    if (!o.allowed_origins.empty()) {
      if (is_cors_preflight(req)) return answer_cors_preflight(o.allowed_origins, req, *res);
      if (auto allow = cors_allow_origin(o.allowed_origins, req))
        res = with_cors(std::move(res), std::move(*allow));
    }
    // Bodies are read as they come: one in a content coding (gzip, ...) is refused naming it,
    // where it would otherwise be parsed as JSON text as if it had none.
    std::string coding = req.header("Content-Encoding");
    std::transform(coding.begin(), coding.end(), coding.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (!coding.empty() && coding != "identity") {
      const ApiError e{415,
                       "Content-Encoding '" + req.header("Content-Encoding") +
                           "' is not supported: send the body uncompressed",
                       {},
                       "unsupported_content_encoding"};
      return res->respond(415, "application/json", e.body(), {{"Accept-Encoding", "identity"}});
    }
    // In the function's body, where State is complete (the handlers call its members).
    static constexpr Route kRoutes[] = {
        {"/v1/completions", true,
         [](State& s, HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
           s.start_generation(std::move(req), std::move(res), Endpoint::kCompletions);
         }},
        {"/v1/chat/completions", true,
         [](State& s, HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
           s.start_generation(std::move(req), std::move(res), Endpoint::kChat);
         }},
        // Tokenizing a long prompt blocks: on a worker, as generation does.
        {"/tokenize", true,
         [](State& s, HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
           s.http->spawn([&s, req = std::move(req), res] { s.tokenize(req, *res); });
         }},
        {"/detokenize", true,
         [](State& s, HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
           s.http->spawn([&s, req = std::move(req), res] { s.detokenize(req, *res); });
         }},
        {"/health", false,
         [](State& s, HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
           s.health(req, *res);
         }},
        {"/metrics", false,
         [](State& s, HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
           s.prometheus(req, *res);
         }},
        {"/v1/models", false,
         [](State& s, HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
           s.models(req, *res);
         }},
        {"/version", false,
         [](State&, HttpRequest&&, std::shared_ptr<HttpResponder> res) {
           send_json(*res, {{"version", FLASHSERVE_VERSION}});
         }},
    };
    const auto route = std::find_if(std::begin(kRoutes), std::end(kRoutes),
                                    [&](const Route& r) { return r.path == req.path; });
    if (route == std::end(kRoutes))
      return send_error(*res, ApiError{404, "No route " + req.method + " " + req.path, {}, {}});
    // HEAD is GET whose answer goes without its body (the transport drops it): every
    // general-purpose server supports it (RFC 9110), and probes and uptime checkers send it.
    if (route->post ? req.method == "POST" : req.method == "GET" || req.method == "HEAD")
      return route->handle(*this, std::move(req), std::move(res));
    // A route asked with another method: 405 naming the ones it takes (RFC 9110), as vLLM answers
    // it; a 404 would tell a client that GETs /v1/completions that the path is wrong.
    const std::string allow = route->post ? "POST" : "GET, HEAD";
    const ApiError e{
        405,
        "Method " + req.method + " not allowed on " + req.path + " (only " + allow + ")",
        {},
        "method_not_allowed"};
    res->respond(405, "application/json", e.body(), {{"Allow", allow}});
  }

  // A generation request takes a slot (or is refused at once) and runs on a worker thread.
  void start_generation(HttpRequest req, std::shared_ptr<HttpResponder> res, Endpoint endpoint) {
    const Clock::time_point arrival = Clock::now();
    Slots slot(&in_flight, 0);
    if (!slot.grow(1, o.max_concurrent_requests))
      return send_error(*res, overloaded(o.max_concurrent_requests));
    http->spawn([this, req = std::move(req), res, endpoint, arrival,
                 slot = std::make_shared<Slots>(std::move(slot))]() mutable {
      generate(req, *res, endpoint, std::move(*slot), arrival);
    });
  }

  // The body of an error the transport answers itself.
  static std::string transport_error(int status, const std::string& message) {
    std::string code;
    if (status == 408) code = "request_timeout";
    if (status == 503) code = "too_many_connections";
    return ApiError{status, message, {}, code}.body();
  }
};

Server::Server(ServerOptions options, Loader load) : s_(std::make_unique<State>()) {
  s_->o = std::move(options);
  s_->tokenize_budget = std::make_unique<ByteBudget>(s_->o.tokenize_budget_bytes);
  s_->load = std::move(load);
  s_->ready = &ready_;
  State* s = s_.get();
  HttpLimits limits = s->o.http;
  limits.max_body_bytes = s->o.max_body_bytes;
  s->http = std::make_unique<HttpTransport>(
      limits,
      [s](HttpRequest req, std::shared_ptr<HttpResponder> res) {
        s->dispatch(std::move(req), std::move(res));
      },
      [s](int status) { s->metrics.count_response(status); }, &State::transport_error);
}

Server::~Server() {
  stop();
  if (s_->loader.joinable()) s_->loader.join();
}

int Server::bind() {
  const int port = s_->http->bind(s_->o.host, s_->o.port);
  State* s = s_.get();
  s->loader = std::thread([s] {
    try {
      s->backend = s->load();
      s->ready->store(true);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(s->mu);
        s->load_error = std::current_exception();
      }
      s->http->stop();  // run() returns and throws it
      return;
    }
    // A step that throws stops the engine's loop, and every request it ran ends with an error
    // (Generation::take); then the server stops and run() says why, so that the process exits
    // with the message rather than live on answering 503 (a supervisor restarts it).
    std::unique_lock<std::mutex> lock(s->mu);
    while (!s->stopping.load()) {
      s->cv.wait_for(lock, std::chrono::milliseconds(20));
      const std::string failed = s->backend.loop->failure();
      if (failed.empty()) continue;
      s->engine_failure = failed;
      lock.unlock();
      std::fprintf(stderr, "flashserve serve: the engine failed: %s; stopping\n", failed.c_str());
      s->shutdown();
      return;
    }
  });
  return port;
}

void Server::run() {
  s_->http->run();
  if (s_->loader.joinable()) s_->loader.join();
  std::lock_guard<std::mutex> lock(s_->mu);
  // The loader's own error: its kind and argument say what failed (a flag's value, a device).
  if (s_->load_error) std::rethrow_exception(s_->load_error);
  if (!s_->engine_failure.empty())
    throw Error(ErrorKind::kInternal, "engine", "a step failed: " + s_->engine_failure);
}

void Server::stop() {
  s_->shutdown();
}

}  // namespace flashserve::server
