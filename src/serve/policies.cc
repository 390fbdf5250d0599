// The four scheduling policies. Each only decides the order and size of the batch's entries; block
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

// Shared by the three baselines: they never split a prompt.
class WholePromptScheduler : public Scheduler {
 public:
  WholePromptScheduler(const SchedulerConfig& c, BlockManager& b) : Scheduler(c, b) {}

 protected:
  // Admits whole prompts FIFO while they fit in `left` tokens, each with the blocks of
  // `reserve_tokens` (at least its own); returns how many were admitted.
  int64_t admit_whole(Batch& batch, int64_t left, int64_t reserve_tokens = 0) {
    int64_t n = 0;
    while (!waiting_.empty()) {
      if (waiting_.front()->num_uncomputed() > left) break;
      Sequence* s = admit_head(reserve_tokens);
      if (!s) break;
      const int64_t need = s->num_uncomputed();  // less than before if a cached prefix was found
      add_entry(batch, s, need);
      left -= need;
      ++n;
    }
    return n;
  }
};

// vLLM (v0 default): prefill-first. A step with new prompts runs only prompts; decodes stall.
class VllmScheduler final : public WholePromptScheduler {
 public:
  VllmScheduler(const SchedulerConfig& c, BlockManager& b) : WholePromptScheduler(c, b) {}

 private:
  void form(Batch& batch) override {
    if (admit_whole(batch, config_.max_tokens_per_step) > 0) return;
    add_decodes(batch);
  }
};

// Orca: iteration-level scheduling; whole prompts join the running decodes in the same step. Orca
// keeps a fixed batch (max_running) and, with no paged cache, reserves max_model_len tokens of KV
// per request when it is admitted, so it never preempts; there is no cap on a step's tokens.
class OrcaScheduler final : public WholePromptScheduler {
 public:
  OrcaScheduler(const SchedulerConfig& c, BlockManager& b) : WholePromptScheduler(c, b) {}

 private:
  void form(Batch& batch) override {
    add_decodes(batch);
    if (batch.preempted.empty())
      admit_whole(batch, std::numeric_limits<int64_t>::max(), config_.max_model_len);
  }
};

// Static (request-level) batching: a new batch starts only when the previous one has drained.
class StaticScheduler final : public WholePromptScheduler {
 public:
  StaticScheduler(const SchedulerConfig& c, BlockManager& b) : WholePromptScheduler(c, b) {}

 private:
  void form(Batch& batch) override {
    if (running_.empty()) {
      admit_whole(batch, config_.max_tokens_per_step);
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
    case Policy::kVllm:
      return std::unique_ptr<Scheduler>(new VllmScheduler(config, blocks));
    case Policy::kOrca:
      return std::unique_ptr<Scheduler>(new OrcaScheduler(config, blocks));
    case Policy::kStatic:
      return std::unique_ptr<Scheduler>(new StaticScheduler(config, blocks));
  }
  throw Error(ErrorKind::kInvalidArgument, "policy", "unknown");
}

}  // namespace flashserve::serve
