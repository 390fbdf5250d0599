#include "serve/scheduler.h"

#include "common/checked_math.h"

#include <algorithm>

#include "flashserve/error.h"

namespace flashserve::serve {

const char* to_string(SeqState s) {
  switch (s) {
    case SeqState::kWaiting:
      return "waiting";
    case SeqState::kRunningPrefill:
      return "running-prefill";
    case SeqState::kRunningDecode:
      return "running-decode";
    case SeqState::kPreempted:
      return "preempted";
    case SeqState::kFinished:
      return "finished";
  }
  return "?";
}

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "?";
}

int64_t Batch::num_prefill_tokens() const {
  int64_t n = 0;
  for (const auto& e : entries) n += e.is_prefill ? e.q_len : 0;
  return n;
}
int64_t Batch::num_decode_tokens() const {
  int64_t n = 0;
  for (const auto& e : entries) n += e.is_prefill ? 0 : 1;
  return n;
}
int64_t Batch::num_sampled() const {
  int64_t n = 0;
  for (const auto& e : entries) n += e.samples;
  return n;
}
int64_t Batch::kv_tokens() const {
  int64_t n = 0;
  for (const auto& e : entries) n += e.kv_len;
  return n;
}

void SchedulerConfig::validate() const {
  auto bad = [](const char* field, const std::string& what) {
    throw Error(ErrorKind::kInvalidArgument, field, what);
  };
  if (max_tokens_per_step < 1)
    bad("max_tokens_per_step", std::to_string(max_tokens_per_step) + " must be positive");
  if (max_running < 1) bad("max_running", std::to_string(max_running) + " must be positive");
  if (max_model_len < 2) bad("max_model_len", std::to_string(max_model_len) + " must be >= 2");
  if (chunk_tile < 1) bad("chunk_tile", std::to_string(chunk_tile) + " must be positive");
  if ((policy == Policy::kSarathi || policy == Policy::kVllmV1) &&
      max_tokens_per_step < max_running)
    // Sarathi: every running decode takes one token of the budget; a smaller budget would have to
    // skip some. vLLM refuses max_num_batched_tokens < max_num_seqs for the same reason.
    bad("max_tokens_per_step", std::string(to_string(policy)) + "'s budget " +
                                   std::to_string(max_tokens_per_step) + " is below max_running " +
                                   std::to_string(max_running) +
                                   ", so it could not run every decode each step");
  // vllm-v0 runs whole prompts under its cap; orca and static have no token cap.
  if (policy == Policy::kVllmV0 && max_tokens_per_step < max_model_len)
    bad("max_tokens_per_step", std::string(to_string(policy)) + " never chunks a prompt, so " +
                                   std::to_string(max_tokens_per_step) +
                                   " must be at least max_model_len " +
                                   std::to_string(max_model_len));
  if (long_prefill_token_threshold < 0)
    bad("long_prefill_token_threshold",
        std::to_string(long_prefill_token_threshold) + " must be >= 0 (0: no cap)");
  if (long_prefill_token_threshold > 0 && policy != Policy::kVllmV1)
    bad("long_prefill_token_threshold",
        std::string("only vllm-v1 caps a request's prefill tokens per step, not ") +
            to_string(policy));
}

void Scheduler::set_token_budget(int64_t budget) {
  SchedulerConfig c = config_;
  c.max_tokens_per_step = budget;
  c.validate();
  config_ = c;
}

bool Scheduler::admits_with_watermark() const {
  // Sarathi-Serve's Orca runs with watermark 0 (it reserves max_model_len per request, so running
  // requests never need room to grow), and vLLM v1 allocates blocks with no watermark.
  return config_.policy != Policy::kOrca && config_.policy != Policy::kVllmV1;
}

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager& blocks)
    : config_(config), blocks_(blocks) {
  config_.validate();
  // A sequence alone must always fit, or preemption could loop forever.
  const int64_t watermark = admits_with_watermark() ? blocks.watermark_blocks() : 0;
  const int64_t need = blocks.blocks_for_tokens(config_.max_model_len) + watermark;
  if (need > blocks.num_blocks())
    throw Error(
        ErrorKind::kInvalidArgument, "num_blocks",
        std::to_string(blocks.num_blocks()) + " blocks of " + std::to_string(blocks.block_size()) +
            " tokens cannot hold one max_model_len (" + std::to_string(config_.max_model_len) +
            ") sequence plus the watermark (" + std::to_string(watermark) + " blocks)");
}

void Scheduler::add(std::unique_ptr<Sequence> seq) {
  if (!seq) throw Error(ErrorKind::kInvalidArgument, "seq", "null");
  const std::string who = "request " + std::to_string(seq->id);
  if (seq->prompt.empty()) throw Error(ErrorKind::kInvalidArgument, who, "empty prompt");
  if (seq->max_output_tokens < 1)
    throw Error(ErrorKind::kInvalidArgument, who,
                "max_output_tokens " + std::to_string(seq->max_output_tokens) + " must be >= 1");
  const int64_t total = saturating_add(seq->prompt_len(), seq->max_output_tokens);  // user sizes
  if (total > config_.max_model_len)
    throw Error(ErrorKind::kInvalidArgument, who,
                "prompt " + std::to_string(seq->prompt_len()) + " + output " +
                    std::to_string(seq->max_output_tokens) + " = " + std::to_string(total) +
                    " tokens exceeds max_model_len " + std::to_string(config_.max_model_len));
  if (!seq->generated.empty() || seq->num_computed != 0 || !seq->block_table.empty())
    throw Error(ErrorKind::kInvalidArgument, who, "is not a fresh request");
  seq->state = SeqState::kWaiting;
  waiting_.push_back(std::move(seq));
}

std::vector<const Sequence*> Scheduler::live() const {
  std::vector<const Sequence*> out;
  for (const auto& s : running_) out.push_back(s.get());
  for (const auto& s : waiting_) out.push_back(s.get());
  return out;
}

std::vector<const Sequence*> Scheduler::running() const {
  std::vector<const Sequence*> out;
  for (const auto& s : running_) out.push_back(s.get());
  return out;
}

Batch Scheduler::schedule(double now) {
  Batch batch;
  form(batch);
  for (auto& e : batch.entries)
    if (e.seq->first_scheduled_time < 0) e.seq->first_scheduled_time = now;
  return batch;
}

bool Scheduler::in_batch(const Batch& batch, const Sequence* seq) const {
  for (const auto& e : batch.entries)
    if (e.seq == seq) return true;
  return false;
}

void Scheduler::add_entry(Batch& batch, Sequence* seq, int64_t q_len) {
  BatchEntry e;
  e.seq = seq;
  e.q_start = seq->num_computed;
  e.q_len = q_len;
  e.kv_len = e.q_start + q_len;
  e.is_prefill = seq->state != SeqState::kRunningDecode;
  e.samples = e.kv_len == seq->num_tokens();
  if (e.kv_len > seq->num_tokens() || q_len < 1)
    throw Error(ErrorKind::kInternal, "scheduler",
                "bad chunk for sequence " + std::to_string(seq->id));
  batch.entries.push_back(e);
}

void Scheduler::preempt(Sequence* seq, Batch& batch) {
  auto it =
      std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == seq; });
  if (it == running_.end())
    throw Error(ErrorKind::kInternal, "scheduler", "preempting a sequence that is not running");
  std::unique_ptr<Sequence> owned = std::move(*it);
  running_.erase(it);
  blocks_.release(*owned);
  // Recompute: its KV is gone, so every token (prompt and generated) is prefilled again.
  owned->num_computed = 0;
  owned->state = SeqState::kPreempted;
  ++owned->num_preemptions;
  batch.preempted.push_back(owned->id);
  waiting_.push_front(std::move(owned));
}

Sequence* Scheduler::victim_for(const Sequence* seq, const Batch& batch) const {
  // Lowest priority first, but a prefill that has started is taken only when nothing else is
  // left: recomputing it throws away the chunks already paid for, and its blocks were reserved
  // when it was admitted, so it is not what ran the cache short.
  for (const bool spare_prefills : {true, false})
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      Sequence* c = it->get();
      const bool half_done = c->state == SeqState::kRunningPrefill && c->num_computed > 0;
      if (c != seq && !in_batch(batch, c) && !(spare_prefills && half_done)) return c;
    }
  return nullptr;
}

bool Scheduler::reserve(Sequence* seq, int64_t kv_len, Batch& batch) {
  while (!blocks_.can_grow(*seq, kv_len)) {
    Sequence* victim = victim_for(seq, batch);
    if (!victim) {
      preempt(seq, batch);
      return false;
    }
    preempt(victim, batch);
  }
  blocks_.grow(*seq, kv_len);
  return true;
}

int64_t Scheduler::add_decodes(Batch& batch) {
  // Snapshot: reserve() may preempt sequences from the back while we walk forwards.
  std::vector<Sequence*> order;
  for (auto& s : running_)
    if (s->state == SeqState::kRunningDecode) order.push_back(s.get());
  int64_t added = 0;
  for (Sequence* s : order) {
    if (s->state != SeqState::kRunningDecode) continue;  // preempted by an earlier reserve()
    if (!reserve(s, s->num_computed + 1, batch)) continue;
    add_entry(batch, s, 1);
    ++added;
  }
  return added;
}

Sequence* Scheduler::admit_head(const Admission& how) {
  if (waiting_.empty() || num_running() >= config_.max_running) return nullptr;
  Sequence* s = waiting_.front().get();
  const int64_t watermark = admits_with_watermark() ? blocks_.watermark_blocks() : 0;
  // The tokens its blocks must cover once the first `computed` of them are found in the cache:
  // the first chunk, or everything it can hold (at least reserve_tokens) at once.
  const auto cover = [&](int64_t computed) {
    return how.chunk_tokens > 0 ? computed + std::min(s->num_tokens() - computed, how.chunk_tokens)
                                : std::max(how.reserve_tokens, s->num_tokens());
  };
  // A head that could not be admitted even if every block it looks up were cached waits without
  // hashing its prompt again (a long prompt blocked for memory would, every step). More cached
  // blocks never need more new ones, so the full lookup is the best case.
  const int64_t lookup = blocks_.prefix_lookup_tokens(*s);
  const int64_t best_case =
      blocks_.blocks_for_tokens(cover(lookup)) - lookup / blocks_.block_size();
  if (blocks_.num_free() - best_case < watermark) return nullptr;
  // With prefix caching, the blocks that already hold its first tokens are taken first (they
  // count as computed, and as blocks it needs no more of); given back if it is not admitted.
  // (Cached blocks taken from the free pool leave the balance of free and needed as it was.)
  const int64_t hit = blocks_.match_prefix(*s);
  const int64_t tokens = cover(s->num_computed);
  if (blocks_.num_free() - blocks_.blocks_needed(*s, tokens) < watermark) {
    blocks_.release(*s);
    s->num_computed = 0;
    return nullptr;
  }
  if (blocks_.prefix_caching()) {
    prefix_queried_tokens_ += blocks_.prefix_lookup_tokens(*s);
    prefix_hit_tokens_ += hit;
    if (s->first_scheduled_time < 0 && s->num_preemptions == 0) s->num_cached_prompt = hit;
  }
  running_.push_back(std::move(waiting_.front()));
  waiting_.pop_front();
  s->state = SeqState::kRunningPrefill;
  // Without chunk_tokens the blocks of the whole prompt are taken now: a later admission cannot
  // count them as free, so a prefill never runs out of blocks half way. vllm-v1 takes them chunk
  // by chunk, as vLLM does, and preempts when a later chunk finds none.
  blocks_.grow(*s, tokens);
  return s;
}

std::unique_ptr<Sequence> Scheduler::abort(int64_t id, double now) {
  std::unique_ptr<Sequence> out;
  auto wit =
      std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& p) { return p->id == id; });
  if (wit != waiting_.end()) {
    out = std::move(*wit);
    waiting_.erase(wit);
  } else {
    auto rit =
        std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p->id == id; });
    if (rit == running_.end()) return nullptr;
    out = std::move(*rit);
    running_.erase(rit);
    blocks_.release(*out);
  }
  out->state = SeqState::kFinished;
  out->aborted = true;
  out->finish_reason = FinishReason::kAbort;
  out->finish_time = now;
  return out;
}

std::vector<std::unique_ptr<Sequence>> Scheduler::complete(const Batch& batch,
                                                           const std::vector<int32_t>& sampled,
                                                           double now) {
  if (sampled.size() < batch.entries.size())
    throw Error(ErrorKind::kInvalidArgument, "sampled",
                std::to_string(sampled.size()) + " tokens for a batch of " +
                    std::to_string(batch.entries.size()));
  bool any_finished = false;
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    const BatchEntry& e = batch.entries[i];
    Sequence* s = e.seq;
    if (s->num_computed != e.q_start || !s->is_running())
      throw Error(ErrorKind::kInternal, "scheduler",
                  "sequence " + std::to_string(s->id) + " changed between schedule and complete");
    s->num_computed = e.kv_len;
    blocks_.remember_computed(*s, e.q_start, e.kv_len);
    if (!e.samples) continue;
    s->generated.push_back(sampled[i]);
    s->token_times.push_back(now);
    const int32_t t = sampled[i];
    if (std::find(s->eos_tokens.begin(), s->eos_tokens.end(), t) != s->eos_tokens.end())
      s->finish_reason = FinishReason::kEos;
    else if (std::find(s->stop_tokens.begin(), s->stop_tokens.end(), t) != s->stop_tokens.end())
      s->finish_reason = FinishReason::kStop;
    else if (s->num_generated() >= s->max_output_tokens)
      s->finish_reason = FinishReason::kLength;
    if (s->finish_reason != FinishReason::kNone) {
      s->state = SeqState::kFinished;
      s->finish_time = now;
      blocks_.release(*s);
      any_finished = true;
    } else {
      s->state = SeqState::kRunningDecode;
    }
  }
  std::vector<std::unique_ptr<Sequence>> done;
  if (any_finished) {
    std::vector<std::unique_ptr<Sequence>> keep;
    for (auto& s : running_) (s->is_finished() ? done : keep).push_back(std::move(s));
    running_ = std::move(keep);
  }
  return done;
}

}  // namespace flashserve::serve
