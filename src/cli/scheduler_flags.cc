#include "cli/scheduler_flags.h"

#include "cli/options.h"

namespace flashserve::cli {

namespace fs = flashserve::serve;

void add_scheduler_options(CLI::App& app, SchedulerFlags& f, const std::string& policies,
                           const std::string& max_model_len_help) {
  // Ranges: what the models can mean, and what keeps every product of them (tokens x blocks,
  // requests x lengths) far inside int64.
  constexpr int64_t kMaxTokens = int64_t{1} << 24;
  f.policy_opt = app.add_option("--policy", f.policy, fs::policy_names())->default_str(f.policy);
  app.add_flag("--compare", f.compare, "run every policy (" + policies + ") side by side");
  f.budget_opt = app.add_option_function<std::string>(
      "--budget",
      [&f](const std::string& text) {
        f.budget_auto = text == "auto";
        if (!f.budget_auto) f.budget = parse_int("--budget", text, {1, kMaxTokens});
      },
      "token budget per step of the chunking policies (default: sarathi " +
          std::to_string(fs::policy_defaults(fs::Policy::kSarathi).max_tokens_per_step) +
          ", vllm-v1 " +
          std::to_string(fs::policy_defaults(fs::Policy::kVllmV1).max_tokens_per_step) +
          "); vllm-v0's prompt cap, raised to max_model_len; auto: sarathi's chosen from the cost "
          "model and --slo-tbt, then adjusted from the step times (serve/auto_budget.h)");
  f.budget_opt->type_name("INT in [1, " + std::to_string(kMaxTokens) + "] or auto");
  f.chunk_tile_opt = add_int(app, "--chunk-tile", f.chunk_tile, {1, kMaxTokens},
                             "sarathi: non-final chunks are a multiple of this");
  f.max_running_opt = add_int(app, "--max-running", f.max_running, {1, 1 << 20},
                              "requests running at once, vLLM's max_num_seqs (default: the "
                              "policy's; sarathi 256, vllm-v1 1024, vllm-v0 256, orca and static "
                              "128)");
  f.long_prefill_opt =
      add_int(app, "--long-prefill-threshold", f.long_prefill_threshold, {0, kMaxTokens},
              "vllm-v1: most prompt tokens of one request per step (vLLM's "
              "long_prefill_token_threshold; 0: no cap, vLLM's default)");
  f.max_model_len_opt = add_int(app, "--max-model-len", f.max_model_len, {0, kMaxTokens},
                                "prompt + output limit (0: " + max_model_len_help + ")");
}

void SchedulerFlags::refuse_inapplicable() {
  refuse_unless(policy_opt, !compare, "--compare runs every policy; drop --policy");
  const fs::Policy p = check_option("--policy", [&] { return fs::parse_policy(policy); });
  refuse_unless(chunk_tile_opt, compare || p == fs::Policy::kSarathi,
                "only sarathi chunks prompts to a tile (--policy sarathi or --compare)");
  refuse_unless(long_prefill_opt, compare || p == fs::Policy::kVllmV1,
                "only vllm-v1 has a long-prefill threshold (--policy vllm-v1 or --compare)");
  // Orca and static take whole prompts with no cap on a step's tokens.
  refuse_unless(budget_opt, compare || (p != fs::Policy::kOrca && p != fs::Policy::kStatic),
                std::string(fs::to_string(p)) + " takes whole prompts and has no token budget");
  if (budget_auto && !compare && p != fs::Policy::kSarathi)
    throw UsageError(
        "--budget",
        std::string("auto: only sarathi chooses its budget from the SLO, not ") + fs::to_string(p));
  budget_given = budget_opt != nullptr && budget_opt->count() > 0;
  max_running_given = max_running_opt != nullptr && max_running_opt->count() > 0;
  policy_opt = chunk_tile_opt = long_prefill_opt = nullptr;
  max_model_len_opt = budget_opt = max_running_opt = nullptr;
}

std::vector<fs::Policy> SchedulerFlags::selected(const std::vector<fs::Policy>& compare_set) const {
  return compare ? compare_set : std::vector<fs::Policy>{fs::parse_policy(policy)};
}

int64_t SchedulerFlags::budget_for(fs::Policy p) const {
  // Under auto the default stands until the engine's AutoBudget replaces it before the first step.
  return budget_given && !budget_auto ? budget : fs::policy_defaults(p).max_tokens_per_step;
}

bool SchedulerFlags::auto_budget(fs::Policy p) const {
  return budget_auto && p == fs::Policy::kSarathi;
}

fs::SchedulerConfig SchedulerFlags::config_for(fs::Policy p, int64_t baseline_tokens) const {
  fs::SchedulerConfig sc;
  sc.policy = p;
  sc.max_tokens_per_step =
      p == fs::Policy::kVllmV0 && baseline_tokens > 0 ? baseline_tokens : budget_for(p);
  sc.max_running = max_running_given ? max_running : fs::policy_defaults(p).max_running;
  sc.max_model_len = max_model_len;
  sc.chunk_tile = chunk_tile;
  if (p == fs::Policy::kVllmV1) sc.long_prefill_token_threshold = long_prefill_threshold;
  return sc;
}

std::string describe_limits(const fs::SchedulerConfig& c, bool budget_auto) {
  std::string s = fs::to_string(c.policy);
  switch (c.policy) {
    case fs::Policy::kSarathi:
      s += " budget " +
           (budget_auto ? std::string("auto") : std::to_string(c.max_tokens_per_step)) +
           " tokens/step (chunk tile " + std::to_string(c.chunk_tile) + ")";
      break;
    case fs::Policy::kVllmV1:
      s += " budget " + std::to_string(c.max_tokens_per_step) + " tokens/step (long prefill " +
           (c.long_prefill_token_threshold > 0
                ? "threshold " + std::to_string(c.long_prefill_token_threshold)
                : std::string("uncapped")) +
           ")";
      break;
    case fs::Policy::kVllmV0:
      s += " whole prompts up to " + std::to_string(c.max_tokens_per_step) + " tokens/step";
      break;
    case fs::Policy::kOrca:
      s += " whole prompts, max_model_len of KV reserved each";
      break;
    case fs::Policy::kStatic:
      s += " whole prompts, a batch at a time";
      break;
  }
  return s + ", max running " + std::to_string(c.max_running);
}

}  // namespace flashserve::cli
