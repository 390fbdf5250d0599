#include "engine/replay.h"

#include <algorithm>
#include <string>

#include "common/checked_math.h"
#include "common/str_cat.h"
#include "flashserve/error.h"
#include "model/sampling.h"

namespace flashserve::engine {

std::vector<int32_t> synthetic_prompt(const serve::Request& r, int64_t vocab_size, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(std::max<int64_t>(r.prompt_tokens, 0)), 1);
  if (vocab_size <= 0) return ids;
  const uint64_t key = model::splitmix64(seed ^ model::splitmix64(static_cast<uint64_t>(r.id)));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>(model::splitmix64(key + i) % static_cast<uint64_t>(vocab_size));
  return ids;
}

std::string budget_trace(const ReplayResult& r) {
  return str_cat(r.budget_first, " at the start, ", r.budget_last, " at the end; ", r.budget_min,
                 " to ", r.budget_max, " over ", r.budget_changes, " changes");
}

ReplayResult replay(Engine& engine, const std::vector<serve::Request>& requests,
                    const ReplayOptions& options) {
  for (size_t i = 1; i < requests.size(); ++i)
    if (requests[i].arrival_s < requests[i - 1].arrival_s)
      throw Error(ErrorKind::kInvalidArgument, "requests", "arrivals must not decrease");
  ReplayResult result;
  result.budget_first = result.budget_min = result.budget_max = result.budget_last =
      engine.scheduler().config().max_tokens_per_step;
  // The requests' times are relative to the replay's start on the engine's clock.
  if (!requests.empty()) engine.executor().wait_until(requests.front().arrival_s);
  const double t0 = engine.now() - (requests.empty() ? 0 : requests.front().arrival_s);
  result.start_time = t0;
  size_t next = 0;
  const int64_t total = static_cast<int64_t>(requests.size());
  while (next < requests.size() || engine.has_work()) {
    for (; next < requests.size() && t0 + requests[next].arrival_s <= engine.now(); ++next) {
      const serve::Request& r = requests[next];
      // A request that can never run is refused before its (possibly huge) prompt is allocated.
      const int64_t limit = engine.config().scheduler.max_model_len;
      if (saturating_add(r.prompt_tokens, r.output_tokens) > limit)
        throw Error(ErrorKind::kInvalidArgument, str_cat("request ", r.id),
                    str_cat("prompt ", r.prompt_tokens, " + output ", r.output_tokens,
                            " tokens exceeds max_model_len ", limit));
      NewRequest n;
      n.id = r.id;
      n.prompt = synthetic_prompt(r, options.vocab_size, options.seed);
      n.max_tokens = r.output_tokens;
      n.ignore_eos = true;
      n.arrival_time = t0 + r.arrival_s;
      engine.add_request(std::move(n));  // throws naming the request if it can never run
    }
    if (!engine.has_work()) {
      engine.executor().wait_until(t0 + requests[next].arrival_s);
      continue;
    }
    StepResult step = engine.step();
    if (step.num_tokens == 0) {
      if (next >= requests.size())
        throw Error(ErrorKind::kInternal, "replay",
                    "the scheduler has work but formed an empty batch with no arrival to wait for");
      engine.executor().wait_until(t0 + requests[next].arrival_s);
      continue;
    }
    ++result.steps;
    if (options.on_step) options.on_step(step, engine.now() - t0, result.budget_last);
    result.max_step_tokens = std::max(result.max_step_tokens, step.num_tokens);
    if (const int64_t budget = engine.scheduler().config().max_tokens_per_step;
        budget != result.budget_last) {
      ++result.budget_changes;
      result.budget_last = budget;
      result.budget_min = std::min(result.budget_min, budget);
      result.budget_max = std::max(result.budget_max, budget);
    }
    for (auto& s : step.finished) result.finished.push_back(std::move(s));
    if (options.progress)
      options.progress(static_cast<int64_t>(result.finished.size()), total, engine.now());
  }
  result.end_time = engine.now();
  std::vector<const serve::Sequence*> done;
  for (const auto& s : result.finished) done.push_back(s.get());
  result.metrics = serve::compute_metrics(done);
  return result;
}

}  // namespace flashserve::engine
