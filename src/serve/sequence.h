// One request as the serving core sees it: its tokens, where it is in its life (waiting, prefill in
// progress, decoding, preempted, finished), its KV block table and the times of its events. The
// scheduler and the block manager update it; the engine (or the simulator) reads it to build a
// batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/sampling.h"
#include "model/token_constraint.h"

namespace flashserve::serve {

enum class SeqState : int32_t {
  kWaiting,         // arrived, not yet scheduled
  kRunningPrefill,  // holds blocks; its prompt (after a preemption, also what it had generated)
                    // is not all in the cache yet: its last chunk will sample a token
  kRunningDecode,   // every token but the last sampled one is in the KV cache; one new token a step
  kPreempted,       // its blocks were taken back; it will recompute from scratch
  kFinished,        // produced max_output_tokens tokens (or its stop token), or was aborted
};

const char* to_string(SeqState s);

// Why a request finished (what an API reports as finish_reason).
enum class FinishReason : int32_t {
  kNone,    // not finished
  kEos,     // sampled the model's end-of-sequence token
  kStop,    // sampled one of the request's stop tokens
  kLength,  // produced max_output_tokens tokens
  kAbort,   // dropped by Scheduler::abort (a client went away)
};

const char* to_string(FinishReason r);

struct Sequence {
  int64_t id = 0;
  std::vector<int32_t> prompt;     // prompt token ids
  std::vector<int32_t> generated;  // sampled token ids, in order
  int64_t max_output_tokens = 0;   // the request finishes after exactly this many sampled tokens
  // ...or earlier, when it samples one of eos_tokens (the model's; none in benchmarks and the
  // simulator) or of stop_tokens (the request's). The stopping token is kept in `generated`.
  std::vector<int32_t> eos_tokens;
  std::vector<int32_t> stop_tokens;
  model::SamplingParams sampling;  // how the engine draws its tokens (the simulator ignores it)
  // What it may generate next (structured output's grammar), fed each sampled token; null:
  // anything (the simulator ignores it).
  std::shared_ptr<model::TokenConstraint> constraint;
  // -1: no log-probabilities; n >= 0: each sampled token's, and the n most likely tokens' at its
  // position (model/logprobs.h; the simulator ignores it).
  int32_t logprobs = -1;
  bool aborted = false;  // finished by Scheduler::abort, not by generation
  FinishReason finish_reason = FinishReason::kNone;

  SeqState state = SeqState::kWaiting;
  // Tokens whose K and V are in the cache. A token is "computed" once a forward pass has run over
  // it; the last sampled token is not computed until the next decode step feeds it back.
  int64_t num_computed = 0;
  // Prompt tokens its first admission found in the prefix cache (not computed again): the
  // usage's cached_tokens.
  int64_t num_cached_prompt = 0;
  std::vector<int32_t> block_table;  // physical KV block ids, in logical order
  int32_t num_preemptions = 0;

  // Times in seconds on the caller's clock (wall clock for the engine, simulated for the
  // simulator).
  double arrival_time = 0;
  double first_scheduled_time = -1;  // start of the first step that included it (-1: not yet)
  double finish_time = -1;
  std::vector<double> token_times;  // token_times[i]: when generated[i] became available

  int64_t prompt_len() const { return static_cast<int64_t>(prompt.size()); }
  int64_t num_generated() const { return static_cast<int64_t>(generated.size()); }
  // Every token the model has to see: the prompt and everything sampled so far.
  int64_t num_tokens() const { return prompt_len() + num_generated(); }
  // Tokens that still need a forward pass before the next token can be sampled: the remaining
  // prompt (plus, after a preemption, the generated tokens to recompute), or 1 for a decode.
  int64_t num_uncomputed() const { return num_tokens() - num_computed; }
  bool is_finished() const { return state == SeqState::kFinished; }
  bool is_running() const {
    return state == SeqState::kRunningPrefill || state == SeqState::kRunningDecode;
  }
  // Token at logical position i (prompt first, then generated).
  int32_t token_at(int64_t i) const {
    return i < prompt_len() ? prompt[i] : generated[i - prompt_len()];
  }
};

}  // namespace flashserve::serve
