// Split-KV combine on the CPU (the twin of the CUDA combine kernel). When the keys of a sequence
// are divided into S splits, split s produces, for every (query row, head), a partial output
// normalised over its own keys, o_s = sum_j exp(x_j - lse_s) v_j, and that split's log-sum-exp
// lse_s (natural log; -inf and o_s = 0 when the split saw no key of the row). The exact result is
//   lse = log(sum_s exp(lse_s)),   out = sum_s exp(lse_s - lse) o_s,
// evaluated with the largest lse_s subtracted first so nothing overflows.
//
// Scratch layout (float32, one block per split so a split's writes are contiguous):
//   out partials  [num_splits, rows, h_q, head_dim_v]
//   lse partials  [num_splits, rows, h_q]
// where rows are the query rows of q in order (dense b * seqlen_q + t, varlen cu_seqlens_q[b] + t).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention/problem.h"
#include "flashserve/attention.h"

namespace flashserve {
class ThreadPool;
}

namespace flashserve::attention {

// Holds the partials of the query rows [row_base, row_base + rows): the CPU path runs the rows in
// chunks whose partials fit a fixed budget (cpu_forward.cc), so that the scratch is not
// O(num_splits x all rows).
struct SplitPartials {
  float* out = nullptr;
  float* lse = nullptr;
  int64_t num_splits = 0, rows = 0, h_q = 0, head_dim_v = 0;
  int64_t row_base = 0;

  static size_t bytes(int64_t num_splits, int64_t rows, int64_t h_q, int64_t head_dim_v) {
    return static_cast<size_t>(num_splits * rows * h_q * (head_dim_v + 1)) * sizeof(float);
  }
  float* out_at(int64_t split, int64_t row, int64_t h) const {
    return out + ((split * rows + row - row_base) * h_q + h) * head_dim_v;
  }
  float& lse_at(int64_t split, int64_t row, int64_t h) const {
    return lse[(split * rows + row - row_base) * h_q + h];
  }
};

// Merges the partials of one (row, head) into out[0, head_dim_v) and *lse.
void combine_row(const SplitPartials& partials, int64_t row, int64_t h, float* out, float* lse);

// Queries [t0, t1) of sequence b: a stretch of rows whose partials are held together.
struct RowSpan {
  int64_t b, t0, t1;
};

// Merges the rows of `spans` (whose partials `partials` holds) and writes params.out (rounded to
// its dtype) and params.lse (when given), using `pool`.
void combine_splits(const SplitPartials& partials, const std::vector<RowSpan>& spans,
                    const AttentionParams& params, const Problem& problem, const HostLayout& layout,
                    ThreadPool& pool);

}  // namespace flashserve::attention
