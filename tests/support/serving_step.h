// A serving step as the GPU attention tests build it: a batch of prefill chunks and single-token
// decodes over a paged cache (varlen q, causal by default), and the host-side lengths the
// scheduler would pass to plan_attention.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "attention/backends.h"
#include "support/attention_case.h"

namespace flashserve::testing {

// The host-side lengths of a case, as the scheduler would pass them.
struct HostLens {
  std::vector<int32_t> cu_q, kv;
  explicit HostLens(const CaseSpec& s) {
    cu_q.push_back(0);
    for (int64_t b = 0; b < s.batch; ++b) {
      cu_q.push_back(static_cast<int32_t>(cu_q.back() + s.q_len(b)));
      kv.push_back(static_cast<int32_t>(s.kv_len(b)));
    }
  }
  AttentionLengths view(const CaseSpec& s) const {
    return {s.q_layout == QLayout::kVarlen ? cu_q.data() : nullptr, kv.data()};
  }
};

// A bfloat16 step of these query and key lengths over pages of `page` keys, splits left to the
// plan.
inline CaseSpec serving_step(int64_t d, int64_t page, int64_t h_q, int64_t h_kv,
                             std::vector<int64_t> q_lens, std::vector<int64_t> kv_lens,
                             bool causal = true) {
  CaseSpec s;
  s.dtype = DType::kBFloat16;
  s.head_dim = d;
  s.batch = static_cast<int64_t>(q_lens.size());
  s.q_lens = std::move(q_lens);
  s.kv_lens = std::move(kv_lens);
  s.h_q = h_q;
  s.h_kv = h_kv;
  s.causal = causal;
  s.q_layout = QLayout::kVarlen;
  s.kv_layout = KVLayout::kPaged;
  s.page_size = page;
  s.num_splits = 0;
  return s;
}

}  // namespace flashserve::testing
