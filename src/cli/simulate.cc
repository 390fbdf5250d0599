// flashserve simulate: runs the real scheduler and block manager against a step-cost model.
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

#include "cli/command.h"
#include "cli/options.h"
#include "common/checked_math.h"
#include "flashserve/error.h"
#include "serve/capacity.h"
#include "serve/cost_model.h"
#include "serve/simulator.h"
#include "serve/svg_plot.h"
#include "serve/workload.h"

namespace fs = flashserve::serve;
using flashserve::Error;
using flashserve::ErrorKind;
using namespace flashserve::cli;

namespace {

struct Options {
  std::string policy = "sarathi";
  bool compare = false;
  int64_t budget = 512;
  int64_t chunk_tile = 64;
  int64_t max_running = 256;
  int64_t max_model_len = 0;  // 0: min(model context, 16384)
  std::string model = "mistral-7b";
  std::string gpu = "h200";
  std::string profile;
  double step_overhead_ms = 0;  // only when given
  double gpu_mem_util = 0.9;
  int32_t block_size = 16;
  int64_t num_blocks = 0;  // only when given
  double watermark = 0.01;
  std::string workload = "chat";
  int64_t prompt_len = 512, output_len = 128;
  std::string trace;
  std::string arrival = "poisson";
  double cv = 1.0;
  double rate = 1.0;
  int64_t requests = 1000;
  uint64_t seed = 0;
  bool capacity = false;
  double slo_tbt = 0.1;
  double max_sched_delay = 2.0;
  std::string plot;
  bool verbose = false;
};

std::string fmt_s(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", s);
  return b;
}
std::string fmt_ms(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", s * 1e3);
  return b;
}

// The library's errors name its own fields; where a field's name is not its option's, say which
// option set it ("--budget: max_tokens_per_step: 0 must be positive").
[[noreturn]] void rethrow_naming_the_option(const Error& e) {
  static const std::pair<const char*, const char*> kOptionOf[] = {
      {"max_tokens_per_step", "--budget"},
      {"max_running", "--max-running"},
      {"max_model_len", "--max-model-len"},
      {"chunk_tile", "--chunk-tile"},
      {"num_blocks", "--num-blocks"},
      {"block_size", "--block-size"},
      {"gpu_memory_utilization", "--gpu-mem-util"},
      {"gpu.step_overhead_s", "--step-overhead-ms"},
      {"num_requests", "--requests"},
      {"prompt_len", "--prompt-len"},
      {"output_len", "--output-len"},
      {"start_rate", "--rate"},
      {"slo_tbt_p99_s", "--slo-tbt"},
      {"max_sched_delay_p50_s", "--max-sched-delay"},
  };
  for (const auto& [field, option] : kOptionOf)
    if (e.argument() == field) throw Error(e.kind(), option, e.what());
  throw e;
}

int simulate(int argc, char** argv) {
  Options o;
  CLI::App app{"Simulate serving with the real scheduler against a step-cost model"};
  // Ranges: what the models can mean, and what keeps every product of them (tokens x blocks,
  // requests x lengths) far inside int64 and the simulated clock inside double's precision.
  constexpr int64_t kMaxTokens = int64_t{1} << 24;
  auto* policy_opt =
      app.add_option("--policy", o.policy, "sarathi, vllm, orca or static")->default_str(o.policy);
  app.add_flag("--compare", o.compare, "run every policy side by side");
  add_int(app, "--budget", o.budget, {1, kMaxTokens}, "sarathi's token budget per step");
  auto* chunk_tile_opt = add_int(app, "--chunk-tile", o.chunk_tile, {1, kMaxTokens},
                                 "sarathi: non-final chunks are a multiple of this");
  add_int(app, "--max-running", o.max_running, {1, 1 << 20}, "sequences running at once");
  add_int(app, "--max-model-len", o.max_model_len, {0, kMaxTokens},
          "prompt + output limit (0: min(model context, 16384))");
  app.add_option("--model", o.model, "mistral-7b, llama-3-8b or llama-2-70b")->default_str(o.model);
  app.add_option("--gpu", o.gpu, "GPU preset for the roofline cost model (h200)")
      ->default_str(o.gpu);
  app.add_option(
      "--profile", o.profile,
      "CSV of measured step times (prefill_tokens,decode_tokens,kv_tokens,seconds) instead of "
      "the roofline model");
  auto* overhead_opt = add_real(app, "--step-overhead-ms", o.step_overhead_ms, {0, 1e6},
                                "fixed cost per step (roofline)");
  auto* mem_util_opt = add_real(app, "--gpu-mem-util", o.gpu_mem_util, {0, 1, Open::kLow},
                                "fraction of GPU memory for weights + KV");
  add_int(app, "--block-size", o.block_size, {1, 1 << 16}, "KV block size in tokens");
  auto* num_blocks_opt = add_int(app, "--num-blocks", o.num_blocks, {1, int64_t{1} << 31},
                                 "KV blocks (default: what fits in memory)");
  add_real(app, "--watermark", o.watermark, {0, 1, Open::kHigh},
           "fraction of blocks kept free at admission");
  auto* workload_opt =
      app.add_option("--workload", o.workload, "chat, summarize or fixed")->default_str(o.workload);
  auto* prompt_opt =
      add_int(app, "--prompt-len", o.prompt_len, {1, kMaxTokens}, "fixed workload: prompt tokens");
  auto* output_opt =
      add_int(app, "--output-len", o.output_len, {1, kMaxTokens}, "fixed workload: output tokens");
  app.add_option("--trace", o.trace, "CSV trace arrival_s,prompt_tokens,output_tokens");
  auto* arrival_opt =
      app.add_option("--arrival", o.arrival, "poisson or gamma")->default_str(o.arrival);
  auto* cv_opt = add_real(app, "--cv", o.cv, {fs::kMinGammaCv, fs::kMaxGammaCv},
                          "gamma arrivals: coefficient of variation of the gaps");
  auto* rate_opt = add_real(app, "--rate", o.rate, {0, 1e6, Open::kLow}, "requests per second");
  auto* requests_opt = add_int(app, "--requests", o.requests, {1, fs::kMaxGeneratedRequests},
                               "requests per simulation");
  auto* seed_opt = add_uint(app, "--seed", o.seed, "workload seed");
  app.add_flag("--capacity", o.capacity, "find the capacity under the SLO by bisection");
  add_real(app, "--slo-tbt", o.slo_tbt, {0, 3600, Open::kLow}, "P99 TBT SLO in seconds");
  add_real(app, "--max-sched-delay", o.max_sched_delay, {0, 1e6, Open::kLow},
           "P50 scheduling delay bound (s)");
  app.add_option("--plot", o.plot,
                 "write PREFIX-tbt-cdf.svg (with --capacity also PREFIX-p99-tbt-vs-rate.svg and "
                 "PREFIX-sched-delay-vs-rate.svg)");
  app.add_flag("--verbose", o.verbose,
               "print every rate the capacity search tried (+ met, - missed) and every metric");
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  // Every option is used or refused.
  const bool traced = !o.trace.empty();
  refuse_unless(policy_opt, !o.compare, "--compare runs every policy; drop --policy");
  refuse_unless(chunk_tile_opt, o.compare || o.policy == "sarathi",
                "only sarathi chunks prompts (--policy sarathi or --compare)");
  refuse_unless(overhead_opt, o.profile.empty(),
                "applies to the roofline model, not to a measured --profile");
  refuse_unless(mem_util_opt, num_blocks_opt->count() == 0,
                "sizes the KV cache, which --num-blocks sets");
  for (auto* opt : {workload_opt, arrival_opt, requests_opt, seed_opt})
    refuse_unless(opt, !traced, "--trace gives the requests; drop " + opt->get_name());
  refuse_unless(cv_opt, !traced && o.arrival == "gamma", "only applies to --arrival gamma");
  for (auto* opt : {prompt_opt, output_opt})
    refuse_unless(opt, !traced && o.workload == "fixed", "only applies to --workload fixed");
  const bool rate_given = rate_opt->count() > 0;

  // The cost model.
  const fs::ModelShape model = fs::model_preset(o.model);
  fs::GpuSpec gpu = fs::gpu_preset(o.gpu);
  // Given means used (a profile refuses it above), 0 included.
  if (overhead_opt->count() > 0) gpu.step_overhead_s = o.step_overhead_ms * 1e-3;
  std::unique_ptr<fs::CostModel> cost;
  if (!o.profile.empty())
    cost = std::make_unique<fs::ProfileCostModel>(fs::ProfileCostModel::load(o.profile));
  else
    cost = std::make_unique<fs::RooflineCostModel>(model, gpu);

  // Limits and the KV cache.
  if (o.max_model_len == 0) o.max_model_len = std::min<int64_t>(model.max_context, 16384);
  if (o.max_model_len > model.max_context)
    throw Error(ErrorKind::kInvalidArgument, "--max-model-len",
                std::to_string(o.max_model_len) + " exceeds " + model.name + "'s context " +
                    std::to_string(model.max_context));
  const int64_t num_blocks =
      num_blocks_opt->count()
          ? o.num_blocks  // checked by the BlockManager, naming num_blocks
          : fs::kv_blocks_for(model, gpu.memory_bytes, o.gpu_mem_util, o.block_size);

  // The workload, as a function of the rate (the same lengths and the same arrival pattern,
  // scaled).
  std::vector<fs::Request> trace;
  double trace_rate = 0;  // the trace's own; 0 if its arrivals span no time
  fs::WorkloadSpec spec;
  if (!o.trace.empty()) {
    trace = fs::load_trace(o.trace);
    trace_rate = fs::mean_rate(trace);
    // One request, or all at once: there is no rate to scale from, so it runs as recorded.
    if (trace_rate == 0 && (rate_given || o.capacity))
      throw Error(ErrorKind::kInvalidArgument, rate_given ? "--rate" : "--capacity",
                  o.trace + "'s arrivals span no time, so they cannot be replayed at other rates");
    if (!rate_given) o.rate = trace_rate;
  } else {
    spec.lengths = fs::parse_length_kind(o.workload);
    spec.fixed_prompt = o.prompt_len;
    spec.fixed_output = o.output_len;
    spec.arrival = fs::parse_arrival_kind(o.arrival);
    spec.cv = o.cv;
    spec.num_requests = o.requests;
    spec.max_model_len = o.max_model_len;
    spec.seed = o.seed;
  }
  const bool as_recorded = !trace.empty() && trace_rate == 0;
  if (!as_recorded && !(o.rate > 0 && std::isfinite(o.rate)))
    throw Error(ErrorKind::kInvalidArgument, "--rate",
                std::to_string(o.rate) + " must be positive and finite");
  const std::string at_rate = as_recorded ? "its recorded arrival times" : fmt_s(o.rate) + " req/s";
  auto requests_at = [&](double rate) {
    if (!trace.empty()) return as_recorded ? trace : fs::scale_arrivals(trace, trace_rate / rate);
    fs::WorkloadSpec s = spec;
    s.rate = rate;
    return fs::generate_workload(s);
  };

  std::vector<fs::Policy> policies;
  if (o.compare)
    policies = fs::all_policies();
  else
    policies = {fs::parse_policy(o.policy)};
  // The baselines never chunk, so one step must hold a whole prompt (vLLM's default is the same).
  const int64_t baseline_tokens = std::max(o.budget, o.max_model_len);
  std::vector<fs::SimConfig> configs;
  for (fs::Policy p : policies) {
    fs::SimConfig c;
    c.scheduler.policy = p;
    c.scheduler.max_tokens_per_step = p == fs::Policy::kSarathi ? o.budget : baseline_tokens;
    c.scheduler.max_running = o.max_running;
    c.scheduler.max_model_len = o.max_model_len;
    c.scheduler.chunk_tile = o.chunk_tile;
    c.num_blocks = num_blocks;
    c.block_size = o.block_size;
    c.watermark = o.watermark;
    // Built once here so that a bad limit fails, naming its field, before anything is printed.
    fs::BlockManager blocks(c.num_blocks, c.block_size, c.watermark);
    fs::Scheduler::create(c.scheduler, blocks);
    configs.push_back(c);
  }
  auto sim_at = [&](size_t i, double rate) {
    return fs::simulate(requests_at(rate), configs[i], *cost);
  };

  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<fs::Request> base = requests_at(o.rate);
  int64_t ptok = 0, otok = 0;
  const std::string source = o.trace.empty() ? "workload" : o.trace;
  for (const auto& r : base) {
    ptok = flashserve::checked_add(ptok, r.prompt_tokens, source);
    otok = flashserve::checked_add(otok, r.output_tokens, source);
    if (flashserve::saturating_add(r.prompt_tokens, r.output_tokens) > o.max_model_len)
      throw Error(ErrorKind::kInvalidArgument, source,
                  "request " + std::to_string(r.id) + ": prompt " +
                      std::to_string(r.prompt_tokens) + " + output " +
                      std::to_string(r.output_tokens) + " tokens exceeds --max-model-len " +
                      std::to_string(o.max_model_len));
  }
  std::printf("cost model: %s\n", cost->describe().c_str());
  std::printf(
      "workload: %s, %zu requests, mean prompt %.0f, mean output %.0f tokens, %s arrivals%s\n",
      o.trace.empty() ? o.workload.c_str() : o.trace.c_str(), base.size(),
      static_cast<double>(ptok) / base.size(), static_cast<double>(otok) / base.size(),
      o.trace.empty() ? o.arrival.c_str() : "trace",
      o.trace.empty() ? (", seed " + std::to_string(o.seed)).c_str() : "");
  std::printf(
      "limits: sarathi budget %lld tokens/step (chunk tile %lld), baselines %lld tokens/step, "
      "max running %lld, max model len %lld, KV cache %lld blocks x %d tokens\n",
      static_cast<long long>(o.budget), static_cast<long long>(o.chunk_tile),
      static_cast<long long>(baseline_tokens), static_cast<long long>(o.max_running),
      static_cast<long long>(o.max_model_len), static_cast<long long>(num_blocks), o.block_size);

  // Capacity first, so that the plot's sweep can span it.
  fs::CapacityCriteria crit{o.slo_tbt, o.max_sched_delay};
  std::vector<double> capacity(policies.size(), -1);
  std::vector<bool> capacity_at_limit(policies.size(), false);
  if (o.capacity) {
    for (size_t i = 0; i < policies.size(); ++i) {
      auto res =
          fs::find_capacity([&](double rate) { return sim_at(i, rate).metrics; }, crit, o.rate);
      capacity[i] = res.capacity;
      capacity_at_limit[i] = res.at_limit;
      if (o.verbose) {
        std::printf("capacity search, %s:", fs::to_string(policies[i]));
        for (const auto& p : res.probes) std::printf(" %.3f%s", p.rate, p.ok ? "+" : "-");
        std::printf("  -> %s%.3f req/s\n", res.at_limit ? ">= " : "", res.capacity);
      }
    }
  }

  std::printf("\nat %s (P99 TBT SLO %.0f ms, P50 scheduling delay bound %.1f s):\n",
              at_rate.c_str(), o.slo_tbt * 1e3, o.max_sched_delay);
  std::printf(
      "| policy | TTFT p50 (s) | TTFT p99 (s) | TBT p50 (ms) | TBT p99 (ms) | TPOT mean (ms) | "
      "E2E p50 (s) | sched delay p50 (s) | out tok/s | preemptions | steps |%s\n",
      o.capacity ? " capacity (req/s) |" : "");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|%s\n", o.capacity ? "---|" : "");
  fs::SvgPlot cdf;
  cdf.title =
      model.name + ", " + (o.trace.empty() ? o.workload : "trace") + ", " + at_rate + ": TBT CDF";
  cdf.x_label = "time between tokens (ms, log scale)";
  cdf.y_label = "fraction of gaps";
  cdf.log_x = true;
  std::vector<fs::ServingMetrics> all;
  for (size_t i = 0; i < policies.size(); ++i) {
    const fs::SimResult r = fs::simulate(base, configs[i], *cost);
    const auto& m = r.metrics;
    all.push_back(m);
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %.0f | %lld | %lld |",
                fs::to_string(policies[i]), fmt_s(m.ttft.p50).c_str(), fmt_s(m.ttft.p99).c_str(),
                fmt_ms(m.tbt.p50).c_str(), fmt_ms(m.tbt.p99).c_str(), fmt_ms(m.tpot.mean).c_str(),
                fmt_s(m.e2e.p50).c_str(), fmt_s(m.sched_delay.p50).c_str(), m.token_throughput,
                static_cast<long long>(m.preemptions), static_cast<long long>(r.steps));
    // At the search's upper limit the SLO was never missed: the capacity is a lower bound.
    if (o.capacity) std::printf(" %s%.3f |", capacity_at_limit[i] ? ">= " : "", capacity[i]);
    std::printf("\n");
    if (!o.plot.empty() && !m.tbt_samples.empty()) {
      std::vector<double> v = m.tbt_samples;
      std::sort(v.begin(), v.end());
      fs::SvgSeries s{fs::to_string(policies[i]), {}, {}};
      const size_t n = v.size(), pts = std::min<size_t>(n, 400);
      for (size_t k = 0; k < pts; ++k) {
        const size_t idx = (pts == 1) ? n - 1 : k * (n - 1) / (pts - 1);
        s.x.push_back(v[idx] * 1e3);
        s.y.push_back(static_cast<double>(idx + 1) / static_cast<double>(n));
      }
      cdf.series.push_back(std::move(s));
    }
  }
  if (o.verbose) {
    // Every latency metric in full, seconds.
    std::printf("\n| metric (s) | policy | mean | p50 | p90 | p99 |\n|---|---|---|---|---|---|\n");
    const std::pair<const char*, fs::Summary fs::ServingMetrics::*> rows[] = {
        {"TTFT", &fs::ServingMetrics::ttft},
        {"TBT", &fs::ServingMetrics::tbt},
        {"TPOT", &fs::ServingMetrics::tpot},
        {"E2E", &fs::ServingMetrics::e2e},
        {"sched delay", &fs::ServingMetrics::sched_delay}};
    for (const auto& [name, field] : rows)
      for (size_t i = 0; i < policies.size(); ++i) {
        const fs::Summary& x = all[i].*field;
        std::printf("| %s | %s | %.4f | %.4f | %.4f | %.4f |\n", name, fs::to_string(policies[i]),
                    x.mean, x.p50, x.p90, x.p99);
      }
    for (size_t i = 0; i < policies.size(); ++i)
      std::printf("%s: %.3f req/s, %.0f output tok/s over %.1f s\n", fs::to_string(policies[i]),
                  all[i].request_throughput, all[i].token_throughput, all[i].duration_s);
  }
  if (!o.plot.empty()) {
    const std::string path = o.plot + "-tbt-cdf.svg";
    cdf.write(path);
    std::printf("\nplot: %s\n", path.c_str());
  }

  if (o.plot.size() && o.capacity) {
    // P99 TBT against the rate, around the largest capacity found.
    const double top = std::max(*std::max_element(capacity.begin(), capacity.end()), o.rate);
    fs::SvgPlot sweep;
    sweep.title =
        model.name + ", " + (o.trace.empty() ? o.workload : "trace") + ": P99 TBT vs request rate";
    sweep.x_label = "request rate (req/s)";
    sweep.y_label = "P99 TBT (ms)";
    sweep.y_max = o.slo_tbt * 1e3 * 4;
    sweep.ref_lines.push_back({o.slo_tbt * 1e3, "SLO " + fmt_ms(o.slo_tbt) + " ms"});
    fs::SvgPlot delay = sweep;
    delay.title = model.name + ", " + (o.trace.empty() ? o.workload : "trace") +
                  ": P50 scheduling delay vs request rate";
    delay.y_label = "P50 scheduling delay (s)";
    delay.y_max = o.max_sched_delay * 4;
    delay.ref_lines = {{o.max_sched_delay, "bound " + fmt_s(o.max_sched_delay) + " s"}};
    constexpr int kPoints = 12;
    for (size_t i = 0; i < policies.size(); ++i) {
      fs::SvgSeries s{fs::to_string(policies[i]), {}, {}, true}, d = s;
      for (int k = 1; k <= kPoints; ++k) {
        const double rate = top * 1.5 * k / kPoints;
        const fs::ServingMetrics m = sim_at(i, rate).metrics;
        s.x.push_back(rate);
        s.y.push_back(m.tbt.p99 * 1e3);
        d.x.push_back(rate);
        d.y.push_back(m.sched_delay.p50);
      }
      sweep.series.push_back(std::move(s));
      delay.series.push_back(std::move(d));
    }
    for (const auto& [plot, suffix] : {std::pair{&sweep, "-p99-tbt-vs-rate.svg"},
                                       std::pair{&delay, "-sched-delay-vs-rate.svg"}}) {
      const std::string path = o.plot + suffix;
      plot->write(path);
      std::printf("plot: %s (values above %g drawn on the top edge)\n", path.c_str(), plot->y_max);
    }
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
