// The scheduler options simulate and bench-serve share, declared once: --policy / --compare,
// --budget, --chunk-tile, --max-running, --long-prefill-threshold, --max-model-len, with their
// refusals (--policy with --compare, --chunk-tile without sarathi, --long-prefill-threshold
// without vllm-v1, --budget with orca or static alone: they have no token budget; --budget auto
// with a policy other than sarathi). What a policy
// gets when an option is not given is its own default (serve/policy.h: sarathi's budget 512,
// vllm-v1's 8192, ...), so --compare runs each at its own defaults.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "serve/scheduler.h"

namespace flashserve::cli {

struct SchedulerFlags {
  std::string policy = "sarathi";
  bool compare = false;
  int64_t budget = 0, chunk_tile = 64, max_running = 0, long_prefill_threshold = 0;
  bool budget_auto = false;  // --budget auto (sarathi's budget from the SLO)
  int64_t max_model_len = 0;
  // Valid only while the CLI::App that add_scheduler_options filled lives (parse time).
  CLI::Option *policy_opt = nullptr, *chunk_tile_opt = nullptr, *long_prefill_opt = nullptr;
  CLI::Option *max_model_len_opt = nullptr, *budget_opt = nullptr, *max_running_opt = nullptr;
  // What refuse_inapplicable read off the options, for use after the App is gone (ASan found
  // budget_for reading a destroyed Option).
  bool budget_given = false, max_running_given = false;

  // Right after parsing: throws UsageError for an option given where it does not apply, or an
  // unknown --policy; notes which options were given, and drops the Option pointers.
  void refuse_inapplicable();
  // The policies to run: `compare_set` with --compare, else --policy.
  std::vector<serve::Policy> selected(const std::vector<serve::Policy>& compare_set) const;
  // The token budget `p` runs with: --budget if given, else the policy's default.
  int64_t budget_for(serve::Policy p) const;
  // Whether `p` runs with --budget auto (sarathi only; under --compare the others keep their own).
  bool auto_budget(serve::Policy p) const;
  // The configuration of one policy: --budget and --max-running where given, else the policy's
  // defaults; vllm-v0 gets `baseline_tokens` (> 0: at least max_model_len, as it never chunks)
  // if given.
  serve::SchedulerConfig config_for(serve::Policy p, int64_t baseline_tokens = 0) const;
};

// Declares the options into `flags`. `policies`: the policies --compare runs, for the help
// ("sarathi, vllm-v1, vllm-v0 or orca"); `max_model_len_help`: what --max-model-len 0 means for
// this command.
void add_scheduler_options(CLI::App& app, SchedulerFlags& flags, const std::string& policies,
                           const std::string& max_model_len_help);

// "sarathi budget 512 tokens/step (chunk tile 64), max running 256": one line of a run's setup
// ("budget auto" for a sarathi run under --budget auto).
std::string describe_limits(const serve::SchedulerConfig& c, bool budget_auto = false);

}  // namespace flashserve::cli
