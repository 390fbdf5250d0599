#include "cli/scheduler_flags.h"

#include "cli/options.h"

namespace flashserve::cli {

namespace fs = flashserve::serve;

void add_scheduler_options(CLI::App& app, SchedulerFlags& f, const std::string& policies,
                           const std::string& max_model_len_help) {
  // Ranges: what the models can mean, and what keeps every product of them (tokens x blocks,
  // requests x lengths) far inside int64.
  constexpr int64_t kMaxTokens = int64_t{1} << 24;
  f.policy_opt = app.add_option("--policy", f.policy, policies)->default_str(f.policy);
  app.add_flag("--compare", f.compare, "run every policy (" + policies + ") side by side");
  f.budget_opt =
      add_int(app, "--budget", f.budget, {1, kMaxTokens}, "sarathi's token budget per step");
  f.chunk_tile_opt = add_int(app, "--chunk-tile", f.chunk_tile, {1, kMaxTokens},
                             "sarathi: non-final chunks are a multiple of this");
  f.max_running_opt =
      add_int(app, "--max-running", f.max_running, {1, 1 << 20}, "sequences running at once");
  f.orca_batch_opt = add_int(app, "--orca-batch", f.orca_batch, {1, 1 << 20},
                             "orca's fixed batch (each request reserves max_model_len of KV)");
  f.max_model_len_opt = add_int(app, "--max-model-len", f.max_model_len, {0, kMaxTokens},
                                "prompt + output limit (0: " + max_model_len_help + ")");
}

void SchedulerFlags::refuse_inapplicable() const {
  refuse_unless(policy_opt, !compare, "--compare runs every policy; drop --policy");
  refuse_unless(chunk_tile_opt, compare || policy == "sarathi",
                "only sarathi chunks prompts (--policy sarathi or --compare)");
  refuse_unless(orca_batch_opt, compare || policy == "orca",
                "only orca has a fixed batch (--policy orca or --compare)");
  // Orca runs a fixed batch of --orca-batch requests, whole prompts: no token budget, and its
  // batch is not --max-running.
  refuse_unless(budget_opt, compare || policy != "orca",
                "orca takes whole prompts in its fixed batch; it has no token budget");
  refuse_unless(max_running_opt, compare || policy != "orca", "orca's batch is --orca-batch");
}

std::vector<fs::Policy> SchedulerFlags::selected(const std::vector<fs::Policy>& compare_set) const {
  return compare ? compare_set : std::vector<fs::Policy>{fs::parse_policy(policy)};
}

fs::SchedulerConfig SchedulerFlags::config_for(fs::Policy p, int64_t baseline_tokens) const {
  fs::SchedulerConfig sc;
  sc.policy = p;
  const bool chunks = p == fs::Policy::kSarathi;
  sc.max_tokens_per_step = chunks || baseline_tokens <= 0 ? budget : baseline_tokens;
  sc.max_running = p == fs::Policy::kOrca ? orca_batch : max_running;
  sc.max_model_len = max_model_len;
  sc.chunk_tile = chunk_tile;
  return sc;
}

}  // namespace flashserve::cli
