// flashserve run: the main job (scripts/run.sh). The engine on a tiny random checkpoint made on
// the fly (on the GPU when there is one, else the CPU) over a short built-in workload in which
// long prompts arrive while short requests are decoding, once with sarathi (stall-free chunked
// prefill), once with vllm-v1 (today's vLLM, at its default budget of 8192) and once with vllm-v0
// (prefill-first), measured on the wall clock and printed side by side: under vllm-v0 every
// running decode waits for each long prompt's whole prefill (the max and P99 TBT jump); under
// vllm-v1 the decodes run in the same step, but a prompt that fits its large budget still makes
// that step a whole prefill long; under sarathi the prompt is cut into budget-sized chunks that
// run beside the decodes.
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/kv_cache_flag.h"
#include "cli/options.h"
#include "cli/serving_report.h"
#include "engine/model_engine.h"
#include "engine/replay.h"
#include "flashserve/error.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"

namespace flashserve::cli {
namespace {

namespace fe = flashserve::engine;
namespace fs = flashserve::serve;

// Short chat-like requests arriving over the first half second, and long prompts arriving while
// they decode.
std::vector<fs::Request> builtin_workload(int64_t long_prompt) {
  std::vector<fs::Request> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back({0, 0.02 * i, 48 + 16 * i, 160});
  for (int i = 0; i < 3; ++i) reqs.push_back({0, 0.3 + 0.5 * i, long_prompt, 16});
  std::stable_sort(reqs.begin(), reqs.end(), [](const fs::Request& a, const fs::Request& b) {
    return a.arrival_s < b.arrival_s;
  });
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].id = static_cast<int64_t>(i);
  return reqs;
}

// A directory for the checkpoint that removes itself.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "flashserve-run-XXXXXX").string();
    if (!::mkdtemp(tmpl.data()))
      throw Error(ErrorKind::kInternal, "run", "cannot make a temporary directory");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

int run_main_job(int argc, char** argv) {
  std::string device = "auto";
  // On two CPU cores a 1024-token prefill of the tiny model takes ~0.6 s and a decode step a few
  // ms: the stall is large and the whole job stays within seconds.
  int64_t budget = 128, long_prompt = 1024;
  CLI::App app{"The main job: sarathi against vllm-v1 and vllm-v0 on a tiny model, measured"};
  app.option_defaults()->always_capture_default();
  app.add_option("--device", device, "auto (the GPU if there is one), cpu or cuda");
  add_int(app, "--budget", budget, {16, 4096}, "sarathi's token budget per step");
  add_int(app, "--long-prompt", long_prompt, {64, 4000}, "tokens of each long prompt");
  KvCacheDtypeFlag kv_dtype_flag;
  kv_dtype_flag.add(app);
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  if (device != "auto" && device != "cpu" && device != "cuda")
    throw UsageError("--device", "'" + device + "' is not one of auto, cpu, cuda");
  // auto: a refusal on cuda (fp8 while FLASHSERVE_CUDA_FP8_KV is off) falls back to the CPU below,
  // which has the fp8 cache.
  const model::KvCacheDtype kv_dtype = kv_dtype_flag.resolve(device == "auto" ? "" : device);

  TempDir dir;
  model::RandomCheckpointOptions ck;
  ck.seed = 1;
  model::write_random_checkpoint(model::preset_config("tiny"), dir.path, ck);
  fe::ModelEngineOptions mo;
  mo.model_dir = dir.path;
  mo.num_blocks = 4096;  // 64k tokens of KV: plenty for this workload, on any device
  mo.kv_cache_dtype = kv_dtype;
  fe::LoadedModel model;
  std::string fallback;
  if (device == "auto") {
    try {
      mo.device = "cuda";
      model = fe::load_model(mo);
    } catch (const Error& e) {
      fallback = std::string(" (no GPU runner: ") + e.what() + ")";
      mo.device = "cpu";
      model = fe::load_model(mo);
    }
  } else {
    mo.device = device;
    model = fe::load_model(mo);
  }
  const auto requests = builtin_workload(long_prompt);
  std::printf(
      "flashserve run: the engine on a tiny random model (4 layers, hidden 256) on %s, KV cache "
      "%s%s\n",
      model.device.c_str(), model::kv_cache_dtype_name(model.kv_cache_dtype), fallback.c_str());
  std::printf(
      "workload: 8 short requests (prompts 48-160 tokens, 160 output tokens each) from t = 0, "
      "and 3 prompts of %lld tokens at t = 0.3, 0.8, 1.3 s while they decode\n\n",
      static_cast<long long>(long_prompt));

  struct Row {
    std::string name;
    fe::ReplayResult r;
  };
  std::vector<Row> rows;
  for (const fs::Policy p : {fs::Policy::kSarathi, fs::Policy::kVllmV1, fs::Policy::kVllmV0}) {
    fs::SchedulerConfig sc;
    sc.policy = p;
    // vllm-v1 at vLLM's own default budget: the comparison a vLLM user makes.
    sc.max_tokens_per_step =
        p == fs::Policy::kVllmV1 ? fs::policy_defaults(p).max_tokens_per_step : budget;
    sc.max_running = 64;
    sc.max_model_len = 0;  // the model's positions (SchedulerConfig's 8192 is past the tiny's)
    auto engine = fe::make_model_engine(model, sc);
    std::printf("running %s...\n", fs::to_string(p));
    std::fflush(stdout);
    fe::ReplayOptions ro;
    ro.vocab_size = model.runner->config().vocab_size;
    const std::string name =
        p == fs::Policy::kVllmV0
            ? "vllm-v0 (prefill-first)"
            : std::string(fs::to_string(p)) + " (budget " +
                  std::to_string(engine->config().scheduler.max_tokens_per_step) + ")";
    rows.push_back({name, fe::replay(*engine, requests, ro)});
  }
  std::printf(
      "\n| measured on %s | TBT p50 (ms) | TBT p99 (ms) | TBT max (ms) | TTFT p50 (ms) | TTFT max "
      "(ms) | steps | wall (s) |\n",
      model.device.c_str());
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Row& row : rows) {
    const fs::ServingMetrics& m = row.r.metrics;
    std::printf("| %s | %s | %s | %s | %s | %s | %lld | %.1f |\n", row.name.c_str(),
                fmt_ms(m.tbt.p50).c_str(), fmt_ms(m.tbt.p99).c_str(), fmt_ms(m.tbt.max).c_str(),
                fmt_ms(m.ttft.p50).c_str(), fmt_ms(m.ttft.max).c_str(),
                static_cast<long long>(row.r.steps), row.r.end_time - row.r.start_time);
  }
  std::printf(
      "\nUnder vllm-v0 each long prompt runs alone in one step and every decoding request waits\n"
      "for it: the TBT max is a whole %lld-token prefill. vllm-v1 runs the decodes in that step\n"
      "too, but its budget of %lld takes the whole prompt at once, so that step (a decode's gap)\n"
      "is still a whole prefill long. Under sarathi the prompt is cut into chunks of at most %lld\n"
      "tokens that run in the same step as the decodes, so no gap is longer than one such step\n"
      "(the long prompts' own first token comes a little later: TTFT max).\n",
      static_cast<long long>(long_prompt),
      static_cast<long long>(fs::policy_defaults(fs::Policy::kVllmV1).max_tokens_per_step),
      static_cast<long long>(budget));
  return 0;
}

Register reg("run",
             "the main job: sarathi vs vllm-v1 and vllm-v0 on a tiny model, measured "
             "(scripts/run.sh)",
             run_main_job);

}  // namespace
}  // namespace flashserve::cli
