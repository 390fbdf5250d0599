// A serving step as the CUDA plan's CPU tests describe it (src/attention/cuda/plan.h, no GPU): a
// varlen, causal, 32/8-head step over a cache of 16-key pages with given (q_len, kv_len)
// sequences, and the H200's figures as the device.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "attention/cuda/plan.h"

namespace flashserve::testing {

inline constexpr attention::SplitDevice kPlanH200{132, 228 * 1024};

struct PlanStep {
  attention::Problem pr;
  attention::HostLengths lens;
  attention::PlanContext ctx;
};

inline PlanStep plan_step(const std::vector<std::pair<int64_t, int64_t>>& seqs,
                          int64_t head_dim = 128, int32_t num_splits = 0) {
  PlanStep s;
  s.pr.batch = static_cast<int64_t>(seqs.size());
  s.pr.h_q = 32;
  s.pr.h_kv = 8;
  s.pr.head_dim = s.pr.head_dim_v = head_dim;
  s.pr.varlen_q = true;
  s.pr.paged = true;
  s.pr.page_size = 16;
  s.pr.mask.right = 0;
  s.pr.num_splits = num_splits;
  s.lens.q_start.push_back(0);
  for (auto [q, kv] : seqs) {
    s.lens.q_start.push_back(s.lens.q_start.back() + q);
    s.lens.kv_len.push_back(kv);
    s.pr.max_q_len = std::max(s.pr.max_q_len, q);
    s.pr.max_kv_len = std::max(s.pr.max_kv_len, kv);
  }
  s.ctx.device = kPlanH200;
  s.ctx.q_rows = s.lens.q_start.back();
  return s;
}

}  // namespace flashserve::testing
