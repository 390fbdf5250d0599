// The capacity options simulate and bench-serve share, declared once: --capacity, --slo-tbt (a
// list: seconds, or Sarathi-Serve's strict / relaxed scaled from the cost model's decode step,
// serve/tbt_slo.h), --max-sched-delay and --min-requests (the floor of a capacity probe's
// requests, serve/capacity.h), with their refusals.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "serve/capacity.h"
#include "serve/cost_model.h"
#include "serve/tbt_slo.h"

namespace flashserve::cli {

struct CapacityFlags {
  bool capacity = false;
  std::string slo_text = "0.1";
  double max_sched_delay = 2;
  int64_t min_requests = serve::kMinCapacityRequests;
  std::vector<serve::TbtSloSpec> slo_specs;  // --slo-tbt parsed (check())
  // Valid only while the CLI::App that add() filled lives (parse time).
  CLI::Option *slo_opt = nullptr, *delay_opt = nullptr, *min_requests_opt = nullptr;

  void add(CLI::App& app, const std::string& capacity_help);
  // Right after parsing: parses --slo-tbt (a UsageError naming it), refuses --min-requests
  // without --capacity, and --slo-tbt / --max-sched-delay where `slo_applies` / `delay_applies`
  // are false (`why`: what they apply to). Drops the Option pointers.
  void check(bool slo_applies, bool delay_applies, const std::string& why);
  // --capacity: refuses (a UsageError naming --requests) a probe of fewer than --min-requests.
  void check_requests(int64_t requests) const;
  // The SLOs, named ones from `cost`'s reference decode step on this pool.
  std::vector<serve::TbtSlo> slos(const serve::CostModel& cost, int64_t max_model_len,
                                  int64_t pool_tokens) const;
  serve::CapacityCriteria criteria(const serve::TbtSlo& slo) const {
    return {slo.seconds, max_sched_delay};
  }
};

}  // namespace flashserve::cli
