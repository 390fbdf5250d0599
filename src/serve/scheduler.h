// The scheduler decides, once per step, which sequences run and how many of their tokens: it owns
// the waiting queue and the running set, asks the block manager for KV blocks, preempts (by
// recompute) when blocks run out, and after the forward pass records the sampled tokens.
//
// Policies (one interface, chosen by SchedulerConfig::policy; names and defaults in policy.h):
//   sarathi  stall-free chunked prefill (Sarathi-Serve): per step a token budget; first every
//            running decode, then the partial prefills, then new requests FIFO, each prefill cut
//            to what is left of the budget (rounded down to a multiple of chunk_tile unless it is
//            the last chunk or less than a tile is left).
//   vllm-v1  today's vLLM: no prefill or decode phase. The running requests in admission order
//            each get min(tokens left to compute, long_prefill_token_threshold if set, budget
//            left); then, only in a step that preempted nothing, waiting requests FIFO the same
//            way. Blocks are allocated for the chunk scheduled, not the whole prompt, with no
//            watermark; when they run out the latest-admitted running request is preempted.
//   vllm-v0  prefill-first: whole prompts run in steps of their own; decodes wait while they do.
//   orca     iteration-level, memory-bound (Sarathi-Serve's Orca): each admitted request reserves
//            max_model_len tokens of KV (Orca has no paged cache), no watermark, up to max_running
//            requests; whole prompts mixed with the running decodes, no chunking, no token cap.
//   static   request-level: up to max_running whole prompts are admitted only when the previous
//            batch has fully finished; no token cap.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "serve/batch.h"
#include "serve/block_manager.h"
#include "serve/policy.h"
#include "serve/sequence.h"

namespace flashserve::serve {

struct SchedulerConfig {
  Policy policy = Policy::kSarathi;
  // The token budget of sarathi and vllm-v1 (vLLM's max_num_batched_tokens); for vllm-v0 (which
  // never chunks) the largest batch of prompt tokens one step may take, so it must be at least
  // max_model_len; orca and static have no token cap and ignore it.
  int64_t max_tokens_per_step = 512;
  int64_t max_running = 256;     // sequences holding KV blocks at once (vLLM's max_num_seqs)
  int64_t max_model_len = 8192;  // prompt + output tokens of one request
  int64_t chunk_tile = 64;  // sarathi: non-final chunks are a multiple of this (1: no rounding)
  // vllm-v1: the most prompt tokens one request computes in a step (vLLM's
  // long_prefill_token_threshold; 0: no cap beyond the budget, vLLM's default).
  int64_t long_prefill_token_threshold = 0;

  void validate() const;  // throws Error naming the field
};

class Scheduler {
 public:
  static std::unique_ptr<Scheduler> create(const SchedulerConfig& config, BlockManager& blocks);
  virtual ~Scheduler() = default;

  // Queues a request. Throws Error(kInvalidArgument) if it can never run: empty prompt, no output,
  // or prompt + output longer than max_model_len.
  void add(std::unique_ptr<Sequence> seq);
  // Forms the next step's batch. `now` stamps first_scheduled_time. The batch may be empty only
  // when nothing is runnable (no requests, or all waiting ones blocked on KV blocks).
  Batch schedule(double now);
  // Records the step's outcome at time `now`: advances computed tokens, appends sampled[i] for
  // every entry i that samples, finishes and frees the sequences that reached their output length
  // and returns them. `sampled` is indexed like batch.entries (values of non-sampling entries
  // unused).
  std::vector<std::unique_ptr<Sequence>> complete(const Batch& batch,
                                                  const std::vector<int32_t>& sampled, double now);

  // Drops a request wherever it is (a client went away), freeing its blocks. Returns it, marked
  // finished and aborted, or nullptr if the scheduler does not hold it. Not between schedule() and
  // complete() of a batch that contains it.
  std::unique_ptr<Sequence> abort(int64_t id, double now);

  const SchedulerConfig& config() const { return config_; }
  // Changes max_tokens_per_step between steps (--budget auto). Throws Error(kInvalidArgument) for
  // a budget the configuration would refuse, and changes nothing then.
  void set_token_budget(int64_t budget);
  const BlockManager& blocks() const { return blocks_; }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  // Every sequence the scheduler holds (waiting and running), for invariant checks.
  std::vector<const Sequence*> live() const;
  // Running sequences in priority (admission) order.
  std::vector<const Sequence*> running() const;
  // Prefix caching: prompt tokens admitted sequences could have found in full cached blocks, and
  // those they found (computed once, not again).
  int64_t prefix_queried_tokens() const { return prefix_queried_tokens_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }

 protected:
  Scheduler(const SchedulerConfig& config, BlockManager& blocks);
  virtual void form(Batch& batch) = 0;  // the policy

  // Helpers shared by the policies.
  // Adds every running decode (1 token each), preempting from the back of the running set when
  // blocks run out. Returns the number of decode tokens added.
  int64_t add_decodes(Batch& batch);
  // Makes room for `seq` to hold `kv_len` tokens, preempting the lowest-priority running sequences
  // not yet in `batch`; preempts `seq` itself if that is not enough. Returns whether seq can run.
  bool reserve(Sequence* seq, int64_t kv_len, Batch& batch);
  // How admit_head gives the head its blocks.
  struct Admission {
    // Blocks for at least this many tokens (orca: max_model_len), and for all of its own.
    int64_t reserve_tokens = 0;
    // > 0: blocks only for the first chunk, of at most this many tokens (vllm-v1 allocates chunk
    // by chunk); reserve_tokens is then unused.
    int64_t chunk_tokens = 0;
  };
  // Moves the head of the waiting queue to the running set if max_running and the blocks allow
  // it (leaving the watermark free where the policy keeps one), and gives it the blocks `how`
  // says; returns it or nullptr.
  Sequence* admit_head(const Admission& how);
  Sequence* admit_head() { return admit_head(Admission{}); }
  // Whether admission leaves the block manager's watermark free (not for orca and vllm-v1).
  bool admits_with_watermark() const;
  // The running sequence to preempt so that `seq` can grow: the lowest-priority one not in
  // `batch`, sparing prefills already under way while anything else is left; nullptr if none.
  Sequence* victim_for(const Sequence* seq, const Batch& batch) const;
  void add_entry(Batch& batch, Sequence* seq, int64_t q_len);
  void preempt(Sequence* seq, Batch& batch);
  bool in_batch(const Batch& batch, const Sequence* seq) const;

  SchedulerConfig config_;
  BlockManager& blocks_;
  std::deque<std::unique_ptr<Sequence>> waiting_;   // preempted sequences go back to the front
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order = priority order
  int64_t prefix_queried_tokens_ = 0, prefix_hit_tokens_ = 0;
};

}  // namespace flashserve::serve
