#include "cli/serving_report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "cli/options.h"

namespace flashserve::cli {

namespace fs = flashserve::serve;

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

void print_metrics_header() {
  std::printf(
      "| policy | TTFT p50 (s) | TTFT p99 (s) | TBT p50 (ms) | TBT p99 (ms) | TPOT mean (ms) | "
      "E2E p50 (s) | E2E p99 (s) | sched delay p50 (s) | out tok/s | preemptions | steps |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

void print_metrics_row(const std::string& policy, const fs::ServingMetrics& m, int64_t steps) {
  std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f | %lld | %lld |", policy.c_str(),
              fmt_s(m.ttft.p50).c_str(), fmt_s(m.ttft.p99).c_str(), fmt_ms(m.tbt.p50).c_str(),
              fmt_ms(m.tbt.p99).c_str(), fmt_ms(m.tpot.mean).c_str(), fmt_s(m.e2e.p50).c_str(),
              fmt_s(m.e2e.p99).c_str(), fmt_s(m.sched_delay.p50).c_str(), m.token_throughput,
              static_cast<long long>(m.preemptions), static_cast<long long>(steps));
  std::printf("\n");
}

void print_metrics_detail(const std::vector<std::string>& policies,
                          const std::vector<fs::ServingMetrics>& all) {
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
      std::printf("| %s | %s | %.4f | %.4f | %.4f | %.4f |\n", name, policies[i].c_str(), x.mean,
                  x.p50, x.p90, x.p99);
    }
  for (size_t i = 0; i < policies.size(); ++i)
    std::printf("%s: %.3f req/s, %.0f output tok/s over %.1f s\n", policies[i].c_str(),
                all[i].request_throughput, all[i].token_throughput, all[i].duration_s);
}

void print_prediction_rows(const std::string& policy, const fs::ServingMetrics& meas,
                           const fs::ServingMetrics& pred, bool header) {
  if (header)
    std::printf(
        "| policy | metric | measured | predicted | (pred - meas) / meas |\n"
        "|---|---|---|---|---|\n");
  struct Row {
    const char* name;
    double m, p;
  };
  const Row rows[] = {
      {"TTFT p50 (s)", meas.ttft.p50, pred.ttft.p50},
      {"TTFT p99 (s)", meas.ttft.p99, pred.ttft.p99},
      {"TBT p50 (ms)", meas.tbt.p50 * 1e3, pred.tbt.p50 * 1e3},
      {"TBT p99 (ms)", meas.tbt.p99 * 1e3, pred.tbt.p99 * 1e3},
      {"TPOT mean (ms)", meas.tpot.mean * 1e3, pred.tpot.mean * 1e3},
      {"E2E p50 (s)", meas.e2e.p50, pred.e2e.p50},
      {"sched delay p50 (s)", meas.sched_delay.p50, pred.sched_delay.p50},
      {"out tok/s", meas.token_throughput, pred.token_throughput},
  };
  for (const Row& r : rows) {
    char rel[32] = "n/a";
    if (r.m > 0) std::snprintf(rel, sizeof rel, "%+.1f%%", 100 * (r.p - r.m) / r.m);
    std::printf("| %s | %s | %.4g | %.4g | %s |\n", policy.c_str(), r.name, r.m, r.p, rel);
  }
}

fs::ServingMetrics mean_metrics(const std::vector<fs::ServingMetrics>& runs) {
  fs::ServingMetrics m;
  if (runs.empty()) return m;
  const double n = static_cast<double>(runs.size());
  double preemptions = 0;
  for (const fs::ServingMetrics& r : runs) {
    m.num_requests += r.num_requests;
    m.output_tokens += r.output_tokens;
    preemptions += static_cast<double>(r.preemptions) / n;
    m.duration_s += r.duration_s / n;
    m.request_throughput += r.request_throughput / n;
    m.token_throughput += r.token_throughput / n;
    for (auto field :
         {&fs::ServingMetrics::ttft, &fs::ServingMetrics::tbt, &fs::ServingMetrics::tpot,
          &fs::ServingMetrics::e2e, &fs::ServingMetrics::sched_delay}) {
      const fs::Summary& x = r.*field;
      fs::Summary& y = m.*field;
      y.count += x.count;
      y.mean += x.mean / n, y.p50 += x.p50 / n, y.p90 += x.p90 / n, y.p99 += x.p99 / n;
      y.max = std::max(y.max, x.max);
    }
    m.tbt_samples.insert(m.tbt_samples.end(), r.tbt_samples.begin(), r.tbt_samples.end());
  }
  m.preemptions = static_cast<int64_t>(std::llround(preemptions));
  return m;
}

fs::SvgSeries tbt_cdf_series(const std::string& name, const fs::ServingMetrics& m) {
  std::vector<double> v = m.tbt_samples;
  std::sort(v.begin(), v.end());
  fs::SvgSeries s{name, {}, {}};
  const size_t n = v.size(), pts = std::min<size_t>(n, 400);
  for (size_t k = 0; k < pts; ++k) {
    const size_t idx = (pts == 1) ? n - 1 : k * (n - 1) / (pts - 1);
    s.x.push_back(v[idx] * 1e3);
    s.y.push_back(static_cast<double>(idx + 1) / static_cast<double>(n));
  }
  return s;
}

fs::SvgSeries tbt_over_time_series(const std::string& name,
                                   const std::vector<std::unique_ptr<fs::Sequence>>& done,
                                   double t0) {
  std::vector<std::pair<double, double>> gaps;
  for (const auto& s : done)
    for (size_t i = 1; i < s->token_times.size(); ++i)
      gaps.emplace_back(s->token_times[i] - t0, s->token_times[i] - s->token_times[i - 1]);
  std::sort(gaps.begin(), gaps.end());
  fs::SvgSeries out{name, {}, {}, false};
  for (const auto& [t, g] : gaps) {
    out.x.push_back(t);
    out.y.push_back(g * 1e3);
  }
  return out;
}

void WorkloadFlags::add(CLI::App& app) {
  constexpr int64_t kMaxTokens = int64_t{1} << 24;
  workload_opt = app.add_option("--workload", workload,
                                "chat, summarize, fixed, sharegpt, arxiv (real length traces) or a "
                                "CSV (length table num_prefill_tokens,num_decode_tokens)")
                     ->default_str(workload);
  prompt_opt =
      add_int(app, "--prompt-len", prompt_len, {1, kMaxTokens}, "fixed workload: prompt tokens");
  output_opt =
      add_int(app, "--output-len", output_len, {1, kMaxTokens}, "fixed workload: output tokens");
  arrival_opt = app.add_option("--arrival", arrival, "poisson or gamma")->default_str(arrival);
  cv_opt = add_real(app, "--cv", cv, {fs::kMinGammaCv, fs::kMaxGammaCv},
                    "gamma arrivals: coefficient of variation of the gaps");
  seeds_opt = app.add_option("--seeds", seeds_text,
                             "comma-separated workload seeds (e.g. 0,1,2): each in turn, reported "
                             "per seed and as the mean (instead of --seed)");
}

std::vector<uint64_t> WorkloadFlags::seeds(uint64_t single) const {
  // From the text, not the option: simulate's CLI::App (and its options) is gone by now.
  if (seeds_text.empty()) return {single};
  std::vector<uint64_t> out;
  size_t at = 0;
  while (at <= seeds_text.size()) {
    const size_t comma = std::min(seeds_text.find(',', at), seeds_text.size());
    const uint64_t s =
        parse_uint("--seeds", std::string_view(seeds_text).substr(at, comma - at), {0, UINT64_MAX});
    if (std::find(out.begin(), out.end(), s) != out.end())
      throw UsageError("--seeds", "seed " + std::to_string(s) + " is given twice");
    out.push_back(s);
    at = comma + 1;
  }
  if (out.size() > 64) throw UsageError("--seeds", "at most 64 seeds");
  return out;
}

void WorkloadFlags::refuse_inapplicable(bool traced) const {
  refuse_unless(seeds_opt, !traced, "--trace gives the requests; there is no seed to vary");
  refuse_unless(cv_opt, !traced && arrival == "gamma", "only applies to --arrival gamma");
  for (auto* opt : {prompt_opt, output_opt})
    refuse_unless(opt, !traced && workload == "fixed", "only applies to --workload fixed");
}

fs::WorkloadSpec WorkloadFlags::spec() const {
  fs::WorkloadSpec s;
  s.fixed_prompt = prompt_len;
  s.fixed_output = output_len;
  s.arrival = fs::parse_arrival_kind(arrival);
  s.cv = cv;
  return s;
}

std::string data_dir() {
  namespace stdfs = std::filesystem;
  if (const char* env = std::getenv("FLASHSERVE_DATA_DIR"); env && *env) {
    if (!stdfs::is_directory(env))
      throw std::runtime_error(std::string("FLASHSERVE_DATA_DIR='") + env +
                               "' is not a directory (it names flashserve's data folder, the one "
                               "holding workloads/)");
    return env;
  }
  // An installed executable: <prefix>/bin/flashserve finds <prefix>/share/flashserve, wherever the
  // prefix now is (the path is relative to the executable's own, not the prefix it was built for).
  std::string tried;
  std::error_code ec;
  const stdfs::path exe = stdfs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const stdfs::path installed =
        (exe.parent_path() / FLASHSERVE_INSTALLED_DATA_FROM_BIN).lexically_normal();
    if (stdfs::is_directory(installed)) return installed.string();
    tried = "'" + installed.string() + "' (the share/flashserve of an installed executable) and ";
  }
  // A build-tree executable: the data/ of the source tree it was built from.
  if (stdfs::is_directory(FLASHSERVE_SOURCE_DATA_DIR)) return FLASHSERVE_SOURCE_DATA_DIR;
  throw std::runtime_error("cannot find flashserve's data folder (workloads/): looked in " + tried +
                           "'" FLASHSERVE_SOURCE_DATA_DIR
                           "' (the source tree it was built from); "
                           "set FLASHSERVE_DATA_DIR to it");
}

std::string data_path(const std::string& relative) {
  return data_dir() + "/" + relative;
}

WorkloadSource WorkloadSource::resolve(const std::string& name, const fs::WorkloadSpec& spec,
                                       bool is_file) {
  WorkloadSource w;
  w.label = name;
  w.spec = spec;
  std::string table;
  if (name == "sharegpt")
    table = data_path("workloads/sharegpt-8k-llama2-tokens.csv");
  else if (name == "arxiv")
    table = data_path("workloads/arxiv-summarization-llama2-tokens.csv");
  else if (is_file || (name.size() > 4 && name.substr(name.size() - 4) == ".csv"))
    table = name;
  if (table.empty()) {
    w.spec.lengths = fs::parse_length_kind(name);
    return w;
  }
  if (fs::is_length_table(table)) {
    w.spec.lengths = fs::LengthKind::kTable;
    w.spec.table = std::make_shared<const fs::LengthTable>(fs::load_length_table(table));
    return w;
  }
  w.trace = fs::load_trace(table);
  w.trace_rate = fs::mean_rate(w.trace);
  return w;
}

std::vector<fs::Request> WorkloadSource::at(double rate) const {
  if (is_trace()) return as_recorded() ? trace : fs::scale_arrivals(trace, trace_rate / rate);
  fs::WorkloadSpec s = spec;
  s.rate = rate;
  return fs::generate_workload(s);
}

}  // namespace flashserve::cli
