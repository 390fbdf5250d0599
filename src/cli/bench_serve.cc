// flashserve bench-serve: the engine on a real model, requests arriving at their wall-clock times
// (the serving core's workloads), each policy in turn on the same loaded model and KV pool; prints
// the simulator's table, measured, and draws the TBT distribution and TBT over time per policy.
//   flashserve bench-serve --shape tiny --workload fixed --prompt-len 512 --output-len 64 --rate 4
//       --requests 40 --compare --plot /tmp/tiny
//   flashserve bench-serve --model /data/mistral-7b-random --device cuda --workload sharegpt
//       --rate 2 --requests 256 --compare --predict-gpu h200 --plot bench/results/bench-serve
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/options.h"
#include "cli/serving_report.h"
#include "engine/model_engine.h"
#include "engine/replay.h"
#include "engine/simulator.h"
#include "flashserve/error.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "serve/cost_model.h"

namespace flashserve::cli {
namespace {

namespace fe = flashserve::engine;
namespace fs = flashserve::serve;

struct Options {
  std::string model_dir, shape, device = "cpu";
  WorkloadFlags wl;
  int64_t requests = 100;
  double rate = 1;
  uint64_t seed = 0;
  std::string policy = "sarathi";
  bool compare = false;
  int64_t budget = 512, chunk_tile = 64, max_running = 256, orca_batch = 16, max_model_len = 0;
  int32_t block_size = 16;
  int64_t num_blocks = 0;
  double gpu_mem_util = 0.9, kv_memory_mb = 256;
  std::string plot, predict_gpu;
};

// A directory for a --shape checkpoint that removes itself.
struct ScratchDir {
  std::string path;
  explicit ScratchDir(bool make) {
    if (!make) return;
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "flashserve-bench-XXXXXX").string();
    if (!::mkdtemp(tmpl.data()))
      throw Error(ErrorKind::kInternal, "bench-serve", "cannot make a temporary directory");
    path = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

int bench_serve(int argc, char** argv) {
  Options o;
  CLI::App app{"Serve a workload with the engine on a real model and measure it"};
  constexpr int64_t kMaxTokens = int64_t{1} << 24;
  auto* model_opt =
      app.add_option("--model", o.model_dir, "model directory (config.json + safetensors)");
  auto* shape_opt =
      app.add_option("--shape", o.shape,
                     "a random checkpoint of this preset, made on the fly (tiny, mistral-7b, ...)");
  app.add_option("--device", o.device, "cpu or cuda")->default_str(o.device);
  o.wl.add(app);
  auto* rate_opt = add_real(app, "--rate", o.rate, {0, 1e6, Open::kLow}, "requests per second");
  auto* requests_opt = add_int(app, "--requests", o.requests, {1, 1 << 20}, "requests per policy");
  add_uint(app, "--seed", o.seed, "workload seed");
  auto* policy_opt =
      app.add_option("--policy", o.policy, "sarathi, vllm or orca")->default_str(o.policy);
  app.add_flag("--compare", o.compare, "run sarathi, vllm and orca one after another");
  add_int(app, "--budget", o.budget, {1, kMaxTokens}, "sarathi's token budget per step");
  auto* chunk_tile_opt = add_int(app, "--chunk-tile", o.chunk_tile, {1, kMaxTokens},
                                 "sarathi: non-final chunks are a multiple of this");
  add_int(app, "--max-running", o.max_running, {1, 1 << 20}, "sequences running at once");
  auto* orca_batch_opt =
      add_int(app, "--orca-batch", o.orca_batch, {1, 1 << 20}, "orca's fixed batch");
  add_int(app, "--max-model-len", o.max_model_len, {0, kMaxTokens},
          "prompt + output limit (0: the model's, cut to the pool)");
  add_int(app, "--block-size", o.block_size, {1, 1 << 12}, "KV block size in tokens");
  auto* num_blocks_opt = add_int(app, "--num-blocks", o.num_blocks, {1, int64_t{1} << 31},
                                 "KV blocks (default: from the memory budget)");
  auto* util_opt = add_real(app, "--gpu-memory-utilization", o.gpu_mem_util, {0, 1, Open::kLow},
                            "cuda: fraction of the GPU's memory for weights + KV");
  auto* kv_mem_opt = add_real(app, "--kv-memory-mb", o.kv_memory_mb, {1, 1 << 24, Open::kNone},
                              "cpu: MiB of KV pool");
  app.add_option("--plot", o.plot,
                 "write PREFIX-tbt-cdf.svg and PREFIX-tbt-over-time-<policy>.svg");
  app.add_option("--predict-gpu", o.predict_gpu,
                 "also print the roofline simulator's prediction for this GPU preset (h200, a100) "
                 "on the same requests");
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;

  if ((model_opt->count() > 0) == (shape_opt->count() > 0))
    throw UsageError("--model", "give exactly one of --model DIR and --shape NAME");
  if (o.device != "cpu" && o.device != "cuda")
    throw UsageError("--device", "'" + o.device + "' is not one of cpu, cuda");
  refuse_unless(policy_opt, !o.compare, "--compare runs every policy; drop --policy");
  refuse_unless(chunk_tile_opt, o.compare || o.policy == "sarathi", "only sarathi chunks prompts");
  refuse_unless(orca_batch_opt, o.compare || o.policy == "orca", "only orca has a fixed batch");
  o.wl.refuse_inapplicable(false);
  refuse_unless(util_opt, o.device == "cuda" && num_blocks_opt->count() == 0,
                "sizes the GPU's KV pool (--device cuda, no --num-blocks)");
  refuse_unless(kv_mem_opt, o.device == "cpu" && num_blocks_opt->count() == 0,
                "sizes the CPU's KV pool (--device cpu, no --num-blocks)");
  (void)requests_opt;

  std::vector<fs::Policy> policies;
  if (o.compare)
    policies = {fs::Policy::kSarathi, fs::Policy::kVllm, fs::Policy::kOrca};
  else
    policies = {fs::parse_policy(o.policy)};

  // The model, once: every policy runs on the same weights and KV pool.
  ScratchDir scratch(!o.shape.empty());
  if (!o.shape.empty()) {
    std::printf("writing a random %s checkpoint to %s...\n", o.shape.c_str(), scratch.path.c_str());
    std::fflush(stdout);
    model::write_random_checkpoint(model::preset_config(o.shape), scratch.path);
  }
  fe::ModelEngineOptions mo;
  mo.model_dir = o.shape.empty() ? o.model_dir : scratch.path;
  mo.device = o.device;
  mo.block_size = o.block_size;
  mo.gpu_memory_utilization = o.gpu_mem_util;
  mo.cpu_kv_bytes = o.kv_memory_mb * (1 << 20);
  mo.num_blocks = o.num_blocks;
  const fe::LoadedModel model = fe::load_model(mo);
  const model::ModelConfig& mc = model.runner->config();

  auto scheduler_for = [&](fs::Policy p) {
    fs::SchedulerConfig sc;
    sc.policy = p;
    sc.max_tokens_per_step = o.budget;
    sc.max_running = p == fs::Policy::kOrca ? o.orca_batch : o.max_running;
    sc.max_model_len = o.max_model_len;
    sc.chunk_tile = o.chunk_tile;
    return sc;
  };
  // The engine resolves max_model_len (the model's positions, cut to the pool); the workload's
  // lengths are cut to it.
  const int64_t max_model_len =
      fe::make_model_engine(model, scheduler_for(policies[0]))->config().scheduler.max_model_len;
  fs::WorkloadSpec spec = o.wl.spec();
  spec.num_requests = o.requests;
  spec.max_model_len = max_model_len;
  spec.seed = o.seed;
  const WorkloadSource workload = WorkloadSource::resolve(o.wl.workload, spec);
  const double rate = workload.is_trace() && rate_opt->count() == 0 ? workload.trace_rate : o.rate;
  const std::vector<fs::Request> requests = workload.at(rate > 0 ? rate : 1);
  double ptok = 0, otok = 0;
  for (const auto& r : requests)
    ptok += static_cast<double>(r.prompt_tokens), otok += static_cast<double>(r.output_tokens);
  std::printf(
      "model: %s (%lld layers, hidden %lld, vocab %lld) on %s; KV pool %lld blocks x %d tokens "
      "(%.1f MiB), max model len %lld\n",
      mo.model_dir.c_str(), static_cast<long long>(mc.num_hidden_layers),
      static_cast<long long>(mc.hidden_size), static_cast<long long>(mc.vocab_size),
      model.device.c_str(), static_cast<long long>(model.num_blocks), model.block_size,
      model.kv_bytes / (1 << 20), static_cast<long long>(max_model_len));
  std::printf(
      "workload: %s, %zu requests at %.3f req/s, mean prompt %.0f, mean output %.0f tokens, seed "
      "%llu\n",
      workload.label.c_str(), requests.size(), rate, ptok / static_cast<double>(requests.size()),
      otok / static_cast<double>(requests.size()), static_cast<unsigned long long>(o.seed));

  std::vector<fe::ReplayResult> results;
  for (const fs::Policy p : policies) {
    auto engine = fe::make_model_engine(model, scheduler_for(p));
    fe::ReplayOptions ro;
    ro.vocab_size = mc.vocab_size;
    ro.seed = o.seed;
    const char* name = fs::to_string(p);
    ro.progress = [&, name, last = -1.0](int64_t done, int64_t total, double now) mutable {
      if (done < total && now - last < 0.5) return;
      last = now;
      std::fprintf(stderr,
                   "\r%s: %lld/%lld requests finished, %.1f s, %lld running, %lld waiting   ", name,
                   static_cast<long long>(done), static_cast<long long>(total), now,
                   static_cast<long long>(engine->scheduler().num_running()),
                   static_cast<long long>(engine->scheduler().num_waiting()));
      if (done == total) std::fprintf(stderr, "\n");
    };
    results.push_back(fe::replay(*engine, requests, ro));
  }

  std::printf("\nmeasured (%s, wall clock):\n", model.device.c_str());
  print_metrics_header(false);
  for (size_t i = 0; i < policies.size(); ++i)
    print_metrics_row(fs::to_string(policies[i]), results[i].metrics, results[i].steps);
  if (!o.predict_gpu.empty()) {
    // The roofline simulator on the same requests, for holding the model against the measurement.
    const fs::RooflineCostModel cost(mc.shape("model"), fs::gpu_preset(o.predict_gpu));
    std::printf("\npredicted by the roofline simulator (%s):\n", cost.describe().c_str());
    print_metrics_header(false);
    for (const fs::Policy p : policies) {
      fe::SimConfig sim;
      sim.scheduler = fe::make_model_engine(model, scheduler_for(p))->config().scheduler;
      sim.num_blocks = model.num_blocks;
      sim.block_size = model.block_size;
      const fe::SimResult r = fe::simulate(requests, sim, cost);
      print_metrics_row(fs::to_string(p), r.metrics, r.steps);
    }
  }
  if (!o.plot.empty()) {
    fs::SvgPlot cdf;
    cdf.title = workload.label + " on " + model.device + ": TBT CDF (measured)";
    cdf.x_label = "time between tokens (ms, log scale)";
    cdf.y_label = "fraction of gaps";
    cdf.log_x = true;
    for (size_t i = 0; i < policies.size(); ++i) {
      if (results[i].metrics.tbt_samples.empty()) continue;
      cdf.series.push_back(tbt_cdf_series(fs::to_string(policies[i]), results[i].metrics));
      fs::SvgPlot over;
      over.title = std::string(fs::to_string(policies[i])) +
                   ": every gap between tokens over time (measured)";
      over.x_label = "time since the first arrival (s)";
      over.y_label = "TBT (ms)";
      over.series.push_back(tbt_over_time_series(fs::to_string(policies[i]), results[i].finished,
                                                 results[i].start_time));
      const std::string path = o.plot + "-tbt-over-time-" + fs::to_string(policies[i]) + ".svg";
      over.write(path);
      std::printf("plot: %s\n", path.c_str());
    }
    if (!cdf.series.empty()) {
      cdf.write(o.plot + "-tbt-cdf.svg");
      std::printf("plot: %s\n", (o.plot + "-tbt-cdf.svg").c_str());
    }
  }
  return 0;
}

Register reg("bench-serve", "serve a workload with the engine on a real model and measure it",
             bench_serve);

}  // namespace
}  // namespace flashserve::cli
