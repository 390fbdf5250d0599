#include "cli/capacity_flags.h"

#include "cli/options.h"

namespace flashserve::cli {

namespace fs = flashserve::serve;

void CapacityFlags::add(CLI::App& app, const std::string& capacity_help) {
  app.add_flag("--capacity", capacity, capacity_help);
  slo_opt = app.add_option(
      "--slo-tbt", slo_text,
      "P99 TBT SLO: seconds, or strict / relaxed (Sarathi-Serve's: 5x / 25x the cost model's "
      "decode step of 32 requests at 4k context), comma-separated for several "
      "(strict,relaxed,0.1,0.5)");
  slo_opt->default_str(slo_text);
  delay_opt = add_real(app, "--max-sched-delay", max_sched_delay, {0, 1e6, Open::kLow},
                       "capacity: P50 scheduling delay bound (s)");
  min_requests_opt = add_int(app, "--min-requests", min_requests, {1, int64_t{1} << 40},
                             "capacity: the fewest requests a probe may have");
}

void CapacityFlags::check(bool slo_applies, bool delay_applies, const std::string& why) {
  refuse_unless(slo_opt, slo_applies, why);
  refuse_unless(delay_opt, delay_applies, why);
  refuse_unless(min_requests_opt, capacity, "applies to --capacity");
  slo_specs = check_option("--slo-tbt", [&] { return fs::parse_tbt_slos(slo_text); });
  slo_opt = delay_opt = min_requests_opt = nullptr;
}

void CapacityFlags::check_requests(int64_t requests) const {
  check_option("--requests", [&] {
    fs::check_capacity_requests(requests, min_requests);
    return 0;
  });
}

std::vector<fs::TbtSlo> CapacityFlags::slos(const fs::CostModel& cost, int64_t max_model_len,
                                            int64_t pool_tokens) const {
  return fs::resolve_tbt_slos(slo_specs, cost, max_model_len, pool_tokens);
}

}  // namespace flashserve::cli
