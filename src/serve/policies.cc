// The five scheduling policies. Each only decides the order and size of the batch's entries; block
// reservation, preemption and bookkeeping are the base class's.
#include <algorithm>
#include <limits>
#include <memory>

#include "flashserve/error.h"
#include "serve/scheduler.h"

namespace flashserve::serve {

namespace {

// Sarathi-Serve: decodes are never held back, prefills fill what is left of the token budget.
class SarathiScheduler final : public Scheduler {
 public:
  SarathiScheduler(const SchedulerConfig& c, BlockManager& b) : Scheduler(c, b) {}

 private:
  // A prefill's chunk: all that is left of it if that fits, else the rest of the budget rounded
  // down to the kernels' query tile (a partial tile costs a whole tile's work in the attention
  // kernel).
  int64_t chunk(int64_t remaining, int64_t budget_left) const {
    int64_t c = std::min(remaining, budget_left);
    const int64_t tile = config_.chunk_tile;
    if (c < remaining && c >= tile) c -= c % tile;
    return c;
  }

  void form(Batch& batch) override {
    int64_t left = config_.max_tokens_per_step - add_decodes(batch);
    // Partial prefills, in priority order (they were admitted before anything still waiting).
    std::vector<Sequence*> partial;
    for (auto& s : running_)
      if (s->state == SeqState::kRunningPrefill) partial.push_back(s.get());
    for (Sequence* s : partial) {
      if (left <= 0) break;
      if (s->state != SeqState::kRunningPrefill) continue;  // preempted meanwhile
      const int64_t c = chunk(s->num_uncomputed(), left);
      if (!reserve(s, s->num_computed + c, batch)) continue;
      add_entry(batch, s, c);
      left -= c;
    }
    // New (and preempted) requests, FIFO. Not in a step that had to preempt: the blocks are short.
    while (left > 0 && batch.preempted.empty()) {
      Sequence* s = admit_head();
      if (!s) break;
      const int64_t c = chunk(s->num_uncomputed(), left);
      add_entry(batch, s, c);  // admit_head reserved the blocks of the whole prompt
      left -= c;
    }
  }
};

// vLLM v1 (vllm/v1/core/sched/scheduler.py): one pass over the running requests in admission
// order, each getting what it has left to compute (a decode: 1) capped by the threshold and the
// budget left, its blocks allocated for that chunk only; then, if nothing was preempted, waiting
// requests FIFO in the same way. Nothing distinguishes a decode from a prefill: an early prefill
// can take the budget that later decodes would have had.
class VllmV1Scheduler final : public Scheduler {
 public:
  VllmV1Scheduler(const SchedulerConfig& c, BlockManager& b) : Scheduler(c, b) {}

 private:
  // The most tokens one request gets this step, before it meets the budget.
  int64_t cap(int64_t remaining) const {
    const int64_t t = config_.long_prefill_token_threshold;
    return t > 0 ? std::min(remaining, t) : remaining;
  }

  // Blocks for `seq` to hold `kv_len` tokens, preempting the latest-admitted running request
  // (vLLM's FCFS victim: the back of the running list, a half-done prefill or not) until they fit
  // or `seq` itself was the latest. Returns whether seq can run.
  bool grow_or_preempt(Sequence* seq, int64_t kv_len, Batch& batch) {
    while (!blocks_.can_grow(*seq, kv_len)) {
      Sequence* victim = running_.back().get();
      // The pass walks the running list forwards, so the back is seq or after it: never in batch.
      if (in_batch(batch, victim))
        throw Error(ErrorKind::kInternal, "scheduler", "vllm-v1 would preempt a scheduled request");
      preempt(victim, batch);
      if (victim == seq) return false;
    }
    blocks_.grow(*seq, kv_len);
    return true;
  }

  void form(Batch& batch) override {
    int64_t left = config_.max_tokens_per_step;
    std::vector<Sequence*> order;  // a snapshot: preemption removes from the back while we walk
    for (auto& s : running_) order.push_back(s.get());
    for (Sequence* s : order) {
      if (left <= 0) break;
      if (!s->is_running()) continue;  // preempted for an earlier one
      const int64_t n = std::min(cap(s->num_uncomputed()), left);
      // vLLM stops the pass at the first request it cannot fit, even by preempting.
      if (!grow_or_preempt(s, s->num_computed + n, batch)) break;
      add_entry(batch, s, n);
      left -= n;
    }
    if (!batch.preempted.empty()) return;  // the blocks are short: admit nothing this step
    while (left > 0) {
      // Blocks for the first chunk only; admit_head checks max_running (max_num_seqs).
      Sequence* s = admit_head({.chunk_tokens = cap(left)});
      if (!s) break;
      const int64_t n = std::min(cap(s->num_uncomputed()), left);
      add_entry(batch, s, n);
      left -= n;
    }
  }
};

// Shared by the three baselines: they never split a prompt.
class WholePromptScheduler : public Scheduler {
 public:
  WholePromptScheduler(const SchedulerConfig& c, BlockManager& b) : Scheduler(c, b) {}

 protected:
  // Admits whole prompts FIFO while they fit in `left` tokens, each with the blocks `how` says
  // (all of its own at least); returns how many were admitted.
  int64_t admit_whole(Batch& batch, int64_t left, const Admission& how = {}) {
    int64_t n = 0;
    while (!waiting_.empty()) {
      if (waiting_.front()->num_uncomputed() > left) break;
      Sequence* s = admit_head(how);
      if (!s) break;
      const int64_t need = s->num_uncomputed();  // less than before if a cached prefix was found
      add_entry(batch, s, need);
      left -= need;
      ++n;
    }
    return n;
  }
};

constexpr int64_t kNoTokenCap = std::numeric_limits<int64_t>::max();

// vLLM v0 (its default, Sarathi-Serve's vLLM baseline): prefill-first. A step with new prompts
// runs only prompts; decodes stall.
class VllmV0Scheduler final : public WholePromptScheduler {
 public:
  VllmV0Scheduler(const SchedulerConfig& c, BlockManager& b) : WholePromptScheduler(c, b) {}

 private:
  void form(Batch& batch) override {
    if (admit_whole(batch, config_.max_tokens_per_step) > 0) return;
    add_decodes(batch);
  }
};

// Orca as Sarathi-Serve runs it (orca_scheduler.py, orca_block_space_manager.py): iteration-level
// scheduling, whole prompts join the running decodes in the same step, no cap on a step's tokens.
// With no paged cache, each request reserves max_model_len tokens of KV when admitted (with no
// watermark), so it never preempts and memory bounds the batch below max_running.
class OrcaScheduler final : public WholePromptScheduler {
 public:
  OrcaScheduler(const SchedulerConfig& c, BlockManager& b) : WholePromptScheduler(c, b) {}

 private:
  void form(Batch& batch) override {
    add_decodes(batch);
    if (batch.preempted.empty())
      admit_whole(batch, kNoTokenCap, {.reserve_tokens = config_.max_model_len});
  }
};

// Static (request-level, FasterTransformer-style) batching: up to max_running whole prompts start
// together once the previous batch has drained, then decode steps until this one drains.
class StaticScheduler final : public WholePromptScheduler {
 public:
  StaticScheduler(const SchedulerConfig& c, BlockManager& b) : WholePromptScheduler(c, b) {}

 private:
  void form(Batch& batch) override {
    if (running_.empty()) {
      admit_whole(batch, kNoTokenCap);
      return;
    }
    add_decodes(batch);
  }
};

}  // namespace

std::unique_ptr<Scheduler> Scheduler::create(const SchedulerConfig& config, BlockManager& blocks) {
  // The constructor validates the config (and the cache against it).
  switch (config.policy) {
    case Policy::kSarathi:
      return std::unique_ptr<Scheduler>(new SarathiScheduler(config, blocks));
    case Policy::kVllmV1:
      return std::unique_ptr<Scheduler>(new VllmV1Scheduler(config, blocks));
    case Policy::kVllmV0:
      return std::unique_ptr<Scheduler>(new VllmV0Scheduler(config, blocks));
    case Policy::kOrca:
      return std::unique_ptr<Scheduler>(new OrcaScheduler(config, blocks));
    case Policy::kStatic:
      return std::unique_ptr<Scheduler>(new StaticScheduler(config, blocks));
  }
  throw Error(ErrorKind::kInvalidArgument, "policy", "unknown");
}

}  // namespace flashserve::serve
