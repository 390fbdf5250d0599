// A Batch flattened into the arrays a model forward consumes: the new tokens and their positions
// (for the embedding and RoPE), the varlen query offsets, the KV lengths and a padded block table
// (the paged attention contract of include/flashserve/attention.h), the KV slot each new token's K
// and V go to, and the rows whose logits are sampled. Built once per step on the host.
#pragma once

#include <cstdint>
#include <vector>

#include "serve/batch.h"

namespace flashserve::serve {

struct BatchLayout {
  int64_t batch = 0;          // entries
  int64_t total_q = 0;        // new tokens in the step
  int64_t pages_per_seq = 0;  // width of block_table: the longest table in the batch
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  std::vector<int32_t> input_ids;     // [total_q]
  std::vector<int32_t> positions;     // [total_q] absolute position of each new token
  std::vector<int32_t> slot_mapping;  // [total_q] block * block_size + offset of its K/V
  std::vector<int32_t> cu_seqlens_q;  // [batch + 1]
  std::vector<int32_t> seqused_k;     // [batch] kv_len of each entry
  // [batch, pages_per_seq] row-major. Entries past a sequence's own table repeat its first block so
  // that every id is valid; the kernels never read them (they stop at seqused_k).
  std::vector<int32_t> block_table;
  std::vector<int32_t>
      sample_rows;  // for each sampling entry, in entry order: its last token's row
};

// Throws Error(kInternal) if an entry's block table does not cover its kv_len.
BatchLayout layout_batch(const Batch& batch, int32_t block_size);

}  // namespace flashserve::serve
