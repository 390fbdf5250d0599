#include "serve/batch_layout.h"

#include <algorithm>
#include <string>

#include "flashserve/error.h"

namespace flashserve::serve {

BatchLayout layout_batch(const Batch& batch, int32_t block_size) {
  if (block_size < 1)
    throw Error(ErrorKind::kInvalidArgument, "block_size", std::to_string(block_size));
  BatchLayout l;
  l.batch = static_cast<int64_t>(batch.entries.size());
  l.cu_seqlens_q.push_back(0);
  for (const BatchEntry& e : batch.entries) {
    const auto& table = e.block_table();
    if (static_cast<int64_t>(table.size()) * block_size < e.kv_len)
      throw Error(ErrorKind::kInternal, "layout_batch",
                  "sequence " + std::to_string(e.seq->id) + "'s blocks do not cover " +
                      std::to_string(e.kv_len) + " tokens");
    l.pages_per_seq = std::max<int64_t>(l.pages_per_seq, static_cast<int64_t>(table.size()));
    l.max_seqlen_q = std::max(l.max_seqlen_q, e.q_len);
    l.max_seqlen_k = std::max(l.max_seqlen_k, e.kv_len);
    for (int64_t p = e.q_start; p < e.kv_len; ++p) {
      l.input_ids.push_back(e.seq->token_at(p));
      l.positions.push_back(static_cast<int32_t>(p));
      l.slot_mapping.push_back(table[p / block_size] * block_size +
                               static_cast<int32_t>(p % block_size));
    }
    l.cu_seqlens_q.push_back(static_cast<int32_t>(l.input_ids.size()));
    l.seqused_k.push_back(static_cast<int32_t>(e.kv_len));
    if (e.samples) l.sample_rows.push_back(l.cu_seqlens_q.back() - 1);
  }
  l.total_q = static_cast<int64_t>(l.input_ids.size());
  l.block_table.reserve(l.batch * l.pages_per_seq);
  for (const BatchEntry& e : batch.entries) {
    const auto& table = e.block_table();
    for (int64_t j = 0; j < l.pages_per_seq; ++j)
      l.block_table.push_back(
          j < static_cast<int64_t>(table.size()) ? table[j] : (table.empty() ? 0 : table[0]));
  }
  return l;
}

}  // namespace flashserve::serve
