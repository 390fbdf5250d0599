#include "serve/batch_layout.h"

#include <string>
#include <vector>

#include "flashserve/error.h"

namespace flashserve::serve {

model::ForwardBatch layout_batch(const Batch& batch, int32_t block_size) {
  if (block_size < 1)
    throw Error(ErrorKind::kInvalidArgument, "block_size", std::to_string(block_size));
  model::ForwardBatchBuilder builder(block_size);
  std::vector<int32_t> tokens;
  for (const BatchEntry& e : batch.entries) {
    if (static_cast<int64_t>(e.block_table().size()) * block_size < e.kv_len)
      throw Error(ErrorKind::kInternal, "layout_batch",
                  "sequence " + std::to_string(e.seq->id) + "'s blocks do not cover " +
                      std::to_string(e.kv_len) + " tokens");
    tokens.clear();
    for (int64_t p = e.q_start; p < e.kv_len; ++p) tokens.push_back(e.seq->token_at(p));
    builder.add(tokens.data(), e.q_start, e.kv_len - e.q_start, e.block_table(), e.samples);
  }
  return std::move(builder).build();
}

}  // namespace flashserve::serve
