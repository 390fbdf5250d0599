// The scheduler options simulate and bench-serve share, declared once: --policy / --compare,
// --budget, --chunk-tile, --max-running, --orca-batch, --max-model-len, with their refusals
// (--policy with --compare, --chunk-tile without sarathi, --orca-batch without orca, --budget and
// --max-running with orca alone: its fixed batch takes whole prompts).
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
  int64_t budget = 512, chunk_tile = 64, max_running = 256, orca_batch = 16, max_model_len = 0;
  CLI::Option *policy_opt = nullptr, *chunk_tile_opt = nullptr, *orca_batch_opt = nullptr;
  CLI::Option *max_model_len_opt = nullptr, *budget_opt = nullptr, *max_running_opt = nullptr;

  // Throws UsageError for an option given where it does not apply.
  void refuse_inapplicable() const;
  // The policies to run: `compare_set` with --compare, else --policy.
  std::vector<serve::Policy> selected(const std::vector<serve::Policy>& compare_set) const;
  // The configuration of one policy: sarathi's budget (vllm and static get `baseline_tokens` if
  // given, > 0), orca's fixed batch as max_running.
  serve::SchedulerConfig config_for(serve::Policy p, int64_t baseline_tokens = 0) const;
};

// Declares the options into `flags`. `policies`: the policies --compare runs, for the help
// ("sarathi, vllm or orca"); `max_model_len_help`: what --max-model-len 0 means for this command.
void add_scheduler_options(CLI::App& app, SchedulerFlags& flags, const std::string& policies,
                           const std::string& max_model_len_help);

}  // namespace flashserve::cli
