#include "attention/reference/combine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/reference/online_softmax.h"
#include "common/half.h"
#include "common/thread_pool.h"

namespace flashserve::attention {

void combine_row(const SplitPartials& p, int64_t row, int64_t h, float* out, float* lse) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  float m = neg_inf;
  for (int64_t s = 0; s < p.num_splits; ++s) m = nan_max(m, p.lse_at(s, row, h));
  std::fill(out, out + p.head_dim_v, 0.0f);
  // A NaN split (NaN input or overflowing score) makes m, total and every weight NaN below.
  if (m == neg_inf) {  // no split saw a key of this row
    *lse = neg_inf;
    return;
  }
  float total = 0.0f;
  for (int64_t s = 0; s < p.num_splits; ++s) total += std::exp(p.lse_at(s, row, h) - m);
  const float inv = 1.0f / total;
  for (int64_t s = 0; s < p.num_splits; ++s) {
    const float w = std::exp(p.lse_at(s, row, h) - m) * inv;
    if (w == 0.0f) continue;  // also skips empty splits, whose partial holds zeros anyway
    const float* o = p.out_at(s, row, h);
    for (int64_t d = 0; d < p.head_dim_v; ++d) out[d] += w * o[d];
  }
  *lse = m + std::log(total);
}

void combine_splits(const SplitPartials& p, const std::vector<RowSpan>& spans,
                    const AttentionParams& params, const Problem& pr, const HostLayout& L,
                    ThreadPool& pool) {
  // One task per span and block of 64 query rows: coarse enough that the wake-up is noise.
  constexpr int64_t kRowsPerTask = 64;
  std::vector<int64_t> first_task(spans.size() + 1, 0);
  for (size_t i = 0; i < spans.size(); ++i)
    first_task[i + 1] =
        first_task[i] + (spans[i].t1 - spans[i].t0 + kRowsPerTask - 1) / kRowsPerTask;
  pool.parallel_for(first_task.back(), [&](int64_t task, int) {
    const size_t i =
        std::upper_bound(first_task.begin(), first_task.end(), task) - first_task.begin() - 1;
    const int64_t b = spans[i].b;
    const int64_t t0 = spans[i].t0 + (task - first_task[i]) * kRowsPerTask;
    const int64_t t1 = std::min(spans[i].t1, t0 + kRowsPerTask);
    std::vector<float> out(pr.head_dim_v);
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < pr.h_q; ++h) {
        float lse;
        combine_row(p, L.q_row(b, t), h, out.data(), &lse);
        store_row(params.out.data, params.out.dtype, L.out_offset(b, t, h), pr.head_dim_v,
                  out.data());
        if (params.lse.defined()) params.lse.ptr<float>()[L.lse_offset(b, t, h)] = lse;
      }
  });
}

}  // namespace flashserve::attention
