// flashserve bench-serve: the engine on a real model, requests arriving at their wall-clock times
// (the serving core's workloads), each policy in turn on the same loaded model and KV pool; prints
// the simulator's table, measured, and draws the TBT distribution and TBT over time per policy.
//   flashserve bench-serve --shape tiny --workload fixed --prompt-len 512 --output-len 64 --rate 4
//       --requests 40 --compare --plot /tmp/tiny
//   flashserve bench-serve --model /data/mistral-7b-random --device cuda --workload sharegpt
//       --rate 2 --requests 256 --compare --predict-gpu h200 --plot bench/results/bench-serve
// With --profile (flashserve profile's table) the calibrated simulator's prediction is printed
// beside the measurement; --capacity bisects with it and confirms with runs below and above.
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cli/capacity_flags.h"
#include "cli/command.h"
#include "cli/kv_cache_flag.h"
#include "cli/options.h"
#include "cli/scheduler_flags.h"
#include "cli/scratch_dir.h"
#include "cli/serving_report.h"
#include "cli/tensor_parallel_flag.h"
#include "engine/model_engine.h"
#include "engine/replay.h"
#include "engine/simulator.h"
#include "flashserve/error.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model/step_graphs.h"
#include "serve/auto_budget.h"
#include "serve/capacity.h"
#include "serve/cost_model.h"
#include "serve/tbt_slo.h"

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
  SchedulerFlags sched;
  int32_t block_size = 16;
  int64_t num_blocks = 0;
  double gpu_mem_util = 0.9, kv_memory_mb = 256;
  std::string plot, predict_gpu, profile, step_log;
  CapacityFlags cap;
  double confirm_margin = 0.1;
  KvCacheDtypeFlag kv_dtype;
  TensorParallelFlag tp;
};

void print_capacity_header() {
  std::printf(
      "| policy | P99 TBT SLO (ms) | P50 sched delay bound (s) | predicted capacity (req/s) | "
      "rate (req/s) | P99 TBT measured (ms) | P99 TBT predicted (ms) | P50 sched delay measured "
      "(s) | predicted (s) | SLO met (measured) | SLO met (predicted) |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n");
}

int bench_serve(int argc, char** argv) {
  Options o;
  CLI::App app{"Serve a workload with the engine on a real model and measure it"};
  auto* model_opt =
      app.add_option("--model", o.model_dir, "model directory (config.json + safetensors)");
  auto* shape_opt =
      app.add_option("--shape", o.shape,
                     "a random checkpoint of this preset, made on the fly (tiny, mistral-7b, ...)");
  app.add_option("--device", o.device, "cpu or cuda")->default_str(o.device);
  o.wl.add(app);
  auto* rate_opt = add_real(app, "--rate", o.rate, {0, 1e6, Open::kLow}, "requests per second");
  auto* requests_opt = add_int(app, "--requests", o.requests, {1, 1 << 20}, "requests per policy");
  auto* seed_opt = add_uint(app, "--seed", o.seed, "workload seed");
  add_scheduler_options(app, o.sched, "sarathi, vllm-v1, vllm-v0 or orca",
                        "the model's, cut to the pool");
  add_int(app, "--block-size", o.block_size, {1, 1 << 12}, "KV block size in tokens");
  auto* num_blocks_opt = add_int(app, "--num-blocks", o.num_blocks, {1, int64_t{1} << 31},
                                 "KV blocks (default: from the memory budget)");
  auto* util_opt = add_real(app, "--gpu-memory-utilization", o.gpu_mem_util, {0, 1, Open::kLow},
                            "cuda: fraction of the GPU's memory for the weights, the largest "
                            "step's buffers and the KV pool");
  auto* kv_mem_opt = add_real(app, "--kv-memory-mb", o.kv_memory_mb, {1, 1 << 24, Open::kNone},
                              "cpu: MiB of KV pool");
  o.kv_dtype.add(app);
  o.tp.add(app);
  auto* plot_opt = app.add_option("--plot", o.plot,
                                  "write PREFIX-tbt-cdf.svg and PREFIX-tbt-over-time-<policy>.svg");
  auto* step_log_opt = app.add_option(
      "--step-log", o.step_log,
      "write every measured step to this CSV (policy, seed, step, end_s, seconds, tokens, decodes, "
      "budget, graph_captures: the runner's CUDA graph captures so far, predicted_s: the "
      "--profile cost model's time for the step's batch, empty without --profile, then the "
      "batch: decode_kv_mean, decode_kv_max (the decodes' keys, 0 without decodes), chunks, "
      "chunk_cached_max (prompt chunks and the most cached tokens one of them follows))");
  auto* predict_gpu_opt = app.add_option(
      "--predict-gpu", o.predict_gpu,
      "also print the roofline simulator's prediction for this GPU preset (h200, a100) "
      "on the same requests");
  auto* profile_opt = app.add_option(
      "--profile", o.profile,
      "the calibrated simulator: a table from `flashserve profile` on this model and device; its "
      "prediction is printed beside the measurement");
  o.cap.add(app,
            "predict each policy's capacity under each SLO with the simulator (--profile, else "
            "--predict-gpu), then measure just below and just above it");
  auto* margin_opt = add_real(app, "--confirm-margin", o.confirm_margin, {0, 1, Open::kBoth},
                              "capacity: measure at predicted x (1 -/+ this)");
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;

  if ((model_opt->count() > 0) == (shape_opt->count() > 0))
    throw UsageError("--model", "give exactly one of --model DIR and --shape NAME");
  if (o.device != "cpu" && o.device != "cuda")
    throw UsageError("--device", "'" + o.device + "' is not one of cpu, cuda");
  o.sched.refuse_inapplicable();
  o.wl.refuse_inapplicable(false);
  o.tp.check_device(o.device);
  const model::KvCacheDtype kv_dtype = o.kv_dtype.resolve(o.device);
  refuse_unless(util_opt, o.device == "cuda" && num_blocks_opt->count() == 0,
                "sizes the GPU's KV pool (--device cuda, no --num-blocks)");
  refuse_unless(kv_mem_opt, o.device == "cpu" && num_blocks_opt->count() == 0,
                "sizes the CPU's KV pool (--device cpu, no --num-blocks)");
  refuse_unless(margin_opt, o.cap.capacity, "applies to --capacity");
  o.cap.check(o.cap.capacity || o.sched.budget_auto, o.cap.capacity,
              "applies to --capacity (and --slo-tbt to --budget auto)");
  if (o.sched.budget_auto && o.profile.empty())
    throw UsageError("--budget",
                     "auto chooses the budget from a measured step profile: give --profile");
  if (o.sched.budget_auto && !o.cap.capacity && o.cap.slo_specs.size() > 1)
    throw UsageError("--slo-tbt",
                     "--budget auto chooses a budget for one SLO; give one, or --capacity to "
                     "measure each");
  refuse_unless(o.wl.seeds_opt, !o.cap.capacity && o.plot.empty(),
                "runs the workload at --rate once per seed (not with --capacity or --plot)");
  refuse_unless(seed_opt, o.wl.seeds_opt->count() == 0, "give --seed or --seeds, not both");
  if (o.cap.capacity && o.profile.empty() && o.predict_gpu.empty())
    throw UsageError("--capacity",
                     "needs a simulator to bisect with: --profile FILE or --predict-gpu");
  refuse_unless(plot_opt, !o.cap.capacity, "plots a run at --rate; --capacity draws none");
  refuse_unless(step_log_opt, !o.cap.capacity, "logs the runs at --rate, not --capacity's probes");
  // The log is written after minutes of serving: a path that cannot be written fails now.
  std::ofstream step_log;
  if (!o.step_log.empty()) {
    step_log.open(o.step_log);
    if (!step_log) throw UsageError("--step-log", "cannot write '" + o.step_log + "'");
    step_log << "policy,seed,step,end_s,seconds,tokens,decodes,budget,graph_captures,predicted_s,"
                "decode_kv_mean,decode_kv_max,chunks,chunk_cached_max\n";
  }
  refuse_unless(predict_gpu_opt, !o.cap.capacity || o.profile.empty(),
                "--capacity bisects with one simulator, here --profile; give one of them");
  // An arrival trace (--workload FILE.csv with arrival times) gives the requests and their times:
  // the options that make requests do not apply (as simulate --trace refuses them), and a trace
  // whose arrivals span no time has no rate to scale. Known before the model loads.
  {
    const WorkloadSource w = check_option(
        "--workload", [&] { return WorkloadSource::resolve(o.wl.workload, o.wl.spec()); });
    const std::string why =
        "--workload " + o.wl.workload + " is an arrival trace: it gives the requests";
    for (CLI::Option* opt : {static_cast<CLI::Option*>(requests_opt), seed_opt, o.wl.seeds_opt})
      refuse_unless(opt, !w.is_trace(), why);
    refuse_unless(rate_opt, !w.as_recorded(),
                  "the trace's arrivals span no time (all at once): there is no rate to scale");
    // Before the model loads: a capacity probe of too few requests is refused at once.
    if (o.cap.capacity)
      o.cap.check_requests(w.is_trace() ? static_cast<int64_t>(w.trace.size()) : o.requests);
  }
  // Names checked before the model loads (minutes for a large one), naming the flag.
  if (!o.predict_gpu.empty())
    check_option("--predict-gpu", [&] { return fs::gpu_preset(o.predict_gpu); });
  const model::ModelConfig config =
      o.shape.empty()
          ? check_option("--model", [&] { return model::Checkpoint::open(o.model_dir).config(); })
          : check_option("--shape", [&] { return model::preset_config(o.shape); });
  o.tp.check_model(config);
  // Load the table before anything runs, so a bad file fails at once.
  std::unique_ptr<fs::CostModel> calibrated;
  if (!o.profile.empty()) {
    auto table = std::make_unique<fs::ProfileCostModel>(fs::ProfileCostModel::load(o.profile));
    check_profile_kv_cache(table->profile(), kv_dtype);
    check_profile_tensor_parallel(table->profile(), o.tp.size);
    // The CUDA runner of this process pads its mixed steps to their graphs' rows.
    if (o.device == "cuda") table->set_step_graphs(model::step_graph_options_from_env());
    calibrated = std::move(table);
  }
  (void)profile_opt;

  const std::vector<fs::Policy> policies = o.sched.selected(
      {fs::Policy::kSarathi, fs::Policy::kVllmV1, fs::Policy::kVllmV0, fs::Policy::kOrca});

  // The model, once: every policy runs on the same weights and KV pool.
  // A --shape on the GPU gets weights generated on the device; on the CPU, a checkpoint written
  // to a scratch directory.
  const bool on_device = !o.shape.empty() && o.device == "cuda";
  ScratchDir scratch(!o.shape.empty() && !on_device);
  if (!scratch.path.empty()) {
    std::printf("writing a random %s checkpoint to %s...\n", o.shape.c_str(), scratch.path.c_str());
    std::fflush(stdout);
    model::write_random_checkpoint(model::preset_config(o.shape), scratch.path);
  }
  fe::ModelEngineOptions mo;
  mo.model_dir = o.shape.empty() ? o.model_dir : scratch.path;
  if (on_device) mo.random_shape = o.shape;
  const std::string model_name =
      on_device ? "random " + o.shape + " (weights made on the device)" : mo.model_dir;
  mo.device = o.device;
  mo.block_size = o.block_size;
  mo.gpu_memory_utilization = o.gpu_mem_util;
  mo.cpu_kv_bytes = o.kv_memory_mb * (1 << 20);
  mo.num_blocks = o.num_blocks;
  mo.kv_cache_dtype = kv_dtype;
  mo.tensor_parallel_size = static_cast<int>(o.tp.size);
  // On the GPU the pool is sized after the buffers of the largest step any compared policy runs
  // (--budget auto: the largest budget it may move to).
  if (o.device == "cuda") {
    const int64_t positions =
        (on_device ? model::preset_config(o.shape) : model::ModelConfig::load(mo.model_dir))
            .max_position_embeddings;
    for (const fs::Policy p : policies) {
      const fs::SchedulerConfig sc = o.sched.config_for(p);
      const int64_t tokens = o.sched.auto_budget(p) ? fs::AutoBudgetConfig{}.max_budget
                                                    : fe::largest_step_tokens(sc, positions);
      mo.largest_step_tokens = std::max(mo.largest_step_tokens, tokens);
      mo.largest_step_rows = std::max(mo.largest_step_rows, std::min(tokens, sc.max_running));
    }
  }
  const fe::LoadedModel model = fe::load_model(mo);
  const model::ModelConfig& mc = model.runner->config();
  if (o.sched.max_model_len > mc.max_position_embeddings)
    throw UsageError("--max-model-len", std::to_string(o.sched.max_model_len) +
                                            " exceeds the model's " +
                                            std::to_string(mc.max_position_embeddings) +
                                            " positions (config.json max_position_embeddings)");

  // make_model_engine gives vllm-v0 a token cap of at least max_model_len.
  auto scheduler_for = [&](fs::Policy p) { return o.sched.config_for(p); };
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
      "model: %s (%lld layers, hidden %lld, vocab %lld) on %s%s; KV pool %lld blocks x %d tokens "
      "(%.1f MiB, %s), max model len %lld\n",
      model_name.c_str(), static_cast<long long>(mc.num_hidden_layers),
      static_cast<long long>(mc.hidden_size), static_cast<long long>(mc.vocab_size),
      model.device.c_str(),
      o.tp.size > 1 ? (" x " + std::to_string(o.tp.size) + " tensor-parallel ranks").c_str() : "",
      static_cast<long long>(model.num_blocks), model.block_size, model.kv_bytes / (1 << 20),
      flashserve::model::kv_cache_dtype_name(model.kv_cache_dtype),
      static_cast<long long>(max_model_len));
  std::printf(
      "workload: %s, %zu requests at %.3f req/s, mean prompt %.0f, mean output %.0f tokens, seed "
      "%llu\n",
      workload.label.c_str(), requests.size(), rate, ptok / static_cast<double>(requests.size()),
      otok / static_cast<double>(requests.size()), static_cast<unsigned long long>(o.seed));

  // The SLOs (named ones scaled from the calibrated, else the roofline, simulator's decode step);
  // the first is --budget auto's outside --capacity.
  std::unique_ptr<fs::RooflineCostModel> roofline;
  if (!o.predict_gpu.empty()) {
    // The GPU's cache: bf16 unless fp8 is asked for (its K/V bytes read per token halve).
    flashserve::model::ModelShape shape = mc.shape("model");
    shape.kv_bytes_per_elem = flashserve::model::kv_cache_element_bytes(kv_dtype, 2);
    roofline = std::make_unique<fs::RooflineCostModel>(shape, fs::gpu_preset(o.predict_gpu));
  }
  const fs::CostModel* slo_cost = calibrated ? calibrated.get() : roofline.get();
  const bool named_slo =
      std::any_of(o.cap.slo_specs.begin(), o.cap.slo_specs.end(),
                  [](const fs::TbtSloSpec& s) { return s.kind != fs::TbtSloSpec::Kind::kSeconds; });
  if (named_slo && !slo_cost)
    throw UsageError("--slo-tbt", "strict and relaxed scale a decode step: give --profile");
  const std::vector<fs::TbtSlo> slos =
      slo_cost ? o.cap.slos(*slo_cost, max_model_len, model.num_blocks * model.block_size)
               : std::vector<fs::TbtSlo>{{"", 0}};
  // --budget auto under `slo` for the engine's sarathi, from the calibrated profile.
  auto auto_budget = [&](const fs::SchedulerConfig& sc, const fs::TbtSlo& slo) {
    return std::make_unique<fs::AutoBudget>(
        *calibrated,
        fs::AutoBudgetConfig::for_scheduler(sc, model.num_blocks, model.block_size, slo.seconds));
  };
  auto measure = [&](fs::Policy p, const std::vector<fs::Request>& reqs, uint64_t seed,
                     const fs::TbtSlo& slo) {
    auto engine = fe::make_model_engine(model, scheduler_for(p));
    if (o.sched.auto_budget(p)) {
      auto budget = auto_budget(engine->config().scheduler, slo);
      // Buffers and GEMM algorithms for the largest budget it may move to, before the first step.
      const int64_t top = budget->config().max_budget;
      model.runner->prepare(top, std::min(top, engine->config().scheduler.max_running));
      engine->set_auto_budget(std::move(budget));
    }
    fe::ReplayOptions ro;
    ro.vocab_size = mc.vocab_size;
    ro.seed = seed;
    const char* name = fs::to_string(p);
    // The calibrated model's time for each batch as it ran (the simulator's error step by step,
    // on the measured run's own batches) and what the batch held, where the model may be off:
    // taken before the step runs, written after it.
    struct Seen {
      double predicted = 0, decode_kv_mean = 0;
      int64_t decode_kv_max = 0, chunks = 0, chunk_cached_max = 0;
    };
    auto seen = std::make_shared<Seen>();
    if (step_log.is_open())
      engine->set_observer([&, seen](const fs::Scheduler&, const fs::Batch& batch) {
        Seen b;
        if (calibrated) b.predicted = calibrated->step_seconds(batch);
        int64_t decodes = 0, decode_kv = 0;
        for (const fs::BatchEntry& e : batch.entries) {
          if (e.is_prefill) {
            ++b.chunks;
            b.chunk_cached_max = std::max(b.chunk_cached_max, e.q_start);
          } else {
            ++decodes;
            decode_kv += e.kv_len;
            b.decode_kv_max = std::max(b.decode_kv_max, e.kv_len);
          }
        }
        if (decodes > 0) b.decode_kv_mean = static_cast<double>(decode_kv) / decodes;
        *seen = b;
      });
    if (step_log.is_open())
      ro.on_step = [&, name, seen, n = int64_t{0}](const fe::StepResult& s, double end_s,
                                                   int64_t budget) mutable {
        step_log << name << ',' << seed << ',' << n++ << ',' << end_s << ',' << s.seconds << ','
                 << s.num_tokens << ',' << s.decodes << ',' << budget << ','
                 << model.runner->graph_counts().first << ',';
        if (calibrated) step_log << seen->predicted;
        step_log << ',' << seen->decode_kv_mean << ',' << seen->decode_kv_max << ',' << seen->chunks
                 << ',' << seen->chunk_cached_max << '\n';
      };
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
    return fe::replay(*engine, reqs, ro);
  };
  // The simulator runs the engine's configuration as make_model_engine resolves it (vllm's token
  // cap, max_model_len) on the same pool.
  // --budget auto runs in the simulator too, on the simulator's own clock.
  auto predict = [&](const fs::CostModel& cost, fs::Policy p, const std::vector<fs::Request>& reqs,
                     const fs::TbtSlo& slo) {
    fe::SimConfig sim;
    const fe::EngineConfig ec = fe::make_model_engine(model, scheduler_for(p))->config();
    sim.scheduler = ec.scheduler;
    sim.num_blocks = model.num_blocks;
    sim.block_size = model.block_size;
    sim.watermark = ec.watermark;
    if (o.sched.auto_budget(p)) sim.auto_budget_slo_s = slo.seconds;
    return fe::simulate(reqs, sim, cost);
  };

  if (o.cap.capacity) {
    // Bisect with the simulator, then hold each prediction against the engine itself.
    const fs::CostModel& cost = calibrated ? *calibrated : *roofline;
    if (workload.as_recorded())
      throw UsageError("--capacity", "the trace's arrivals span no time; it has no rate to scale");
    std::printf("\ncapacity, bisected with %s, then measured at x%.2f and x%.2f:\n",
                cost.describe().c_str(), 1 - o.confirm_margin, 1 + o.confirm_margin);
    // Every policy's capacity under every SLO in simulation first, so that a run too short for
    // the rates to be measured is refused before the engine runs at all.
    std::vector<std::vector<fs::CapacityResult>> caps(slos.size());
    for (size_t k = 0; k < slos.size(); ++k) {
      std::printf("  SLO %s: P99 TBT <= %s ms, P50 scheduling delay <= %s s\n",
                  slos[k].label.c_str(), fmt_ms(slos[k].seconds).c_str(),
                  fmt_s(o.cap.max_sched_delay).c_str());
      for (const fs::Policy p : policies) {
        caps[k].push_back(fs::find_capacity(
            [&](double r) { return predict(cost, p, workload.at(r), slos[k]).metrics; },
            o.cap.criteria(slos[k]), rate));
        const fs::CapacityResult& cap = caps[k].back();
        if (!(cap.capacity > 0) || cap.at_limit) continue;  // nothing will be measured
        // The engine runs at up to capacity x (1 + margin): those runs must be long enough for a
        // backlog to show (and so are the simulated ones that found it, at lower rates).
        check_option("--requests", [&] {
          const double top = cap.capacity * (1 + o.confirm_margin);
          fs::check_capacity_span(workload.at(top), top, o.cap.max_sched_delay, o.confirm_margin);
          return 0;
        });
      }
    }
    std::vector<std::string> lines;
    for (size_t k = 0; k < slos.size(); ++k) {
      const fs::CapacityCriteria crit = o.cap.criteria(slos[k]);
      for (size_t i = 0; i < policies.size(); ++i) {
        const fs::Policy p = policies[i];
        const fs::CapacityResult& cap = caps[k][i];
        char head[192];
        std::snprintf(head, sizeof head, "| %s | %s | %s | %s%.3f |", fs::to_string(p),
                      fmt_ms(slos[k].seconds).c_str(), fmt_s(o.cap.max_sched_delay).c_str(),
                      cap.at_limit ? ">= " : "", cap.capacity);
        if (!(cap.capacity > 0)) {
          lines.push_back(std::string(head) + " - | (nothing passes in simulation) | | | | | |");
          continue;
        }
        if (cap.at_limit) {
          lines.push_back(
              std::string(head) +
              " - | (met at every rate the search tried: nothing to confirm) | | | | | |");
          continue;
        }
        std::vector<fs::ServingMetrics> predicted;
        const fs::CapacityConfirmation conf = fs::confirm_capacity(
            cap.capacity,
            [&](double r) {
              const std::vector<fs::Request> reqs = workload.at(r);
              predicted.push_back(predict(cost, p, reqs, slos[k]).metrics);
              return measure(p, reqs, o.seed, slos[k]).metrics;
            },
            crit, o.confirm_margin);
        int n = 0;
        for (const fs::CapacityProbe* pr : {&conf.below, &conf.above}) {
          const fs::ServingMetrics& pm = predicted[n++];
          char row[256];
          std::snprintf(row, sizeof row, " %.3f | %.1f | %.1f | %.3f | %.3f | %s | %s |", pr->rate,
                        pr->tbt_p99_s * 1e3, pm.tbt.p99 * 1e3, pr->sched_delay_p50_s,
                        pm.sched_delay.p50, pr->ok ? "yes" : "no", crit.met_by(pm) ? "yes" : "no");
          lines.push_back(std::string(head) + row);
        }
        lines.push_back(std::string("| ") + fs::to_string(p) + " | " + fmt_ms(slos[k].seconds) +
                        " | | confirmed: " +
                        (conf.confirmed() ? "yes (met below, missed above)"
                                          : "no (the measured boundary is elsewhere)") +
                        " | | | | | | | |");
      }
    }
    print_capacity_header();
    for (const auto& l : lines) std::printf("%s\n", l.c_str());
    return 0;
  }

  // Per seed (--seeds), every policy on that seed's requests, measured and predicted.
  const std::vector<uint64_t> seeds = o.wl.seeds(o.seed);
  std::vector<fe::ReplayResult> results;  // the first seed's, for the plots
  std::vector<std::vector<fs::ServingMetrics>> measured(policies.size()),
      by_roofline(policies.size()), by_profile(policies.size());
  std::vector<int64_t> steps(policies.size());
  for (const uint64_t seed : seeds) {
    WorkloadSource w = workload;
    w.spec.seed = seed;
    const std::vector<fs::Request> reqs = seed == o.seed ? requests : w.at(rate > 0 ? rate : 1);
    const std::string tag = seeds.size() > 1 ? " (seed " + std::to_string(seed) + ")" : "";
    std::vector<fe::ReplayResult> res;
    for (const fs::Policy p : policies) res.push_back(measure(p, reqs, seed, slos[0]));
    std::printf("\nmeasured (%s, wall clock)%s:\n", model.device.c_str(), tag.c_str());
    print_metrics_header();
    for (size_t i = 0; i < policies.size(); ++i) {
      print_metrics_row(fs::to_string(policies[i]), res[i].metrics, res[i].steps);
      if (o.sched.auto_budget(policies[i]))
        std::printf("  (%s budget auto for %s: %s)\n", fs::to_string(policies[i]),
                    slos[0].label.c_str(), fe::budget_trace(res[i]).c_str());
      measured[i].push_back(res[i].metrics);
      steps[i] += res[i].steps / static_cast<int64_t>(seeds.size());
    }
    for (auto [cost, out, what] :
         {std::tuple{static_cast<const fs::CostModel*>(roofline.get()), &by_roofline, "roofline"},
          std::tuple{static_cast<const fs::CostModel*>(calibrated.get()), &by_profile,
                     "calibrated"}}) {
      if (!cost) continue;
      std::printf("\npredicted by the %s simulator%s (%s):\n", what, tag.c_str(),
                  cost->describe().c_str());
      print_metrics_header();
      for (size_t i = 0; i < policies.size(); ++i) {
        const fe::SimResult r = predict(*cost, policies[i], reqs, slos[0]);
        print_metrics_row(fs::to_string(policies[i]), r.metrics, r.steps);
        (*out)[i].push_back(r.metrics);
      }
    }
    if (results.empty()) results = std::move(res);
  }
  if (seeds.size() > 1) {
    std::printf("\nmean over seeds %s, measured:\n", o.wl.seeds_text.c_str());
    print_metrics_header();
    for (size_t i = 0; i < policies.size(); ++i)
      print_metrics_row(fs::to_string(policies[i]), mean_metrics(measured[i]), steps[i]);
  }
  if (calibrated) {
    std::printf("\nprediction beside measurement%s (calibrated simulator):\n",
                seeds.size() > 1 ? ", means over the seeds" : "");
    for (size_t i = 0; i < policies.size(); ++i)
      print_prediction_rows(fs::to_string(policies[i]), mean_metrics(measured[i]),
                            mean_metrics(by_profile[i]), i == 0);
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
