// What simulate and bench-serve print and draw for a serving run, written once: the Markdown
// table of latency metrics per policy, the TBT distribution (CDF) and TBT over time as SVG series,
// and where the workloads named on the command line come from.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "serve/metrics.h"
#include "serve/sequence.h"
#include "serve/svg_plot.h"
#include "serve/workload.h"

namespace flashserve::cli {

std::string fmt_s(double seconds);   // "1.234"
std::string fmt_ms(double seconds);  // "12.3"

// The table's header and one row.
void print_metrics_header();
void print_metrics_row(const std::string& policy, const serve::ServingMetrics& m, int64_t steps);
// Every latency metric in full (mean / p50 / p90 / p99, seconds), one row per metric and policy.
void print_metrics_detail(const std::vector<std::string>& policies,
                          const std::vector<serve::ServingMetrics>& all);

// The simulator's prediction beside a measurement, one row per metric (P50/P99 TTFT and TBT,
// mean TPOT, P50 E2E, P50 scheduling delay, output tokens/s) with the relative difference
// (predicted - measured) / measured. Prints the header when `header`.
void print_prediction_rows(const std::string& policy, const serve::ServingMetrics& measured,
                           const serve::ServingMetrics& predicted, bool header);

// The mean over runs (seeds) of every summary figure, throughput and preemption count; the TBT
// samples are pooled (for a CDF of all of them).
serve::ServingMetrics mean_metrics(const std::vector<serve::ServingMetrics>& runs);

// The CDF of every TBT gap (at most 400 points).
serve::SvgSeries tbt_cdf_series(const std::string& name, const serve::ServingMetrics& m);
// Every gap between tokens against the time it ended (seconds since `t0`): stalls are spikes.
serve::SvgSeries tbt_over_time_series(const std::string& name,
                                      const std::vector<std::unique_ptr<serve::Sequence>>& done,
                                      double t0);

// A --workload name: chat, summarize, fixed (the fitted and fixed lengths), sharegpt and arxiv
// (the real length traces of data/workloads/, rows sampled with the seed), or a CSV path: a
// length table (header num_prefill_tokens,num_decode_tokens) or an arrival trace
// (arrival_s,prompt_tokens,output_tokens).
struct WorkloadSource {
  std::string label;
  serve::WorkloadSpec spec;           // generated workloads
  std::vector<serve::Request> trace;  // an arrival trace
  double trace_rate = 0;              // its own mean rate; 0: all at once (runs as recorded)

  // `is_file`: `name` is a path whatever it looks like (simulate's --trace).
  static WorkloadSource resolve(const std::string& name, const serve::WorkloadSpec& spec,
                                bool is_file = false);
  bool is_trace() const { return !trace.empty(); }
  bool as_recorded() const { return is_trace() && trace_rate == 0; }
  // The requests at `rate` (a trace's arrivals scaled to it).
  std::vector<serve::Request> at(double rate) const;
};

// The workload options simulate and bench-serve share: --workload, --prompt-len, --output-len,
// --arrival, --cv, with their refusals (cv only for gamma, lengths only for fixed).
struct WorkloadFlags {
  std::string workload = "chat", arrival = "poisson";
  int64_t prompt_len = 512, output_len = 128;
  double cv = 1;
  CLI::Option *workload_opt = nullptr, *arrival_opt = nullptr, *cv_opt = nullptr;
  CLI::Option *prompt_opt = nullptr, *output_opt = nullptr;
  // --seeds 0,1,2: the workload drawn with each seed in turn, reported per seed and as the mean.
  std::string seeds_text;
  CLI::Option* seeds_opt = nullptr;

  void add(CLI::App& app);
  // The seeds to run: --seeds parsed (each a whole number, no repeats), else {single}. Safe
  // after the CLI::App is gone (reads seeds_text only).
  std::vector<uint64_t> seeds(uint64_t single) const;
  // `traced`: the requests come from an arrival trace instead (simulate's --trace).
  void refuse_inapplicable(bool traced) const;
  // A spec with these lengths and arrivals (the caller sets the rest).
  serve::WorkloadSpec spec() const;
};

// flashserve's data folder (the length traces of workloads/): $FLASHSERVE_DATA_DIR when set (an
// error if it is not a directory), else <prefix>/share/flashserve beside an installed executable,
// else the data/ of the source tree a build-tree executable was built from. Throws naming the
// folders it looked in when there is none.
std::string data_dir();
// The path of a file under data_dir().
std::string data_path(const std::string& relative);

}  // namespace flashserve::cli
