// flashserve serve: the OpenAI-compatible HTTP server (server/server.h) on a model directory.
// Flags take vLLM's names where vLLM has the same flag (cli/vllm_flags.h: vLLM's that it refuses,
// and vLLM's ways of writing values).
//   flashserve serve /tmp/tiny --device cpu --port 8000
//   curl localhost:8000/v1/completions -d '{"prompt": [1, 2, 3]}'
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "cli/kv_cache_flag.h"
#include "cli/options.h"
#include "cli/tensor_parallel_flag.h"
#include "cli/vllm_flags.h"
#include "engine/model_engine.h"
#include "flashserve/error.h"
#include "model/checkpoint.h"
#include "server/server.h"
#include "server/tokenizer_codec.h"

namespace flashserve::cli {
namespace {

namespace fe = flashserve::engine;
namespace fs = flashserve::serve;

int stop_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
  const char c = static_cast<char>(sig);
  (void)!::write(stop_pipe[1], &c, 1);  // async-signal-safe
}

int serve(int argc, char** argv) {
  // vLLM's flags that mean nothing here stop with why, before CLI11 would call them merely
  // unexpected; `-tp N`, vLLM's short form, reads as --tensor-parallel-size N.
  refuse_vllm_flags(argc, argv);
  std::vector<char*> args(argv, argv + argc);
  std::string tp_long = "--tensor-parallel-size";
  for (char*& a : args)
    if (std::string_view(a) == "-tp") a = tp_long.data();
  argc = static_cast<int>(args.size());
  argv = args.data();

  server::ServerOptions so;
  std::string model_dir, model_flag, policy = "sarathi", device = "cpu", dtype = "auto";
  int64_t port = so.port, budget = 512, max_model_len = 0, max_num_seqs = 256, chunk_tile = 64;
  double gpu_mem_util = 0.9, kv_memory_mb = 256;
  std::vector<std::string> api_keys_given, origins_given;
  CLI::App app{"The OpenAI-compatible HTTP server (vLLM's command line where it applies)"};
  app.option_defaults()->always_capture_default();
  auto* model_pos_opt = app.add_option("model", model_dir,
                                       "model directory (config.json + safetensors), as in "
                                       "`vllm serve MODEL`");
  auto* model_flag_opt = app.add_option("--model", model_flag, "the model directory, as a flag");
  app.add_option("--host", so.host, "address to listen on");
  add_int(app, "--port", port, {0, 65535}, "port to listen on (0: any free port)");
  app.add_option("--api-key", api_keys_given,
                 "require 'Authorization: Bearer KEY' on /v1 routes, one of "
                 "these keys (default: VLLM_API_KEY's)");
  auto* policy_opt = app.add_option("--policy", policy, "scheduler: " + fs::policy_names());
  auto* budget_opt = add_int(app, "--budget", budget, {1, 1 << 20},
                             "token budget per step (default: the policy's; sarathi 512, vllm-v1 "
                             "8192)");
  auto* batched_opt =
      add_int(app, "--max-num-batched-tokens", budget, {1, 1 << 20}, "vLLM's name of --budget");
  bool chunked_prefill = true;
  auto* chunked_opt =
      app.add_flag("--enable-chunked-prefill,!--no-enable-chunked-prefill", chunked_prefill,
                   "vLLM's switch: on chooses sarathi (stall-free chunked "
                   "prefill), off vllm-v0 (prefill-first)");
  TensorParallelFlag tp;
  tp.add(app);
  auto* dtype_opt = app.add_option("--dtype", dtype,
                                   "auto, or the runner's own type: bfloat16 on cuda, float32 on "
                                   "cpu");
  auto* chunk_tile_opt = add_int(app, "--chunk-tile", chunk_tile, {1, 1 << 20},
                                 "sarathi: chunks are a multiple of this");
  auto* max_num_seqs_opt = add_int(app, "--max-num-seqs", max_num_seqs, {1, 1 << 20},
                                   "sequences running at once (default: the policy's)");
  add_int(app, "--max-model-len", max_model_len, {0, 1 << 24},
          "prompt + output tokens of one request (0: the model's, cut to the KV pool)");
  auto* util_opt = add_real(app, "--gpu-memory-utilization", gpu_mem_util, {0, 1, Open::kLow},
                            "share of GPU memory for the weights, the largest step's buffers and "
                            "the KV pool (--device cuda)");
  auto* kv_opt = add_real(app, "--kv-memory-mb", kv_memory_mb, {1, 1 << 24},
                          "KV pool size on the CPU (--device cpu)");
  KvCacheDtypeFlag kv_dtype_flag;
  kv_dtype_flag.add(app);
  app.add_option("--served-model-name", so.served_model_names,
                 "the model names clients may send; the first is the default and the one "
                 "/v1/models lists first (default: the model as given)");
  app.add_option("--device", device, "cpu or cuda");
  std::string chat_template;
  auto* chat_template_opt =
      app.add_option("--chat-template", chat_template,
                     "a Jinja chat template: a file, or the template itself (vLLM's rule: text "
                     "with '{', '}' or a newline that is no file), for a model whose "
                     "tokenizer_config.json has none or one outside the supported subset");
  // One value an occurrence, taken as written: CLI11 would otherwise read '["a", "b"]', vLLM's
  // JSON form, as its own bracketed list syntax.
  app.add_option("--allowed-origins", origins_given,
                 "CORS: origins browsers may call from (a JSON list, vLLM's form, or one origin "
                 "a value; \"*\": any); default none, no CORS headers")
      ->expected(1)
      ->allow_extra_args(false);
  // vLLM flags whose effect is already flashserve's behaviour: accepted as such.
  bool satisfied = false;
  app.add_flag(
      "--disable-log-requests,--disable-log-stats,--trust-remote-code,"
      "--enable-prompt-tokens-details",
      satisfied,
      "vLLM's; already so here (requests and stats are not logged, no model code runs, "
      "usage always has prompt_tokens_details)");
  add_int(app, "--max-concurrent-requests", so.max_concurrent_requests, {1, 1 << 20},
          "generation requests in flight (n choices count n); one more gets 503 at once, with "
          "Retry-After");
  add_int(app, "--max-connections", so.http.max_connections, {1, 1 << 24},
          "open HTTP connections; one more gets 503 and is closed (cut to ulimit -n)");
  // Deadlines, in seconds (docs/server.md, "Transport").
  double header_timeout = so.http.header_timeout.count() / 1e3;
  double body_timeout = so.http.body_timeout.count() / 1e3;
  double idle_timeout = so.http.idle_timeout.count() / 1e3;
  double write_timeout = so.http.write_timeout.count() / 1e3;
  add_real(app, "--http-header-timeout", header_timeout, {0, 86400, Open::kLow},
           "seconds for a request's headers, from its first byte (or the connection's accept)");
  add_real(app, "--http-body-timeout", body_timeout, {0, 86400, Open::kLow},
           "seconds for a request's body, from the end of its headers");
  add_real(app, "--http-keep-alive-timeout", idle_timeout, {0, 86400, Open::kLow},
           "seconds an idle keep-alive connection waits for its next request");
  add_real(app, "--http-write-timeout", write_timeout, {0, 86400, Open::kLow},
           "seconds a response write may wait for a client that does not read");
  bool prefix_caching = true;
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", prefix_caching,
               "reuse the KV of full blocks of prompt tokens seen before (shared system prompts, "
               "multi-turn chats, n choices)");
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  if (model_pos_opt->count() > 0 && model_flag_opt->count() > 0)
    throw UsageError("--model", "the model is given twice (MODEL and --model): give one");
  if (model_flag_opt->count() > 0) model_dir = model_flag;
  if (model_dir.empty())
    throw UsageError("--model", "no model: give `flashserve serve MODEL` (or --model MODEL)");
  if (budget_opt->count() > 0 && batched_opt->count() > 0)
    throw UsageError("--max-num-batched-tokens", "is --budget's vLLM name: give one of them");
  if (chunked_opt->count() > 0) {
    const char* chosen = chunked_prefill ? "sarathi" : "vllm-v0";
    if (policy_opt->count() > 0 && check_option("--policy", [&] {
                                     return fs::parse_policy(policy);
                                   }) != fs::parse_policy(chosen))
      throw UsageError(chunked_prefill ? "--enable-chunked-prefill" : "--no-enable-chunked-prefill",
                       std::string("chooses --policy ") + chosen + ", not " + policy);
    policy = chosen;
  }
  if (device != "cpu" && device != "cuda")
    throw UsageError("--device", "'" + device + "' is not one of cpu, cuda");
  tp.check_device(device);
  refuse_unless(util_opt, device == "cuda", "sizes the GPU's KV pool (--device cuda)");
  refuse_unless(kv_opt, device == "cpu", "sizes the CPU's KV pool (--device cpu)");
  const fs::Policy pol = check_option("--policy", [&] { return fs::parse_policy(policy); });
  refuse_unless(chunk_tile_opt, pol == fs::Policy::kSarathi, "only sarathi chunks prompts");
  for (const CLI::Option* b : {budget_opt, batched_opt})
    refuse_unless(b, pol != fs::Policy::kOrca && pol != fs::Policy::kStatic,
                  std::string(fs::to_string(pol)) + " takes whole prompts and has no token budget");
  // Not given: the policy's own (serve/policy.h).
  if (budget_opt->count() + batched_opt->count() == 0)
    budget = fs::policy_defaults(pol).max_tokens_per_step;
  if (max_num_seqs_opt->count() == 0) max_num_seqs = fs::policy_defaults(pol).max_running;
  if (dtype_opt->count() > 0) check_dtype(dtype, device);
  const model::KvCacheDtype kv_dtype = kv_dtype_flag.resolve(device);
  so.api_keys = api_keys(api_keys_given, std::getenv("VLLM_API_KEY"));
  so.allowed_origins = allowed_origins(origins_given);
  // Read now, so that a template that cannot be read stops the server before it binds.
  const std::string chat_template_text =
      chat_template_opt->count() > 0 ? chat_template_source(chat_template) : std::string();
  so.port = static_cast<int>(port);
  const auto ms = [](double seconds) {
    return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(seconds * 1e3)));
  };
  so.http.header_timeout = ms(header_timeout);
  so.http.body_timeout = ms(body_timeout);
  so.http.idle_timeout = ms(idle_timeout);
  so.http.write_timeout = ms(write_timeout);
  if (so.served_model_names.empty()) so.served_model_names.push_back(model_dir);
  // What can be refused before the port is taken and the weights are read: the user hears at
  // once, with the flag named (the loader's errors come after "listening on").
  const model::ModelConfig config =
      check_option("--model", [&] { return model::Checkpoint::open(model_dir).config(); });
  tp.check_model(config);
  if (max_model_len > config.max_position_embeddings)
    throw UsageError("--max-model-len", std::to_string(max_model_len) + " exceeds the model's " +
                                            std::to_string(config.max_position_embeddings) +
                                            " positions (config.json max_position_embeddings)");

  auto load = [=] {
    fe::ModelEngineOptions mo;
    mo.model_dir = model_dir;
    mo.device = device;
    mo.gpu_memory_utilization = gpu_mem_util;
    mo.cpu_kv_bytes = kv_memory_mb * (1 << 20);
    mo.kv_cache_dtype = kv_dtype;
    mo.tensor_parallel_size = static_cast<int>(tp.size);
    fs::SchedulerConfig sc;
    sc.policy = pol;
    sc.max_tokens_per_step = budget;
    sc.max_running = max_num_seqs;
    sc.max_model_len = max_model_len;
    sc.chunk_tile = chunk_tile;
    // The pool is sized after the largest step's buffers (model_engine.h).
    mo.largest_step_tokens = fe::largest_step_tokens(sc, config.max_position_embeddings);
    mo.largest_step_rows = std::min(mo.largest_step_tokens, sc.max_running);
    const fe::LoadedModel m = fe::load_model(mo);
    auto engine = fe::make_model_engine(m, sc, fe::EngineConfig{}.watermark, prefix_caching);
    server::Backend b;
    b.max_model_len = engine->config().scheduler.max_model_len;
    b.prefix_caching = prefix_caching;
    b.codec = server::load_text_codec(model_dir, chat_template_text, engine->config().vocab_size);
    b.loop = std::make_unique<fe::EngineLoop>(std::move(engine));
    std::printf(
        "flashserve serve: ready: %s on %s%s, %lld KV blocks of %d tokens (%s), max model len "
        "%lld, %s\n",
        model_dir.c_str(), m.device.c_str(),
        m.tensor_parallel_size > 1
            ? (" (" + std::to_string(m.tensor_parallel_size) + " tensor-parallel ranks" +
               (m.device == "cpu" ? ", emulated)" : ", a GPU each)"))
                  .c_str()
            : "",
        static_cast<long long>(m.num_blocks), m.block_size,
        model::kv_cache_dtype_name(m.kv_cache_dtype), static_cast<long long>(b.max_model_len),
        b.codec ? "tokenizer loaded" : "no tokenizer.json: token-id prompts only");
    std::fflush(stdout);
    return b;
  };

  // A client that goes away must not kill the server: writes to it fail instead of raising
  // SIGPIPE. SIGINT / SIGTERM stop the server cleanly: their handler writes the signal to a pipe
  // that one thread waits on. (Blocking them and sigwait-ing is not enough: threads that
  // libraries start before main, OpenBLAS's, do not block them, and the kernel delivers a process
  // signal to any thread that does not, whose default action ends the process at once.)
  ::signal(SIGPIPE, SIG_IGN);
  if (::pipe(stop_pipe) != 0) throw Error(ErrorKind::kInternal, "serve", "pipe() failed");
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  server::Server srv(so, load);
  const int bound = srv.bind();
  std::printf("flashserve serve: listening on http://%s:%d (model '%s', loading...)\n",
              so.host.c_str(), bound, so.served_model_names.front().c_str());
  std::fflush(stdout);
  std::thread waiter([&] {
    char sig = 0;
    while (::read(stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig != 0) srv.stop();  // 0: run() returned on its own (loading failed)
  });
  auto end_waiter = [&] {
    const char none = 0;
    (void)!::write(stop_pipe[1], &none, 1);
    waiter.join();
  };
  try {
    srv.run();
  } catch (const Error& e) {
    end_waiter();
    // A KV pool that does not fit (no block in the budget, or less than one sequence of
    // --max-model-len): the engine names its own arguments; say which flags size the pool.
    const std::string& a = e.argument();
    if (a == "num_blocks" || a == "kv_memory" || a == "gpu_memory_utilization")
      throw Error(e.kind(), device == "cuda" ? "--gpu-memory-utilization" : "--kv-memory-mb",
                  std::string("the KV pool does not fit: ") + e.what() + " (give " +
                      (device == "cuda" ? "--gpu-memory-utilization" : "--kv-memory-mb") +
                      " more, or a smaller --max-model-len)");
    throw;
  } catch (...) {
    end_waiter();
    throw;
  }
  end_waiter();
  std::printf("flashserve serve: stopped\n");
  return 0;
}

Register reg("serve", "the OpenAI-compatible HTTP server (completions, chat, SSE, metrics)", serve);

}  // namespace
}  // namespace flashserve::cli
