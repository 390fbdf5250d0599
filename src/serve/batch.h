// What one step runs: for each scheduled sequence, how many new query tokens it contributes (a
// prefill chunk, or 1 for a decode), how many keys it attends to after this step, and its block
// table. This is exactly what a mixed prefill/decode attention launch needs (q_len[i], kv_len[i],
// block table; causal mask aligned bottom-right), so a model forward can consume it directly.
#pragma once

#include <cstdint>
#include <vector>

#include "serve/sequence.h"

namespace flashserve::serve {

struct BatchEntry {
  Sequence* seq = nullptr;
  int64_t q_start = 0;  // position of the first new token (= seq's computed tokens before the step)
  int64_t q_len = 0;    // new query tokens this step
  int64_t kv_len = 0;   // keys after the step: q_start + q_len
  bool is_prefill = false;
  bool samples = false;  // the step ends this sequence's prefill or is a decode: a token is sampled

  const std::vector<int32_t>& block_table() const { return seq->block_table; }
};

struct Batch {
  std::vector<BatchEntry> entries;  // in scheduling order (sarathi: decodes, then chunks)
  std::vector<int64_t> preempted;   // ids of the sequences preempted while forming this batch

  bool empty() const { return entries.empty(); }
  int64_t num_prefill_tokens() const;  // sum of q_len over prefill entries
  int64_t num_decode_tokens() const;   // number of decode entries
  int64_t num_tokens() const { return num_prefill_tokens() + num_decode_tokens(); }
  int64_t num_sampled() const;  // entries that sample a token
  int64_t kv_tokens() const;    // sum of kv_len over every entry
};

}  // namespace flashserve::serve
