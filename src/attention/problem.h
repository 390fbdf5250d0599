// What validation learns about a call: the resolved shape of the problem, so that every backend
// reads sizes from one place instead of re-deriving them from the tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "flashserve/attention.h"
#include "mask.h"
#include "score_mod.h"

namespace flashserve::attention {

struct Problem {
  int64_t batch = 0;
  int64_t h_q = 0, h_kv = 0;
  int64_t head_dim = 0, head_dim_v = 0;
  int64_t max_q_len = 0, max_kv_len = 0;  // dense: the tensor's seqlen; else from params/host data
  bool varlen_q = false, varlen_k = false, paged = false, seqused = false;
  int64_t page_size = 0, num_pages = 0, pages_per_seq = 0;
  float scale = 0.0f;  // softmax scale applied to q.k
  Mask mask;
  ScoreMod score_mod;  // softcap and ALiBi (the slopes' host pointer only on the CPU)
  int32_t num_splits = 1;
  Device device;
  DType dtype = DType::kFloat32;      // of q (and of k, v and out unless fp8 says otherwise)
  DType kv_dtype = DType::kFloat32;   // of k and v: q's, or float8_e4m3fn (attention.h)
  DType out_dtype = DType::kFloat32;  // q's, or bfloat16 when q is float8_e4m3fn
  bool fp8() const { return dtype == DType::kFloat8E4M3 || kv_dtype == DType::kFloat8E4M3; }
};

// What every tensor argument must satisfy: the rank, sizes and strides >= 0, a contiguous last
// dimension, a data pointer unless empty, an extent that fits in 64 bits. Throws an Error naming
// `name`.
void check_view(const TensorView& t, const char* name, int rank);

// Whether two well-formed views (check_view passed) share any byte of memory: element-exact, so
// views of one buffer whose elements interleave without meeting (K and V split from one tensor)
// do not overlap. Answers true in the (never seen) case where the search exceeds its budget.
bool overlaps(const TensorView& a, const TensorView& b);
// True when two distinct elements of a well-formed view share memory (e.g. a zero stride on a
// dimension of size > 1): an output must not, or writes would race.
bool aliases_itself(const TensorView& t);

// Validates params (throws flashserve::Error) and returns the resolved problem.
Problem describe(const AttentionParams& params);

// Host-side addressing of one call whose length/table tensors are in host memory: the CPU path
// and the tests use it. Offsets are in elements of the respective tensor.
class HostLayout {
 public:
  HostLayout(const AttentionParams& params, const Problem& problem);

  int64_t q_len(int64_t b) const { return q_len_[b]; }
  int64_t kv_len(int64_t b) const { return kv_len_[b]; }
  // Query t of sequence b as a row of q in order (dense b * seqlen_q + t, varlen
  // cu_seqlens_q[b] + t): the row order of the split-KV partials and of the reference's output.
  int64_t q_row(int64_t b, int64_t t) const { return q_start_[b] + t; }
  int64_t q_rows() const;  // rows of q (varlen: total_q, including rows of no sequence)
  // Offset of q[b, t, h, 0] (also out, by out's strides via out_offset).
  int64_t q_offset(int64_t b, int64_t t, int64_t h) const;
  int64_t out_offset(int64_t b, int64_t t, int64_t h) const;
  int64_t k_offset(int64_t b, int64_t j, int64_t h) const;
  int64_t v_offset(int64_t b, int64_t j, int64_t h) const;
  int64_t lse_offset(int64_t b, int64_t t, int64_t h) const;  // requires params.lse
  // The descale factor of sequence b, KV head hk in `descale` (params.q/k/v_descale): 1 when
  // absent.
  static float descale(const TensorView& descale, int64_t b, int64_t hk) {
    if (!descale.defined()) return 1.0f;
    return descale.ptr<const float>()[b * descale.stride[0] + hk * descale.stride[1]];
  }

 private:
  int64_t kv_row(const TensorView& t, int64_t b, int64_t j, int64_t h) const;
  const AttentionParams& p_;
  const Problem& pr_;
  std::vector<int64_t> q_start_, kv_start_, q_len_, kv_len_;
};

}  // namespace flashserve::attention
