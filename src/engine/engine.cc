#include "engine/engine.h"

#include <algorithm>
#include <string>

#include "flashserve/error.h"

namespace flashserve::engine {

Engine::Engine(const EngineConfig& config, std::unique_ptr<Executor> executor)
    : config_(config), executor_(std::move(executor)) {
  if (!executor_) throw Error(ErrorKind::kInvalidArgument, "executor", "null");
  blocks_ = std::make_unique<serve::BlockManager>(config_.num_blocks, config_.block_size,
                                                  config_.watermark, config_.prefix_caching);
  scheduler_ = serve::Scheduler::create(config_.scheduler, *blocks_);
}

void Engine::check_request(const NewRequest& r) const {
  const std::string who = r.id >= 0 ? "request " + std::to_string(r.id) : std::string("request");
  auto bad = [&](const std::string& what) { throw Error(ErrorKind::kInvalidArgument, who, what); };
  if (r.prompt.empty()) bad("empty prompt");
  if (r.max_tokens < 1) bad("max_tokens " + std::to_string(r.max_tokens) + " must be >= 1");
  const int64_t limit = config_.scheduler.max_model_len;
  const int64_t prompt = static_cast<int64_t>(r.prompt.size());
  if (prompt > limit || r.max_tokens > limit - prompt)
    bad("prompt " + std::to_string(prompt) + " + max_tokens " + std::to_string(r.max_tokens) +
        " tokens exceeds max_model_len " + std::to_string(limit));
  auto check_ids = [&](const std::vector<int32_t>& ids, const char* what) {
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || (config_.vocab_size > 0 && ids[i] >= config_.vocab_size))
        bad(std::string(what) + "[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
            " is outside the vocabulary of " + std::to_string(config_.vocab_size));
  };
  check_ids(r.prompt, "prompt");
  check_ids(r.stop_token_ids, "stop_token_ids");
  for (const auto& [token, bias] : r.sampling.logit_bias)
    if (config_.vocab_size > 0 && token >= config_.vocab_size)
      bad("logit_bias: token " + std::to_string(token) + " is outside the vocabulary of " +
          std::to_string(config_.vocab_size));
  if (r.logprobs < -1 || r.logprobs > model::kMaxTopLogprobs)
    bad("logprobs " + std::to_string(r.logprobs) + " is outside [-1, " +
        std::to_string(model::kMaxTopLogprobs) + "]");
  try {
    r.sampling.validate();
  } catch (const Error& e) {
    bad(std::string("sampling: ") + e.what());
  }
}

int64_t Engine::add_request(NewRequest r) {
  check_request(r);
  const int64_t id = r.id >= 0 ? r.id : next_id_;
  if (live_.count(id))
    throw Error(ErrorKind::kInvalidArgument, "request " + std::to_string(id), "id already live");
  auto seq = std::make_unique<serve::Sequence>();
  seq->id = id;
  seq->prompt = std::move(r.prompt);
  seq->max_output_tokens = r.max_tokens;
  if (!r.ignore_eos) seq->eos_tokens = config_.eos_tokens;
  seq->stop_tokens = std::move(r.stop_token_ids);
  seq->sampling = r.sampling;
  seq->logprobs = r.logprobs;
  seq->constraint = std::move(r.constraint);
  seq->arrival_time = r.arrival_time >= 0 ? r.arrival_time : executor_->now();
  scheduler_->add(std::move(seq));  // checked above: does not throw
  live_.insert(id);
  next_id_ = std::max(next_id_, id + 1);
  return id;
}

void Engine::set_auto_budget(std::unique_ptr<serve::AutoBudget> budget) {
  if (config_.scheduler.policy != serve::Policy::kSarathi)
    throw Error(ErrorKind::kInvalidArgument, "budget",
                std::string("auto: only sarathi chooses its budget from the SLO, not ") +
                    serve::to_string(config_.scheduler.policy));
  if (budget) scheduler_->set_token_budget(budget->budget());
  auto_budget_ = std::move(budget);
}

bool Engine::abort(int64_t id) {
  if (!scheduler_->abort(id, executor_->now())) return false;
  live_.erase(id);
  aborted_.push_back(id);
  return true;
}

StepResult Engine::step() {
  StepResult result;
  for (int64_t id : aborted_) result.outputs.push_back({id, {}, {}, serve::FinishReason::kAbort});
  aborted_.clear();
  if (!scheduler_->has_work()) return result;
  const serve::Batch batch = scheduler_->schedule(executor_->now());
  result.preempted = static_cast<int64_t>(batch.preempted.size());
  if (batch.empty()) return result;
  if (observer_) observer_(*scheduler_, batch);
  const double started = executor_->now();
  const std::vector<int32_t> sampled = executor_->execute(batch);
  result.seconds = executor_->now() - started;
  if (auto_budget_) {
    const int64_t next = auto_budget_->observe(batch, result.seconds);
    if (next != scheduler_->config().max_tokens_per_step) scheduler_->set_token_budget(next);
  }
  std::vector<model::SampledLogprobs> logprobs = executor_->take_logprobs();
  result.num_tokens = batch.num_tokens();
  result.decodes = batch.num_decode_tokens();
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    if (!batch.entries[i].samples) continue;
    RequestOutput out{batch.entries[i].seq->id,
                      {sampled[i]},
                      {},
                      serve::FinishReason::kNone,
                      batch.entries[i].seq->num_cached_prompt};
    if (i < logprobs.size() && logprobs[i].sampled.token >= 0)
      out.logprobs.push_back(std::move(logprobs[i]));
    result.outputs.push_back(std::move(out));
  }
  result.finished = scheduler_->complete(batch, sampled, executor_->now());
  // complete() may free the sequences' blocks but not the Sequence objects of those still
  // running, and the entries point at both; the finished ones are ours now.
  for (const auto& s : result.finished) {
    live_.erase(s->id);
    for (RequestOutput& o : result.outputs)
      if (o.id == s->id && o.finish == serve::FinishReason::kNone) o.finish = s->finish_reason;
  }
  return result;
}

}  // namespace flashserve::engine
