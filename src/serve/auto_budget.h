// --budget auto: sarathi's token budget chosen from the step-cost model and the TBT SLO, then
// adjusted from the step times the engine measures. Sarathi-Serve leaves the budget to profiling
// per deployment; here it is the largest tile-aligned budget whose worst mixed step meets the SLO:
// every decode of that step waits for it, so its time is the TBT they see.
//
// Offline (before the first step, no load seen yet): the worst mixed step of budget B is the most
// expensive, over every decode count d in [0, min(max_running, B)], of d decodes beside one chunk
// of B - d tokens: the chunk the last of a max_model_len prompt (the most keys a chunk of that
// size sees), the decodes at the reference context the SLOs are defined by (4096 tokens,
// tbt_slo.h; cut to max_model_len) as far as the pool holds them. Decodes at max_model_len would
// bound every step, but with a large pool no budget meets a strict SLO then (256 decodes reading a
// full H200 pool take ~45 ms of attention alone): the contexts the load really has are the online
// adjustment's to see. When no budget meets the SLO offline, the first is the smallest.
//
// Online: every `window` steps that ran a prefill chunk, the budget moves by what those steps
// measured: down by an eighth (a tile at least) when the slowest of them passed the SLO, and the
// budget it came down from is not tried again until kCapWindows windows have stayed within the
// margin, none past the SLO since (then one tile more is allowed); held when the slowest came
// within 5% of the SLO; else up by a tile. Never above the model's ceiling, the largest
// tile-aligned budget at which each of those steps, re-costed there (its decodes as they were, its
// chunk tokens grown or cut to fill it) and scaled by the window's high measured / predicted ratio
// (its 90th percentile), takes at most 95% of the SLO (the next window's steps are not these). The
// ratio corrects the model's error on this deployment (CUDA graphs, eager launches, a busy host);
// steps far slower than the median (a graph capture, a host stall) are left out of both: no budget
// would have made them faster.
#pragma once

#include <cstdint>
#include <vector>

#include "serve/batch.h"
#include "serve/cost_model.h"
#include "serve/scheduler.h"

namespace flashserve::serve {

struct AutoBudgetConfig {
  double slo_tbt_s = 0;       // the P99 TBT SLO one step must meet
  int64_t tile = 64;          // budgets are multiples of this (sarathi's chunk_tile)
  int64_t max_running = 256;  // decodes one step may hold: the budget is at least this
  int64_t max_model_len = 8192;
  int64_t pool_tokens = 0;    // KV slots of the pool (blocks x block size)
  int64_t max_budget = 8192;  // the largest budget considered (vllm-v1's default)
  int64_t window = 32;        // online: mixed steps per adjustment

  // The configuration of a sarathi scheduler on a pool of num_blocks x block_size under `slo`.
  static AutoBudgetConfig for_scheduler(const SchedulerConfig& sc, int64_t num_blocks,
                                        int32_t block_size, double slo_tbt_s);
  // Throws Error(kInvalidArgument) naming the field.
  void validate() const;
  int64_t min_budget() const;  // max_running rounded up to a tile
};

// The offline worst mixed step of `budget` tokens (above), in seconds.
double worst_mixed_step_s(const CostModel& cost, const AutoBudgetConfig& c, int64_t budget);

// The largest tile-aligned budget in [min_budget, max_budget] whose worst mixed step meets the
// SLO; min_budget (meets false) when none does.
struct BudgetChoice {
  int64_t budget = 0;
  double worst_s = 0;  // its worst mixed step
  bool meets = false;
};
BudgetChoice choose_budget(const CostModel& cost, const AutoBudgetConfig& c);

class AutoBudget {
 public:
  // Chooses the first budget offline (choose_budget). `cost` must outlive this.
  AutoBudget(const CostModel& cost, const AutoBudgetConfig& c);

  int64_t budget() const { return budget_; }
  const BudgetChoice& initial() const { return initial_; }
  const AutoBudgetConfig& config() const { return config_; }
  // A step ran `batch` in `seconds` on the engine's clock. Returns the budget for the next step.
  int64_t observe(const Batch& batch, double seconds);

 private:
  // Online (adjust): a step more than kOutlierRatio times the window's median measured /
  // predicted is not the budget's doing; the budget is sized for the window's steps to take at
  // most kMargin of the SLO at the window's kRatioQuantile ratio, and grows while its slowest
  // typical step stays under that; a budget whose window passed the SLO is capped below for
  // kCapWindows clean windows.
  static constexpr double kOutlierRatio = 2.0;
  static constexpr double kMargin = 0.95;
  static constexpr double kRatioQuantile = 0.9;
  static constexpr int kCapWindows = 8;

  // A mixed step as re-costing needs it: its decodes' KV lengths, the longest cached prefix of
  // its chunks, its measured time and measured / predicted.
  struct Seen {
    std::vector<int64_t> decode_kv;
    int64_t chunk_cached = 0;
    double seconds = 0;
    double ratio = 1;
  };
  // s's time at `budget` tokens: its decodes as they were, its chunk grown or cut to fill it,
  // times `ratio` (measured / predicted).
  double recost(const Seen& s, int64_t budget, double ratio) const;
  void adjust();

  const CostModel& cost_;
  AutoBudgetConfig config_;
  BudgetChoice initial_;
  int64_t budget_ = 0;
  // The highest budget allowed now (set below a budget whose window passed the SLO) and the
  // windows within the margin since it was last set or raised (a window past the SLO sets it).
  int64_t cap_ = 0;
  int clean_windows_ = 0;
  std::vector<Seen> window_;
};

}  // namespace flashserve::serve
