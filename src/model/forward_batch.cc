#include "model/forward_batch.h"

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
    if (seqused_k[b] > max_seqlen_k) bad("max_seqlen_k", entry + " has " + std::to_string(seqused_k[b]));
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

}  // namespace flashserve::model
