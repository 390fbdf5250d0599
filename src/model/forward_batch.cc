#include "model/forward_batch.h"

#include <algorithm>
#include <string>

#include "flashserve/error.h"

namespace flashserve::model {

namespace {
[[noreturn]] void bad(const std::string& field, const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, "batch." + field, what);
}
}  // namespace

void ForwardBatch::validate() const {
  auto size_is = [&](const std::vector<int32_t>& v, int64_t n, const char* field) {
    if (static_cast<int64_t>(v.size()) != n)
      bad(field, "has " + std::to_string(v.size()) + " entries, expected " + std::to_string(n));
  };
  if (batch < 0 || total_q < 0 || pages_per_seq < 0) bad("batch", "negative size");
  size_is(input_ids, total_q, "input_ids");
  size_is(positions, total_q, "positions");
  size_is(slot_mapping, total_q, "slot_mapping");
  size_is(cu_seqlens_q, batch + 1, "cu_seqlens_q");
  size_is(seqused_k, batch, "seqused_k");
  size_is(block_table, batch * pages_per_seq, "block_table");
  if (cu_seqlens_q[0] != 0) bad("cu_seqlens_q", "must start at 0");
  if (cu_seqlens_q[batch] != total_q) bad("cu_seqlens_q", "must end at total_q");
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q_len = cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    const std::string entry = "entry " + std::to_string(b);
    if (q_len < 0) bad("cu_seqlens_q", "decreases at " + entry);
    if (q_len > max_seqlen_q) bad("max_seqlen_q", entry + " has " + std::to_string(q_len));
    if (seqused_k[b] < q_len) bad("seqused_k", entry + ": fewer keys than new tokens");
    if (seqused_k[b] > max_seqlen_k)
      bad("max_seqlen_k", entry + " has " + std::to_string(seqused_k[b]));
    // The new tokens are the last q_len of the kv_len: their positions are fixed by that.
    for (int64_t t = 0; t < q_len; ++t)
      if (positions[cu_seqlens_q[b] + t] != seqused_k[b] - q_len + t)
        bad("positions", entry + ": token " + std::to_string(t) + " is at " +
                             std::to_string(positions[cu_seqlens_q[b] + t]) + ", expected " +
                             std::to_string(seqused_k[b] - q_len + t));
  }
  int32_t prev = -1;
  for (int32_t r : sample_rows) {
    if (r < 0 || r >= total_q) bad("sample_rows", std::to_string(r) + " is out of range");
    if (r <= prev) bad("sample_rows", "must increase");
    prev = r;
  }
}

ForwardBatchBuilder::ForwardBatchBuilder(int32_t block_size) : block_size_(block_size) {
  if (block_size < 1)
    throw Error(ErrorKind::kInvalidArgument, "block_size", std::to_string(block_size));
  b_.cu_seqlens_q.push_back(0);
}

void ForwardBatchBuilder::add(const int32_t* new_tokens, int64_t q_start, int64_t q_len,
                              const std::vector<int32_t>& blocks, bool samples) {
  const int64_t kv_len = q_start + q_len;
  if (q_start < 0 || q_len < 0)
    throw Error(ErrorKind::kInternal, "ForwardBatchBuilder", "negative q_start or q_len");
  if (static_cast<int64_t>(blocks.size()) * block_size_ < kv_len)
    throw Error(ErrorKind::kInternal, "ForwardBatchBuilder",
                "entry " + std::to_string(b_.batch) + "'s blocks do not cover " +
                    std::to_string(kv_len) + " tokens");
  for (int64_t t = 0; t < q_len; ++t) {
    const int64_t p = q_start + t;
    b_.input_ids.push_back(new_tokens[t]);
    b_.positions.push_back(static_cast<int32_t>(p));
    b_.slot_mapping.push_back(blocks[p / block_size_] * block_size_ +
                              static_cast<int32_t>(p % block_size_));
  }
  b_.cu_seqlens_q.push_back(static_cast<int32_t>(b_.input_ids.size()));
  b_.seqused_k.push_back(static_cast<int32_t>(kv_len));
  if (samples) b_.sample_rows.push_back(b_.cu_seqlens_q.back() - 1);
  b_.max_seqlen_q = std::max(b_.max_seqlen_q, q_len);
  b_.max_seqlen_k = std::max(b_.max_seqlen_k, kv_len);
  b_.pages_per_seq = std::max<int64_t>(b_.pages_per_seq, static_cast<int64_t>(blocks.size()));
  tables_.push_back(blocks);
  ++b_.batch;
}

ForwardBatch ForwardBatchBuilder::build() && {
  b_.total_q = static_cast<int64_t>(b_.input_ids.size());
  b_.block_table.reserve(static_cast<size_t>(b_.batch * b_.pages_per_seq));
  for (const auto& table : tables_)
    for (int64_t j = 0; j < b_.pages_per_seq; ++j)
      b_.block_table.push_back(
          j < static_cast<int64_t>(table.size()) ? table[j] : (table.empty() ? 0 : table[0]));
  return std::move(b_);
}

}  // namespace flashserve::model
