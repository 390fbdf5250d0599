// flashserve simulate: the engine's loop (engine/replay.h) with the real scheduler and block
// manager against a step-cost model on a simulated clock. This file only parses flags and prints.
//   flashserve simulate --model mistral-7b --workload chat --rate 2 --compare
//   flashserve simulate --compare --capacity --slo-tbt 0.1 --plot bench/results/simulate-x
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/capacity_flags.h"
#include "cli/command.h"
#include "cli/kv_cache_flag.h"
#include "cli/options.h"
#include "cli/scheduler_flags.h"
#include "cli/serving_report.h"
#include "cli/tensor_parallel_flag.h"
#include "common/checked_math.h"
#include "engine/simulator.h"
#include "flashserve/error.h"
#include "model/step_graphs.h"
#include "model/tensor_parallel.h"
#include "serve/capacity.h"
#include "serve/cost_model.h"
#include "serve/svg_plot.h"
#include "serve/tbt_slo.h"
#include "serve/workload.h"

namespace fs = flashserve::serve;
namespace fe = flashserve::engine;
using flashserve::Error;
using flashserve::ErrorKind;
using namespace flashserve::cli;

namespace {

struct Options {
  SchedulerFlags sched;  // max_model_len 0: min(model context, 16384)
  std::string model = "mistral-7b";
  std::string gpu = "h200";
  std::string profile;
  double step_overhead_ms = 0;  // only when given
  double gpu_mem_util = 0.9;
  int32_t block_size = 16;
  int64_t num_blocks = 0;  // only when given
  double watermark = 0.01;
  WorkloadFlags wl;
  std::string trace;
  double rate = 1.0;
  int64_t requests = 1000;
  uint64_t seed = 0;
  CapacityFlags cap;
  std::string plot;
  bool verbose = false;
  KvCacheDtypeFlag kv_dtype;
  TensorParallelFlag tp;  // > 1: a profile measured at that size, the pool of one rank's GPU
  // Which options were given (a default and a given value of the same number differ here).
  bool rate_given = false, overhead_given = false, num_blocks_given = false;
};

// Everything a run needs once the options are parsed: the cost model, the workload as a function
// of the rate, and one engine configuration per policy.
struct Study {
  fs::ModelShape model;
  std::unique_ptr<fs::CostModel> cost;
  WorkloadSource workload;
  std::vector<fs::Policy> policies;
  std::vector<fe::SimConfig> configs;
  std::vector<bool> auto_budget;  // per policy: --budget auto
  std::vector<fs::TbtSlo> slos;   // --slo-tbt resolved; the first is the run at --rate's
  int64_t num_blocks = 0, baseline_tokens = 0;
  std::string at_rate;  // "2.000 req/s", or the trace's own times

  // Policy `policy` on `requests`, its auto budget (if it has one) under `slo`.
  fe::SimResult run(size_t policy, const std::vector<fs::Request>& requests,
                    const fs::TbtSlo& slo) const {
    fe::SimConfig c = configs[policy];
    if (auto_budget[policy]) c.auto_budget_slo_s = slo.seconds;
    return fe::simulate(requests, c, *cost);
  }
  fe::SimResult run(size_t policy, double rate, const fs::TbtSlo& slo) const {
    return run(policy, workload.at(rate), slo);
  }
};

// Per SLO and policy: the capacity found, and whether the search hit its upper limit (a lower
// bound).
struct Capacities {
  std::vector<std::vector<double>> rate;
  std::vector<std::vector<bool>> at_limit;
  // The largest capacity found, for the plots' rate axis.
  double top() const {
    double t = 0;
    for (const auto& r : rate)
      for (double x : r) t = std::max(t, x);
    return t;
  }
};

// The library's errors name its own fields; where a field's name is not its option's, say which
// option set it ("--budget: max_tokens_per_step: 0 must be positive").
[[noreturn]] void rethrow_naming_the_option(const Error& e) {
  static const std::pair<const char*, const char*> kOptionOf[] = {
      {"max_tokens_per_step", "--budget"},
      {"max_running", "--max-running"},
      {"max_model_len", "--max-model-len"},
      {"chunk_tile", "--chunk-tile"},
      {"long_prefill_token_threshold", "--long-prefill-threshold"},
      {"num_blocks", "--num-blocks"},
      {"block_size", "--block-size"},
      {"gpu_memory_utilization", "--gpu-mem-util"},
      {"gpu.step_overhead_s", "--step-overhead-ms"},
      {"num_requests", "--requests"},
      {"prompt_len", "--prompt-len"},
      {"output_len", "--output-len"},
      {"start_rate", "--rate"},
      {"slo_tbt_p99_s", "--slo-tbt"},
      {"slo_tbt_s", "--slo-tbt"},
      {"budget", "--budget"},
      {"max_sched_delay_p50_s", "--max-sched-delay"},
  };
  for (const auto& [field, option] : kOptionOf)
    if (e.argument() == field) throw Error(e.kind(), option, e.what());
  throw e;
}

// Parses the command line into `o`; returns -1 to go on, else the exit status (--help, usage
// error). Every option is used or refused.
int parse_options(int argc, char** argv, Options& o) {
  CLI::App app{"Simulate serving with the real scheduler against a step-cost model"};
  // Ranges: what the models can mean, and what keeps every product of them (tokens x blocks,
  // requests x lengths) far inside int64 and the simulated clock inside double's precision.
  add_scheduler_options(app, o.sched, fs::policy_names(), "min(model context, 16384)");
  app.add_option("--model", o.model, "mistral-7b, llama-3-8b, yi-34b or llama-2-70b")
      ->default_str(o.model);
  app.add_option("--gpu", o.gpu, "GPU preset for the roofline cost model (h200, a100)")
      ->default_str(o.gpu);
  app.add_option(
      "--profile", o.profile,
      "a model's measured step parts (`flashserve profile`) instead of the roofline model; "
      "--model still sizes the KV cache");
  auto* overhead_opt = add_real(app, "--step-overhead-ms", o.step_overhead_ms, {0, 1e6},
                                "fixed cost per step (roofline)");
  auto* mem_util_opt = add_real(app, "--gpu-mem-util", o.gpu_mem_util, {0, 1, Open::kLow},
                                "fraction of GPU memory for weights + KV");
  add_int(app, "--block-size", o.block_size, {1, 1 << 16}, "KV block size in tokens");
  auto* num_blocks_opt = add_int(app, "--num-blocks", o.num_blocks, {1, int64_t{1} << 31},
                                 "KV blocks (default: what fits in memory)");
  o.kv_dtype.add(app);
  add_real(app, "--watermark", o.watermark, {0, 1, Open::kHigh},
           "fraction of blocks kept free at admission (sarathi, vllm-v0, static; vllm-v1 and orca "
           "admit without one)");
  o.wl.add(app);
  o.tp.add(app,
           "GPUs the model is split over (Megatron-style): the --profile must be measured at "
           "this size; the KV cache is what fits beside one rank's weights");
  app.add_option("--trace", o.trace, "CSV trace arrival_s,prompt_tokens,output_tokens");
  auto* rate_opt = add_real(app, "--rate", o.rate, {0, 1e6, Open::kLow}, "requests per second");
  auto* requests_opt = add_int(app, "--requests", o.requests, {1, fs::kMaxGeneratedRequests},
                               "requests per simulation");
  auto* seed_opt = add_uint(app, "--seed", o.seed, "workload seed");
  o.cap.add(app, "find the capacity under each SLO by bisection");
  auto* plot_opt = app.add_option(
      "--plot", o.plot,
      "write PREFIX-tbt-cdf.svg (with --capacity also PREFIX-p99-tbt-vs-rate.svg and "
      "PREFIX-sched-delay-vs-rate.svg)");
  app.add_flag("--verbose", o.verbose,
               "print every rate the capacity search tried (+ met, - missed) and every metric");
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  const bool traced = !o.trace.empty();
  o.sched.refuse_inapplicable();
  refuse_unless(overhead_opt, o.profile.empty(),
                "applies to the roofline model, not to a measured --profile");
  // The roofline model costs one GPU's step; a tensor-parallel step is a rank's compute and its
  // all-reduces, which only a profile measured at that size has.
  refuse_unless(o.tp.option, o.tp.size == 1 || !o.profile.empty(),
                "needs a --profile measured with the same --tensor-parallel-size (the roofline "
                "model is of one GPU)");
  refuse_unless(mem_util_opt, num_blocks_opt->count() == 0,
                "sizes the KV cache, which --num-blocks sets");
  for (auto* opt : {o.wl.workload_opt, o.wl.arrival_opt, requests_opt, seed_opt})
    refuse_unless(opt, !traced, "--trace gives the requests; drop " + opt->get_name());
  o.wl.refuse_inapplicable(traced);
  refuse_unless(seed_opt, o.wl.seeds_opt->count() == 0, "give --seed or --seeds, not both");
  refuse_unless(plot_opt, o.wl.seeds_opt->count() == 0, "draws one seed's run; drop --seeds");
  o.cap.check(true, true, "");
  if (o.sched.budget_auto && !o.cap.capacity && o.cap.slo_specs.size() > 1)
    throw UsageError("--slo-tbt",
                     "--budget auto chooses a budget for one SLO; give one, or --capacity to "
                     "search each");
  if (o.cap.capacity && !traced) o.cap.check_requests(o.requests);
  o.rate_given = rate_opt->count() > 0;
  o.overhead_given = overhead_opt->count() > 0;
  o.num_blocks_given = num_blocks_opt->count() > 0;
  o.kv_dtype.resolve("");  // a bad value is a usage error before anything runs
  return -1;
}

// The cost model, the limits and KV cache, the workload and the engines' configurations; throws
// (naming the field or option) before anything is printed.
Study prepare(Options& o) {
  Study st;
  const bool traced = !o.trace.empty();
  const bool rate_given = o.rate_given;
  // The cost model.
  st.model = fs::model_preset(o.model);
  // The GPU's cache: bf16 (auto) or fp8, whose blocks hold twice the tokens and whose decode
  // reads half the bytes.
  st.model.kv_bytes_per_elem = flashserve::model::kv_cache_element_bytes(o.kv_dtype.resolve(""), 2);
  const fs::ModelShape& model = st.model;
  fs::GpuSpec gpu = fs::gpu_preset(o.gpu);
  // Given means used (a profile refuses it above), 0 included.
  if (o.overhead_given) gpu.step_overhead_s = o.step_overhead_ms * 1e-3;
  if (!o.profile.empty()) {
    auto table = std::make_unique<fs::ProfileCostModel>(fs::ProfileCostModel::load(o.profile));
    check_profile_kv_cache(table->profile(), o.kv_dtype.resolve(""));
    check_profile_tensor_parallel(table->profile(), o.tp.size);
    // A profile of the CUDA runner: its deployment pads mixed steps to their graphs' rows, as
    // this process's environment would set that runner up.
    if (table->profile().meta.count("device") && table->profile().meta.at("device") == "cuda")
      table->set_step_graphs(flashserve::model::step_graph_options_from_env());
    st.cost = std::move(table);
  } else {
    st.cost = std::make_unique<fs::RooflineCostModel>(model, gpu);
  }

  // Limits and the KV cache.
  if (o.sched.max_model_len == 0)
    o.sched.max_model_len = std::min<int64_t>(model.max_context, 16384);
  if (o.sched.max_model_len > model.max_context)
    throw Error(ErrorKind::kInvalidArgument, "--max-model-len",
                std::to_string(o.sched.max_model_len) + " exceeds " + model.name + "'s context " +
                    std::to_string(model.max_context));
  // Under tensor parallelism each GPU holds one rank's weights and its KV heads of every token:
  // the blocks that fit beside a rank's weights are the pool's.
  const fs::ModelShape pool_model =
      o.tp.size == 1 ? model : check_option("--tensor-parallel-size", [&] {
        return flashserve::model::rank_model_shape(model, o.tp.size);
      });
  st.num_blocks =
      o.num_blocks_given
          ? o.num_blocks  // checked by the BlockManager, naming num_blocks
          : fs::kv_blocks_for(pool_model, gpu.memory_bytes, o.gpu_mem_util, o.block_size);

  // The workload, as a function of the rate (the same lengths and the same arrival pattern,
  // scaled).
  fs::WorkloadSpec spec = o.wl.spec();
  spec.num_requests = o.requests;
  spec.max_model_len = o.sched.max_model_len;
  spec.seed = o.seed;
  st.workload = WorkloadSource::resolve(traced ? o.trace : o.wl.workload, spec, traced);
  const WorkloadSource& workload = st.workload;
  if (traced && !workload.is_trace())
    throw Error(ErrorKind::kInvalidArgument, "--trace",
                o.trace + " is a length table; pass it as --workload");
  if (workload.is_trace()) {
    // One request, or all at once: there is no rate to scale from, so it runs as recorded.
    if (workload.as_recorded() && (rate_given || o.cap.capacity))
      throw Error(ErrorKind::kInvalidArgument, rate_given ? "--rate" : "--capacity",
                  o.trace + "'s arrivals span no time, so they cannot be replayed at other rates");
    if (!rate_given) o.rate = workload.trace_rate;
  }
  const bool as_recorded = workload.as_recorded();
  if (!as_recorded && !(o.rate > 0 && std::isfinite(o.rate)))
    throw Error(ErrorKind::kInvalidArgument, "--rate",
                std::to_string(o.rate) + " must be positive and finite");
  st.at_rate = as_recorded ? "its recorded arrival times" : fmt_s(o.rate) + " req/s";

  st.policies = o.sched.selected(fs::all_policies());
  st.slos = o.cap.slos(*st.cost, o.sched.max_model_len, st.num_blocks * o.block_size);
  // vllm-v0 never chunks, so one step must hold a whole prompt (vLLM v0's default is the same).
  st.baseline_tokens = std::max(o.sched.budget_for(fs::Policy::kVllmV0), o.sched.max_model_len);
  for (fs::Policy p : st.policies) {
    fe::SimConfig c;
    c.scheduler = o.sched.config_for(p, st.baseline_tokens);
    c.num_blocks = st.num_blocks;
    c.block_size = o.block_size;
    c.watermark = o.watermark;
    // Built once here so that a bad limit fails, naming its field, before anything is printed.
    fs::BlockManager blocks(c.num_blocks, c.block_size, c.watermark);
    fs::Scheduler::create(c.scheduler, blocks);
    st.configs.push_back(c);
    st.auto_budget.push_back(o.sched.auto_budget(p));
  }
  return st;
}

// What is simulated: the cost model, the workload (checked against the limits) and the limits.
void print_setup(const Study& st, const Options& o, const std::vector<fs::Request>& base) {
  const WorkloadSource& workload = st.workload;
  int64_t ptok = 0, otok = 0;
  const std::string source = o.trace.empty() ? "workload" : o.trace;
  for (const auto& r : base) {
    ptok = flashserve::checked_add(ptok, r.prompt_tokens, source);
    otok = flashserve::checked_add(otok, r.output_tokens, source);
    if (flashserve::saturating_add(r.prompt_tokens, r.output_tokens) > o.sched.max_model_len)
      throw Error(ErrorKind::kInvalidArgument, source,
                  "request " + std::to_string(r.id) + ": prompt " +
                      std::to_string(r.prompt_tokens) + " + output " +
                      std::to_string(r.output_tokens) + " tokens exceeds --max-model-len " +
                      std::to_string(o.sched.max_model_len));
  }
  std::printf("cost model: %s\n", st.cost->describe().c_str());
  std::printf(
      "workload: %s, %zu requests, mean prompt %.0f, mean output %.0f tokens, %s arrivals%s\n",
      workload.label.c_str(), base.size(), static_cast<double>(ptok) / base.size(),
      static_cast<double>(otok) / base.size(), o.trace.empty() ? o.wl.arrival.c_str() : "trace",
      o.trace.empty() ? (", seed " + std::to_string(o.seed)).c_str() : "");
  std::printf("limits: max model len %lld, KV cache %lld blocks x %d tokens (%s)\n",
              static_cast<long long>(o.sched.max_model_len), static_cast<long long>(st.num_blocks),
              o.block_size, flashserve::model::kv_cache_dtype_name(o.kv_dtype.resolve("")));
  for (size_t i = 0; i < st.configs.size(); ++i) {
    std::printf("  %s\n", describe_limits(st.configs[i].scheduler, st.auto_budget[i]).c_str());
    if (!st.auto_budget[i]) continue;
    for (const fs::TbtSlo& slo : st.slos) {
      const fe::SimConfig& c = st.configs[i];
      const auto ac =
          fs::AutoBudgetConfig::for_scheduler(c.scheduler, c.num_blocks, c.block_size, slo.seconds);
      const fs::BudgetChoice b = fs::choose_budget(*st.cost, ac);
      std::printf("    budget auto for %s: %lld first (worst mixed step %.2f ms%s)\n",
                  slo.label.c_str(), static_cast<long long>(b.budget), b.worst_s * 1e3,
                  b.meets ? "" : ", over the SLO: no budget meets it offline");
    }
  }
  std::printf(
      "SLOs: %s; P50 scheduling delay bound %s s\n",
      [&] {
        std::string all;
        for (const fs::TbtSlo& slo : st.slos)
          all += (all.empty() ? "" : ", ") + slo.label + " = " + fmt_ms(slo.seconds) + " ms";
        return all;
      }()
          .c_str(),
      fmt_s(o.cap.max_sched_delay).c_str());
}

// The overload a capacity search must tell from capacity (check_capacity_span): 10%, the margin
// bench-serve confirms a capacity by.
constexpr double kCapacityResolution = 0.1;

// The capacity of every policy under every SLO, by bisection over simulations.
Capacities search_capacity(const Study& st, const Options& o) {
  Capacities cap;
  for (const fs::TbtSlo& slo : st.slos) {
    const fs::CapacityCriteria crit = o.cap.criteria(slo);
    cap.rate.emplace_back();
    cap.at_limit.emplace_back();
    for (size_t i = 0; i < st.policies.size(); ++i) {
      const auto res = fs::find_capacity([&](double rate) { return st.run(i, rate, slo).metrics; },
                                         crit, o.rate);
      // A boundary found by runs too short to show a backlog is no boundary. (A result at the
      // search's limit is printed as a lower bound, ">= X", and found no boundary to check.)
      if (res.capacity > 0 && !res.at_limit)
        flashserve::cli::check_option("--requests", [&] {
          fs::check_capacity_span(st.workload.at(res.capacity), res.capacity, o.cap.max_sched_delay,
                                  kCapacityResolution);
          return 0;
        });
      cap.rate.back().push_back(res.capacity);
      cap.at_limit.back().push_back(res.at_limit);
      if (o.verbose) {
        std::printf("capacity search, %s, %s:", fs::to_string(st.policies[i]), slo.label.c_str());
        for (const auto& p : res.probes) std::printf(" %.3f%s", p.rate, p.ok ? "+" : "-");
        std::printf("  -> %s%.3f req/s\n", res.at_limit ? ">= " : "", res.capacity);
      }
    }
  }
  return cap;
}

// "7.123", or ">= 7.123" when the SLO held at every rate up to the search's limit (a lower
// bound).
std::string capacity_text(double rate, bool at_limit) {
  return (at_limit ? ">= " : "") + fmt_s(rate);
}

// One row per policy and SLO, the scheduling-delay bound beside each; `text(slo, policy)` is the
// capacity cell.
template <typename Cell>
void print_capacity_table(const Study& st, const Options& o, const Cell& text) {
  std::printf(
      "| policy | P99 TBT SLO | SLO (ms) | P50 sched delay bound (s) | capacity (req/s) |\n"
      "|---|---|---|---|---|\n");
  for (size_t k = 0; k < st.slos.size(); ++k)
    for (size_t i = 0; i < st.policies.size(); ++i)
      std::printf("| %s | %s | %s | %s | %s |\n", fs::to_string(st.policies[i]),
                  st.slos[k].label.c_str(), fmt_ms(st.slos[k].seconds).c_str(),
                  fmt_s(o.cap.max_sched_delay).c_str(), text(k, i).c_str());
}

// The table at --rate (a policy under --budget auto runs at the first SLO's budget), the full
// metrics with --verbose, and the TBT CDF.
std::vector<fe::SimResult> report_at_rate(const Study& st, const Options& o,
                                          const std::vector<fs::Request>& base) {
  const auto& policies = st.policies;
  const std::string& at_rate = st.at_rate;
  std::printf(
      "\nat %s%s:\n", at_rate.c_str(),
      o.sched.budget_auto ? (", sarathi's budget auto for " + st.slos[0].label).c_str() : "");
  print_metrics_header();
  fs::SvgPlot cdf;
  cdf.title = st.model.name + ", " + st.workload.label + ", " + at_rate + ": TBT CDF";
  cdf.x_label = "time between tokens (ms, log scale)";
  cdf.y_label = "fraction of gaps";
  cdf.log_x = true;
  std::vector<fs::ServingMetrics> all;
  std::vector<fe::SimResult> results;
  for (size_t i = 0; i < policies.size(); ++i) {
    results.push_back(st.run(i, base, st.slos[0]));
    const fe::SimResult& r = results.back();
    const auto& m = r.metrics;
    all.push_back(m);
    print_metrics_row(fs::to_string(policies[i]), m, r.steps);
    if (st.auto_budget[i])
      std::printf("  (%s budget auto: %s)\n", fs::to_string(policies[i]),
                  fe::budget_trace(r).c_str());
    if (!o.plot.empty() && !m.tbt_samples.empty())
      cdf.series.push_back(tbt_cdf_series(fs::to_string(policies[i]), m));
  }
  if (o.verbose) {
    std::vector<std::string> names;
    for (fs::Policy p : policies) names.push_back(fs::to_string(p));
    print_metrics_detail(names, all);
  }
  if (!o.plot.empty()) {
    const std::string path = o.plot + "-tbt-cdf.svg";
    cdf.write(path);
    std::printf("\nplot: %s\n", path.c_str());
  }
  return results;
}

// P99 TBT and P50 scheduling delay against the rate, around the largest capacity found, with a
// line per SLO (a policy under --budget auto at the first SLO's budget).
void plot_rate_sweeps(const Study& st, const Options& o, const Capacities& cap) {
  const fs::ModelShape& model = st.model;
  const WorkloadSource& workload = st.workload;
  const auto& policies = st.policies;
  const double top = std::max(cap.top(), o.rate);
  double slo_max = 0;
  fs::SvgPlot sweep;
  sweep.title = model.name + ", " + workload.label + ": P99 TBT vs request rate";
  sweep.x_label = "request rate (req/s)";
  sweep.y_label = "P99 TBT (ms)";
  for (const fs::TbtSlo& slo : st.slos) {
    slo_max = std::max(slo_max, slo.seconds);
    sweep.ref_lines.push_back({slo.seconds * 1e3, "SLO " + fmt_ms(slo.seconds) + " ms"});
  }
  sweep.y_max = slo_max * 1e3 * 4;
  fs::SvgPlot delay = sweep;
  delay.title = model.name + ", " + workload.label + ": P50 scheduling delay vs request rate";
  delay.y_label = "P50 scheduling delay (s)";
  delay.y_max = o.cap.max_sched_delay * 4;
  delay.ref_lines = {{o.cap.max_sched_delay, "bound " + fmt_s(o.cap.max_sched_delay) + " s"}};
  constexpr int kPoints = 12;
  for (size_t i = 0; i < policies.size(); ++i) {
    fs::SvgSeries s{fs::to_string(policies[i]), {}, {}, true}, d = s;
    for (int k = 1; k <= kPoints; ++k) {
      const double rate = top * 1.5 * k / kPoints;
      const fs::ServingMetrics m = st.run(i, rate, st.slos[0]).metrics;
      s.x.push_back(rate);
      s.y.push_back(m.tbt.p99 * 1e3);
      d.x.push_back(rate);
      d.y.push_back(m.sched_delay.p50);
    }
    sweep.series.push_back(std::move(s));
    delay.series.push_back(std::move(d));
  }
  for (const auto& [plot, suffix] :
       {std::pair{&sweep, "-p99-tbt-vs-rate.svg"}, std::pair{&delay, "-sched-delay-vs-rate.svg"}}) {
    const std::string path = o.plot + suffix;
    plot->write(path);
    std::printf("plot: %s (values above %g drawn on the top edge)\n", path.c_str(), plot->y_max);
  }
}

int simulate(int argc, char** argv) {
  Options o;
  if (const int rc = parse_options(argc, argv, o); rc >= 0) return rc;
  const std::vector<uint64_t> seeds = o.wl.seeds(o.seed);
  const auto t0 = std::chrono::steady_clock::now();
  // Per seed: the whole study (its own requests); then, with several seeds, the mean of each.
  std::vector<std::vector<fs::ServingMetrics>> per_policy;
  std::vector<Capacities> capacities;  // per seed
  std::vector<int64_t> steps;
  for (const uint64_t seed : seeds) {
    o.seed = seed;
    if (seeds.size() > 1)
      std::printf("%s== seed %llu\n", seed == seeds[0] ? "" : "\n",
                  static_cast<unsigned long long>(seed));
    const Study st = prepare(o);
    const std::vector<fs::Request> base = st.workload.at(o.rate);
    print_setup(st, o, base);
    if (o.cap.capacity && st.workload.is_trace())
      o.cap.check_requests(static_cast<int64_t>(base.size()));
    // Capacity first, so that the plot's sweep can span it.
    const Capacities cap = o.cap.capacity ? search_capacity(st, o) : Capacities{};
    const std::vector<fe::SimResult> res = report_at_rate(st, o, base);
    if (o.cap.capacity) {
      std::printf("\ncapacity:\n");
      print_capacity_table(st, o, [&](size_t k, size_t i) {
        return capacity_text(cap.rate[k][i], cap.at_limit[k][i]);
      });
    }
    if (!o.plot.empty() && o.cap.capacity) plot_rate_sweeps(st, o, cap);
    per_policy.resize(res.size());
    steps.resize(res.size());
    capacities.push_back(cap);
    for (size_t i = 0; i < res.size(); ++i) {
      per_policy[i].push_back(res[i].metrics);
      steps[i] += res[i].steps / static_cast<int64_t>(seeds.size());
    }
    if (seed != seeds.back()) continue;
    if (seeds.size() == 1) break;
    std::printf("\nmean over seeds %s (at %s req/s):\n", o.wl.seeds_text.c_str(),
                fmt_s(o.rate).c_str());
    print_metrics_header();
    for (size_t i = 0; i < st.policies.size(); ++i)
      print_metrics_row(fs::to_string(st.policies[i]), mean_metrics(per_policy[i]), steps[i]);
    if (!o.cap.capacity) break;
    std::printf("\nmean capacity over seeds %s (each seed's in brackets):\n",
                o.wl.seeds_text.c_str());
    print_capacity_table(st, o, [&](size_t k, size_t i) {
      double sum = 0;
      std::string each;
      for (const Capacities& c : capacities) {
        sum += c.rate[k][i];
        each += (each.empty() ? "" : ", ") + capacity_text(c.rate[k][i], c.at_limit[k][i]);
      }
      return fmt_s(sum / static_cast<double>(capacities.size())) + " (" + each + ")";
    });
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n(%.1f s of host time)\n", secs);
  return 0;
}

int run(int argc, char** argv) {
  try {
    return simulate(argc, argv);
  } catch (const Error& e) {
    rethrow_naming_the_option(e);
  }
}

flashserve::cli::Register reg("simulate", "simulate serving policies against a step-cost model",
                              run);

}  // namespace
