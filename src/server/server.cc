#include "server/server.h"

#include <httplib.h>
#include <malloc.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>

#include "flashserve/error.h"
#include "server/api_error.h"
#include "server/byte_budget.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/output_assembler.h"
#include "server/peer_socket.h"
#include "server/prometheus.h"
#include "tokenizer/utf8.h"

namespace flashserve::server {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(e.body(), "application/json");
}

void send_json(httplib::Response& res, const json& body) {
  res.status = 200;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
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
  Clock::time_point arrival;
  double last_token = 0;
  int64_t tokens_read = 0;  // from the engine, all of them (for the latency metrics)
  bool first_chunk = true;
  bool done = false;
  // Why the choice is an error instead of a finish: the engine stopped (503), or a failure
  // while generating (500); the response then ends with it.
  std::optional<ApiError> failure;

  Generation(std::unique_ptr<TextStream> text, std::vector<std::string> stop)
      : output(std::move(text), std::move(stop)) {}
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
    const char* reason = output.finish_reason();
    if (!reason) return true;
    if (output.stopped_by_string()) stream->close();  // the engine's request still runs
    if (std::string(reason) == "abort") {
      failure =
          ApiError{503, "the engine ended the request (it is stopping)", {}, "engine_stopped"};
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
  // with an error instead of leaving the handler: thrown from a streaming content provider, it
  // would end the process (httplib calls it outside its exception handler).
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
  int64_t prompt_tokens = 0;
  std::vector<std::unique_ptr<Generation>> choices;
  // Raised by every choice's stream when it gets tokens or ends.
  std::shared_ptr<engine::StreamSignal> signal = std::make_shared<engine::StreamSignal>();
  PeerSocket peer;    // the client's connection, looked at while tokens are awaited
  bool gone = false;  // the client hung up: every choice was aborted, nobody reads the response
  std::atomic<int64_t>* in_flight = nullptr;
  int64_t slots = 0;  // of *in_flight: one per choice
  size_t last = 0;    // the choice that gave the last piece (the next look starts after it)

  Response(std::atomic<int64_t>* in_flight, int64_t slots) : in_flight(in_flight), slots(slots) {}
  ~Response() {
    choices.clear();  // aborts what still runs
    in_flight->fetch_sub(slots);
  }

  Usage usage() const {
    Usage u{prompt_tokens, 0};
    for (const auto& c : choices) u.completion_tokens += c->output.completion_tokens();
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
      if (peer.closed()) {
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
  httplib::Server http;
  std::thread loader;
  std::mutex mu;
  std::exception_ptr load_error;
  std::atomic<bool> stopping{false};
  Backend backend;  // written once by the loader before *ready is set, then only read
  std::atomic<int64_t> in_flight{0};
  std::atomic<int64_t> next_id{0};
  int listen_fd = -1;
  Metrics metrics;
  Clock::time_point started = Clock::now();
  std::unique_ptr<ByteBudget> tokenize_budget;  // of o.tokenize_budget_bytes

  std::optional<ApiError> check_auth(const httplib::Request& req) const {
    if (o.api_key.empty()) return std::nullopt;
    if (same_secret(req.get_header_value("Authorization"), "Bearer " + o.api_key))
      return std::nullopt;
    return ApiError{401,
                    "Incorrect or missing API key: send the header 'Authorization: Bearer <key>'",
                    {},
                    "invalid_api_key"};
  }

  std::optional<ApiError> check_ready() const {
    if (ready->load()) return std::nullopt;
    return ApiError{503, "The model is loading; retry shortly", {}, "model_loading"};
  }

  void health(const httplib::Request&, httplib::Response& res) {
    if (auto e = check_ready()) return send_error(res, *e);
    send_json(res, {{"status", "ok"}});
  }

  void models(const httplib::Request& req, httplib::Response& res) {
    if (auto e = check_auth(req)) return send_error(res, *e);
    if (auto e = check_ready()) return send_error(res, *e);
    const auto created = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    send_json(res, {{"object", "list"},
                    {"data", json::array({{{"id", o.served_model_name},
                                           {"object", "model"},
                                           {"created", created},
                                           {"owned_by", "flashserve"},
                                           {"max_model_len", backend.max_model_len}}})}});
  }

  void prometheus(const httplib::Request&, httplib::Response& res) {
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
    render_metric(out, "process_resident_memory_bytes", "gauge", "Resident memory in bytes.",
                  resident_bytes());
    render_metric(out, "flashserve_heap_in_use_bytes", "gauge",
                  "C heap bytes allocated and not yet freed (glibc; 0 elsewhere).",
                  heap_in_use_bytes());
    metrics.ttft.render(out);
    metrics.tbt.render(out);
    metrics.e2e.render(out);
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
    res.set_content(out, "text/plain; version=0.0.4");
  }

  // The prompt's token ids, from whichever form the request used; nullopt for a text prompt
  // (or chat) with more than max_ids tokens, found without tokenizing all of it.
  std::optional<std::vector<int32_t>> prompt_ids(const GenerationRequest& g, size_t max_ids) const {
    const TextCodec* codec = backend.codec.get();
    if (g.endpoint == Endpoint::kChat) {
      if (!codec)
        throw bad_request(
            "messages",
            "messages: this model has no tokenizer (tokenizer.json) and chat template, "
            "so chat messages cannot be turned into a prompt; use /v1/completions "
            "with a prompt of token ids");
      try {
        const std::string rendered = codec->render_chat(g.messages);
        const ByteBudget::Hold hold = tokenize_budget->acquire(rendered.size());
        return codec->encode_rendered(rendered, max_ids);
      } catch (const Error& e) {
        throw from_error(e, "messages");
      }
    }
    if (g.prompt_text) {
      if (!codec)
        throw bad_request("prompt",
                          "prompt: this model has no tokenizer (tokenizer.json), so a text prompt "
                          "cannot be tokenized; send the prompt as an array of token ids");
      const ByteBudget::Hold hold = tokenize_budget->acquire(g.prompt_text->size());
      return codec->encode(*g.prompt_text, max_ids);
    }
    return g.prompt_ids;
  }

  // The request body, read here rather than by httplib: httplib 0.11 holds a body with a
  // Content-Length to its payload limit but reads a chunked one whole, however large (a 20 MiB
  // chunked body was accepted). Past max_body_bytes the body is no longer kept, the answer is 413,
  // and the connection is closed. The rest of an oversized body is read and dropped first (up to
  // kDrainBytes more): closing a socket with unread data resets the connection, and the client
  // can then lose the 413 before reading it (seen in CI). httplib drains a too-long
  // Content-Length body the same way.
  static constexpr size_t kDrainBytes = 64 << 20;
  std::string read_body(const httplib::Request& req, const httplib::ContentReader& reader,
                        httplib::Response& res) const {
    std::string body;
    bool too_large = false;
    size_t dropped = 0;
    const bool read = reader([&](const char* data, size_t n) {
      if (!too_large && body.size() + n <= o.max_body_bytes) {
        body.append(data, n);
        return true;
      }
      if (!too_large) {
        too_large = true;
        std::string().swap(body);
      }
      dropped += n;
      return dropped <= kDrainBytes;
    });
    if (read && !too_large) return body;
    res.set_header("Connection", "close");
    // httplib reads and drops a declared length past its limit, handing us none of it.
    const std::string length = req.get_header_value("Content-Length");
    if (!too_large && !length.empty())
      too_large = std::strtoull(length.c_str(), nullptr, 10) > o.max_body_bytes;
    if (too_large)
      throw ApiError{
          413,
          "The request body is larger than " + std::to_string(o.max_body_bytes) + " bytes",
          {},
          {}};
    throw ApiError{400, "The request body could not be read", {}, {}};
  }

  void generate(const httplib::Request& req, httplib::Response& res,
                const httplib::ContentReader& reader, Endpoint endpoint) {
    const Clock::time_point arrival = Clock::now();
    // The body is read first, whatever the answer: one left unread would be taken for the next
    // request on a keep-alive connection.
    std::string body;
    try {
      body = read_body(req, reader, res);
    } catch (const ApiError& e) {
      return send_error(res, e);
    }
    if (auto e = check_auth(req)) return send_error(res, *e);
    if (auto e = check_ready()) return send_error(res, *e);
    try {
      generate_checked(req, body, res, endpoint, arrival);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      // From a layer below (the tokenizer, say): its kind decides 400 or 500.
      send_error(res, from_error(e));
    }
  }

  void generate_checked(const httplib::Request& req, const std::string& body,
                        httplib::Response& res, Endpoint endpoint, Clock::time_point arrival) {
    GenerationRequest g = parse_request(body, endpoint);
    if (g.model != o.served_model_name)
      throw ApiError{404,
                     "The model '" + g.model + "' does not exist (this server serves '" +
                         o.served_model_name + "')",
                     "model", "model_not_found"};
    const char* input = endpoint == Endpoint::kChat ? "messages" : "prompt";
    if (!g.stop.empty() && !backend.codec)
      throw bad_request("stop",
                        "stop: stop strings need the model's tokenizer, which it has not; use "
                        "stop_token_ids");
    const int64_t limit = backend.max_model_len;
    const std::optional<std::vector<int32_t>> within = prompt_ids(g, static_cast<size_t>(limit));
    const auto too_long = [&](const std::string& count) {
      return bad_request(input,
                         "This model's maximum context length is " + std::to_string(limit) +
                             " tokens. However, your " + input + " has " + count +
                             " tokens, and at least one token must be generated.",
                         "context_length_exceeded");
    };
    if (!within) throw too_long("more than " + std::to_string(limit));
    const std::vector<int32_t>& ids = *within;
    if (ids.empty()) throw bad_request(input, std::string(input) + ": no tokens");
    const int64_t n = static_cast<int64_t>(ids.size());
    if (n >= limit) throw too_long(std::to_string(n));
    const int64_t max_tokens = g.max_tokens.value_or(
        endpoint == Endpoint::kChat ? limit - n : std::min<int64_t>(16, limit - n));
    if (max_tokens > limit - n)
      throw bad_request(g.max_tokens_param,
                        "This model's maximum context length is " + std::to_string(limit) +
                            " tokens. However, you requested " + std::to_string(n) + " + " +
                            std::to_string(max_tokens) + " tokens (" + std::to_string(n) +
                            " in the " + input + ", " + std::to_string(max_tokens) +
                            " in the completion). Reduce the " + input + " or max_tokens.",
                        "context_length_exceeded");
    engine::NewRequest nr;
    nr.prompt = ids;
    nr.sampling = g.sampling;
    nr.max_tokens = max_tokens;
    nr.stop_token_ids = g.stop_token_ids;
    if (backend.codec && !g.ignore_eos)
      for (int32_t id : backend.codec->eos_token_ids()) nr.stop_token_ids.push_back(id);
    nr.ignore_eos = g.ignore_eos;
    nr.logprobs = g.logprobs;

    // Each choice is a sequence in flight: n choices take n of the server's slots (so n cannot
    // multiply what --max-concurrent-requests bounds).
    if (g.n > o.max_concurrent_requests)
      throw bad_request("n", "n: " + std::to_string(g.n) + " choices are more than this server's " +
                                 std::to_string(o.max_concurrent_requests) +
                                 " requests in flight (--max-concurrent-requests)");
    if (in_flight.fetch_add(g.n) + g.n > o.max_concurrent_requests) {
      in_flight.fetch_sub(g.n);
      throw ApiError{503,
                     "The server is overloaded (" + std::to_string(o.max_concurrent_requests) +
                         " requests in flight); retry later",
                     {},
                     "overloaded"};
    }
    // From here on, resp gives the slots back.
    auto resp = std::make_shared<Response>(&in_flight, g.n);
    resp->include_usage = g.include_usage;
    resp->head.endpoint = endpoint;
    resp->head.id = (endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") +
                    std::to_string(next_id.fetch_add(1));
    resp->head.created = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    resp->head.model = o.served_model_name;
    resp->head.logprobs = g.logprobs >= 0;
    resp->prompt_tokens = n;
    resp->peer = PeerSocket::find(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
    // Each choice is its own sequence, with its own seed: the request's seed + its index (so a
    // seeded request gives the same n choices again), or a fresh one.
    for (int32_t i = 0; i < g.n; ++i) {
      // With prefix caching, the other choices wait for the first to be prefilled (its first
      // token, or its end), so that they take its prompt's blocks rather than compute them too.
      if (i == 1 && backend.prefix_caching)
        while (!resp->choices[0]->stream->wait(std::chrono::milliseconds(50)))
          if (resp->peer.closed()) {
            resp->choices[0]->abort();
            res.status = 499;  // nginx's "client closed request": nobody reads it
            return;
          }
      auto c = std::make_unique<Generation>(backend.codec ? backend.codec->stream(ids) : nullptr,
                                            g.stop);
      c->metrics = &metrics;
      c->arrival = arrival;
      c->logprobs = g.logprobs >= 0;
      c->codec = backend.codec.get();
      nr.sampling.seed = g.seed_given ? g.sampling.seed + static_cast<uint64_t>(i) : fresh_seed();
      try {
        c->stream = backend.loop->submit(nr);
        c->stream->raise_on_push(resp->signal);
      } catch (const Error& e) {  // the choices submitted before are aborted with resp
        if (e.argument() == "engine") throw ApiError{503, e.what(), {}, "engine_stopped"};
        const std::string what = e.what();
        throw from_error(
            e, what.find("stop_token_ids") != std::string::npos ? "stop_token_ids" : input);
      }
      resp->choices.push_back(std::move(c));
    }
    metrics.prompt_tokens += n;

    if (!g.stream) {
      std::vector<Piece> all(resp->choices.size());
      bool more = true;
      while (more) {
        Piece p;
        size_t which = 0;
        more = resp->next(p, which);
        if (resp->gone) {
          res.status = 499;  // nginx's "client closed request": nobody reads it
          return;
        }
        if (resp->failure()) throw *resp->failure();
        Piece& a = all[which];
        a.text += p.text;
        a.token_ids.insert(a.token_ids.end(), p.token_ids.begin(), p.token_ids.end());
        a.logprobs.insert(a.logprobs.end(), p.logprobs.begin(), p.logprobs.end());
        if (p.finish_reason) a.finish_reason = p.finish_reason;
      }
      return send_json(res, full_response(resp->head, all, resp->usage()));
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [resp](size_t, httplib::DataSink& sink) {
          Piece p;
          size_t which = 0;
          const bool more = resp->next(p, which);
          if (resp->gone) return false;  // ends the response; nobody reads it
          const std::optional<ApiError>& failure = resp->failure();
          Generation& c = *resp->choices[which];
          std::string out;
          if (!failure && (c.first_chunk || !p.text.empty() || !p.token_ids.empty() ||
                           !p.logprobs.empty() || p.finish_reason))
            out += sse_event(chunk(resp->head, p, which, c.first_chunk, resp->include_usage));
          if (!failure) c.first_chunk = false;
          if (!more) {
            if (failure) out += sse_event(json::parse(failure->body()));
            if (resp->include_usage) out += sse_event(usage_chunk(resp->head, resp->usage()));
            out += kSseDone;
          }
          // A failed write is a client that went away: returning false ends the response, and
          // dropping `resp` aborts its requests.
          if (!out.empty() && !sink.write(out.data(), out.size())) return false;
          if (!more) sink.done();
          return true;
        },
        [resp](bool) {
          for (auto& c : resp->choices) c->stream->close();
        });
  }
};

Server::Server(ServerOptions options, Loader load) : s_(std::make_unique<State>()) {
  s_->o = std::move(options);
  s_->tokenize_budget = std::make_unique<ByteBudget>(s_->o.tokenize_budget_bytes);
  s_->load = std::move(load);
  s_->ready = &ready_;
  State* s = s_.get();
  auto& http = s->http;
  const size_t threads = static_cast<size_t>(s->o.http_threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(s->o.max_body_bytes);
  // httplib closes a keep-alive connection after 5 requests by default; a client (undici, the
  // openai SDK) that sends its next request as the server closes gets a connection error. Clients
  // reuse connections for thousands of requests: close only when idle (keep-alive timeout).
  http.set_keep_alive_max_count(1 << 20);
  // Remember the listening socket (httplib's default options: SO_REUSEADDR) to widen its backlog.
  http.set_socket_options([s](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    s->listen_fd = sock;
  });
  // Routes. The generation endpoints read their own bodies (State::read_body).
  for (const auto& route : {std::pair{"/v1/completions", Endpoint::kCompletions},
                            std::pair{"/v1/chat/completions", Endpoint::kChat}}) {
    const Endpoint endpoint = route.second;  // a copy: clang < 16 captures no structured binding
    http.Post(route.first, [s, endpoint](const httplib::Request& req, httplib::Response& res,
                                         const httplib::ContentReader& reader) {
      s->generate(req, res, reader, endpoint);
    });
  }
  http.Get("/v1/models", [s](const auto& req, auto& res) { s->models(req, res); });
  http.Get("/health", [s](const auto& req, auto& res) { s->health(req, res); });
  http.Get("/metrics", [s](const auto& req, auto& res) { s->prometheus(req, res); });
  // What httplib answers itself (no route, body too large, malformed HTTP) gets an OpenAI body.
  http.set_error_handler([s](const httplib::Request& req, httplib::Response& res) {
    if (res.body.empty()) {
      std::string message;
      if (res.status == 404)
        message = "No route " + req.method + " " + req.path;
      else if (res.status == 413)
        message =
            "The request body is larger than " + std::to_string(s->o.max_body_bytes) + " bytes";
      else
        message = "HTTP error " + std::to_string(res.status) + " (malformed request?)";
      send_error(res, ApiError{res.status, message, {}, {}});
    }
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, ApiError{500, "Internal error: " + what, {}, {}});
      });
  http.set_logger([s](const httplib::Request&, const httplib::Response& res) {
    s->metrics.count_response(res.status);
  });
}

Server::~Server() {
  stop();
  if (s_->loader.joinable()) s_->loader.join();
}

int Server::bind() {
  int port = s_->o.port;
  if (port == 0) {
    port = s_->http.bind_to_any_port(s_->o.host);
    if (port < 0) throw Error(ErrorKind::kInvalidArgument, "--host", "cannot bind " + s_->o.host);
  } else if (!s_->http.bind_to_port(s_->o.host, port)) {
    throw Error(ErrorKind::kInvalidArgument, "--port",
                "cannot bind " + s_->o.host + ":" + std::to_string(port) + " (in use?)");
  }
  // httplib listens with a backlog of 5: a burst of clients connecting at once overflows it and
  // some see their connection reset. listen() again on the bound socket widens the queue.
  if (s_->listen_fd >= 0) ::listen(s_->listen_fd, SOMAXCONN);
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
      // Leave run(): wait until it listens (stop() before that would be lost).
      while (!s->http.is_running() && !s->stopping.load())
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      s->http.stop();
    }
  });
  return port;
}

void Server::run() {
  s_->http.listen_after_bind();
  if (s_->loader.joinable()) s_->loader.join();
  std::lock_guard<std::mutex> lock(s_->mu);
  // The loader's own error: its kind and argument say what failed (a flag's value, a device).
  if (s_->load_error) std::rethrow_exception(s_->load_error);
}

void Server::stop() {
  if (s_->stopping.exchange(true)) return;
  // The engine first: its streams end (abort), so handlers blocked on them return and httplib's
  // threads can be joined.
  if (ready_.load()) s_->backend.loop->stop();
  // Once stopped, httplib abandons a chunked response between two writes: let the responses the
  // engine just ended write their error event and [DONE] first (each Generation gives its slot
  // back when its response is done). A client that does not read is waited for 2 s at most.
  // (Without this wait, a stream in flight at SIGTERM sometimes ended without [DONE].)
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (s_->in_flight.load() > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  s_->http.stop();
}

}  // namespace flashserve::server
