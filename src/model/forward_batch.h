// One step's batch as the model forward consumes it: the new tokens and their positions (for the
// embedding and RoPE), the varlen query offsets, the KV lengths and a padded block table (the paged
// attention contract of include/flashserve/attention.h), the KV slot each new token's K and V go
// to, and the rows whose logits are sampled. All host arrays; serve::layout_batch fills it.
#pragma once

#include <cstdint>
#include <vector>

namespace flashserve::model {

struct ForwardBatch {
  int64_t batch = 0;          // entries (sequences)
  int64_t total_q = 0;        // new tokens in the step
  int64_t pages_per_seq = 0;  // width of block_table: the longest table in the batch
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
  std::vector<int32_t> input_ids;     // [total_q]
  std::vector<int32_t> positions;     // [total_q] absolute position of each new token
  std::vector<int32_t> slot_mapping;  // [total_q] block * block_size + offset of its K/V
  std::vector<int32_t> cu_seqlens_q;  // [batch + 1]
  std::vector<int32_t> seqused_k;     // [batch] kv_len of each entry (cached + new tokens)
  // [batch, pages_per_seq] row-major. Entries past a sequence's own table repeat its first block so
  // that every id is valid; the kernels never read them (they stop at seqused_k).
  std::vector<int32_t> block_table;
  // Rows (into the step's total_q tokens) whose logits are computed and sampled, in entry order:
  // the last new token of each entry that samples.
  std::vector<int32_t> sample_rows;

  // Throws Error(kInvalidArgument) naming the first inconsistent field (sizes, monotone
  // cu_seqlens, q_len <= kv_len, rows in range). Block ids are checked by the runner (it knows the
  // pool size).
  void validate() const;
};

// Builds a ForwardBatch entry by entry (serve's layout_batch, generate, the tests).
class ForwardBatchBuilder {
 public:
  explicit ForwardBatchBuilder(int32_t block_size);
  // One sequence: its new tokens new_tokens[0, q_len) at positions q_start .. q_start + q_len - 1
  // (so kv_len = q_start + q_len), its K/V in `blocks` (covering kv_len), and whether its last new
  // token's logits are sampled. Error(kInternal) if the blocks do not cover kv_len.
  void add(const int32_t* new_tokens, int64_t q_start, int64_t q_len,
           const std::vector<int32_t>& blocks, bool samples);
  ForwardBatch build() &&;

 private:
  int32_t block_size_;
  ForwardBatch b_;
  std::vector<std::vector<int32_t>> tables_;
};

}  // namespace flashserve::model
