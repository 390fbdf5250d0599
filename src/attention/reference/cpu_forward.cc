// cpu_forward: see cpu_forward.h for the shape of the algorithm.
#include "attention/reference/cpu_forward.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/backends.h"
#include "attention/reference/combine.h"
#include "attention/reference/online_softmax.h"
#include "common/half.h"
#include "common/thread_pool.h"

namespace flashserve::attention {
namespace {

constexpr float kLog2e = 1.44269504088896340736f;
constexpr int64_t kBK = CpuTiling::kBlockK;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Rows processed together by the micro-kernels: each key (value) element loaded from L1 feeds
// kRowGroup rows, and the kRowGroup x kVec accumulators stay in registers (8 SSE / 4 AVX
// registers).
constexpr int64_t kRowGroup = 4;
constexpr int64_t kVec = 8;

// S[r][j] = q_r . k_j for R rows and keys j in [j_begin, j_end), both multiples of kVec with
// j_end <= kBK. kt is the transposed key block [D][kBK]; S has rows of kBK.
template <int R>
void block_scores(const float* q, int64_t D, const float* kt, int64_t j_begin, int64_t j_end,
                  float* S) {
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kVec) {
    float c[R][kVec] = {};
    for (int64_t d = 0; d < D; ++d) {
      const float* k = kt + d * kBK + j0;
      for (int r = 0; r < R; ++r) {
        const float qd = q[r * D + d];
        for (int jj = 0; jj < kVec; ++jj) c[r][jj] += qd * k[jj];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int jj = 0; jj < kVec; ++jj) S[r * kBK + j0 + jj] = c[r][jj];
  }
}

// acc[r][:] += sum_{j in [j_begin, j_end)} P[r][j] * v[j][:] for R rows; v is [kBK][Dv].
template <int R>
void block_accumulate(const float* P, const float* v, int64_t Dv, int64_t j_begin, int64_t j_end,
                      float* acc) {
  int64_t d0 = 0;
  for (; d0 + kVec <= Dv; d0 += kVec) {
    float c[R][kVec];
    for (int r = 0; r < R; ++r)
      for (int dd = 0; dd < kVec; ++dd) c[r][dd] = acc[r * Dv + d0 + dd];
    for (int64_t j = j_begin; j < j_end; ++j) {
      const float* vr = v + j * Dv + d0;
      for (int r = 0; r < R; ++r) {
        const float p = P[r * kBK + j];
        for (int dd = 0; dd < kVec; ++dd) c[r][dd] += p * vr[dd];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int dd = 0; dd < kVec; ++dd) acc[r * Dv + d0 + dd] = c[r][dd];
  }
  for (; d0 < Dv; ++d0)  // head dims that are not a multiple of kVec
    for (int r = 0; r < R; ++r) {
      float c = acc[r * Dv + d0];
      for (int64_t j = j_begin; j < j_end; ++j) c += P[r * kBK + j] * v[j * Dv + d0];
      acc[r * Dv + d0] = c;
    }
}

template <typename F>
void with_rows(int64_t n, F&& f) {  // calls f.template operator()<R>() with R = n in 1..kRowGroup
  switch (n) {
    case 1:
      f.template operator()<1>();
      break;
    case 2:
      f.template operator()<2>();
      break;
    case 3:
      f.template operator()<3>();
      break;
    default:
      f.template operator()<4>();
      break;
  }
}

// Per-worker buffers, sized once per call: O(tile), independent of the sequence lengths.
struct Workspace {
  std::vector<float> q;                   // [rows, D], pre-multiplied by scale * log2(e)
  std::vector<float> acc;                 // [rows, Dv], unnormalised output
  std::vector<RunningSoftmax<float>> sm;  // [rows] running max and sum (log2 units)
  std::vector<float> kt;  // [D, kBK] the key block, transposed so scores vectorise over keys
  std::vector<float> v;   // [kBK, Dv] the value block
  std::vector<float> s;   // [kRowGroup, kBK] scores of a row group, then its probabilities
  std::vector<float> o;   // [Dv] one finished output row

  Workspace(int64_t rows, int64_t D, int64_t Dv)
      : q(rows * D),
        acc(rows * Dv),
        sm(rows),
        kt(D * kBK),
        v(kBK * Dv),
        s(kRowGroup * kBK),
        o(Dv) {}
  static size_t bytes(int64_t rows, int64_t D, int64_t Dv) {
    return sizeof(float) * static_cast<size_t>(rows * D + rows * Dv + 2 * rows + D * kBK +
                                               kBK * Dv + kRowGroup * kBK + Dv);
  }
};

struct Tile {
  int64_t b, hk, t0, t1, split;
};

class Forward {
 public:
  Forward(const AttentionParams& p, const Problem& pr, const HostLayout& L, int32_t splits)
      : p_(p),
        pr_(pr),
        L_(L),
        splits_(splits),
        group_(pr.h_q / pr.h_kv),
        bq_(CpuTiling::block_q(group_)),
        first_tile_(pr.batch + 1, 0) {
    // Tiles of sequence b are first_tile_[b] .. first_tile_[b+1]-1, ordered (q block, head, split).
    for (int64_t b = 0; b < pr.batch; ++b)
      first_tile_[b + 1] = first_tile_[b] + (L.q_len(b) + bq_ - 1) / bq_ * pr.h_kv * splits;
  }

  int64_t num_tiles() const { return first_tile_[pr_.batch]; }
  int64_t block_q() const { return bq_; }
  // The tiles of query block qb of sequence b (every head and split) are
  // [first_tile(b, qb), first_tile(b, qb) + tiles_per_block()).
  int64_t first_tile(int64_t b, int64_t qb) const {
    return first_tile_[b] + qb * tiles_per_block();
  }
  int64_t tiles_per_block() const { return pr_.h_kv * splits_; }
  int64_t rows_per_tile() const { return CpuTiling::tile_rows(group_); }

  Tile tile(int64_t i) const {
    const int64_t b =
        std::upper_bound(first_tile_.begin(), first_tile_.end(), i) - first_tile_.begin() - 1;
    int64_t r = i - first_tile_[b];
    const int64_t split = r % splits_;
    r /= splits_;
    const int64_t hk = r % pr_.h_kv;
    const int64_t t0 = r / pr_.h_kv * bq_;
    return {b, hk, t0, std::min(L_.q_len(b), t0 + bq_), split};
  }

  // Runs one tile; writes params.out/lse, or the split's partials when partials != nullptr.
  void run(const Tile& tl, Workspace& w, const SplitPartials* partials) const {
    const int64_t D = pr_.head_dim, Dv = pr_.head_dim_v, G = group_;
    const int64_t nq = L_.q_len(tl.b), nk = L_.kv_len(tl.b);
    const int64_t rows = (tl.t1 - tl.t0) * G;  // row r: query t0 + r / G, head hk * G + r % G
    const Mask& mask = pr_.mask;
    const float qmul = pr_.scale * kLog2e;  // exp(scale * x) = exp2(x * scale * log2(e))

    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = tl.t0 + r / G, h = tl.hk * G + r % G;
      load_row(p_.q.data, p_.q.dtype, L_.q_offset(tl.b, t, h), D, qmul, &w.q[r * D]);
    }
    std::fill(w.acc.begin(), w.acc.begin() + rows * Dv, 0.0f);
    std::fill(w.sm.begin(), w.sm.begin() + rows, RunningSoftmax<float>{});

    // Keys this tile may see: the union of its rows' windows (first_key and last_key are
    // non-decreasing in t), cut to this split's share of the keys.
    int64_t lo = mask.first_key(tl.t0, nq, nk), hi = mask.last_key(tl.t1 - 1, nq, nk) + 1;
    if (splits_ > 1) {
      // Splits are whole key blocks, so a split boundary never cuts a block.
      const int64_t chunk = ((nk + splits_ - 1) / splits_ + kBK - 1) / kBK * kBK;
      lo = std::max(lo, tl.split * chunk);
      hi = std::min(hi, (tl.split + 1) * chunk);
    }
    for (int64_t j0 = lo; j0 < hi; j0 += kBK) {
      const int64_t nb = std::min(kBK, hi - j0);
      load_block(tl, j0, nb, w);
      for (int64_t r0 = 0; r0 < rows; r0 += kRowGroup)
        process_rows(w, tl, r0, std::min(kRowGroup, rows - r0), j0, nb);
    }

    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = tl.t0 + r / G, h = tl.hk * G + r % G;
      const float lse = w.sm[r].lse();
      if (!w.sm[r].empty()) {
        const float inv = 1.0f / w.sm[r].l;  // NaN for a NaN row: its output is NaN
        for (int64_t d = 0; d < Dv; ++d) w.o[d] = w.acc[r * Dv + d] * inv;
      } else {  // the row saw no key (in this split)
        std::fill(w.o.begin(), w.o.end(), 0.0f);
      }
      if (partials) {
        const int64_t row = L_.q_row(tl.b, t);
        std::copy(w.o.begin(), w.o.end(), partials->out_at(tl.split, row, h));
        partials->lse_at(tl.split, row, h) = lse;
      } else {
        store_row(p_.out.data, p_.out.dtype, L_.out_offset(tl.b, t, h), Dv, w.o.data());
        if (p_.lse.defined()) p_.lse.ptr<float>()[L_.lse_offset(tl.b, t, h)] = lse;
      }
    }
  }

 private:
  // Converts keys [j0, j0 + nb) of the tile's KV head to float, once for the whole GQA group.
  void load_block(const Tile& tl, int64_t j0, int64_t nb, Workspace& w) const {
    const int64_t D = pr_.head_dim, Dv = pr_.head_dim_v;
    for (int64_t jj = 0; jj < nb; ++jj) {
      const int64_t koff = L_.k_offset(tl.b, j0 + jj, tl.hk);
      // Transpose while converting: kt[d][jj].
      switch (p_.k.dtype) {
        case DType::kFloat16: {
          const fp16_t* src = p_.k.ptr<const fp16_t>() + koff;
          for (int64_t d = 0; d < D; ++d) w.kt[d * kBK + jj] = to_float(src[d]);
          break;
        }
        case DType::kBFloat16: {
          const bf16_t* src = p_.k.ptr<const bf16_t>() + koff;
          for (int64_t d = 0; d < D; ++d) w.kt[d * kBK + jj] = to_float(src[d]);
          break;
        }
        default: {
          const float* src = p_.k.ptr<const float>() + koff;
          for (int64_t d = 0; d < D; ++d) w.kt[d * kBK + jj] = src[d];
          break;
        }
      }
      load_row(p_.v.data, p_.v.dtype, L_.v_offset(tl.b, j0 + jj, tl.hk), Dv, 1.0f, &w.v[jj * Dv]);
    }
  }

  // Folds the loaded key block (keys j0 .. j0 + nb - 1) into rows r0 .. r0 + n - 1 of the tile:
  // scores, running max / sum update, rescale and P V accumulation.
  void process_rows(Workspace& w, const Tile& tl, int64_t r0, int64_t n, int64_t j0,
                    int64_t nb) const {
    const int64_t D = pr_.head_dim, Dv = pr_.head_dim_v, G = group_;
    const int64_t nq = L_.q_len(tl.b), nk = L_.kv_len(tl.b);
    // Each row's visible keys within the block, [a[i], e[i]) relative to j0, and their union.
    int64_t a[kRowGroup], e[kRowGroup], ua = kBK, ue = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = tl.t0 + (r0 + i) / G;
      a[i] = std::max(pr_.mask.first_key(t, nq, nk), j0) - j0;
      e[i] = std::min(pr_.mask.last_key(t, nq, nk), j0 + nb - 1) - j0 + 1;
      if (a[i] < e[i]) ua = std::min(ua, a[i]), ue = std::max(ue, e[i]);
    }
    if (ua >= ue) return;  // no row of the group sees a key of this block
    float* S = w.s.data();
    // Whole kVec-wide column groups (columns past nb hold stale keys; they are masked below).
    const int64_t ca = ua / kVec * kVec, ce = (ue + kVec - 1) / kVec * kVec;
    with_rows(n, [&]<int R>() { block_scores<R>(&w.q[r0 * D], D, w.kt.data(), ca, ce, S); });
    for (int64_t i = 0; i < n; ++i) {
      float* s = S + i * kBK;
      if (a[i] >= e[i]) {  // this row sees nothing here: zero probabilities, state unchanged
        std::fill(s + ua, s + ue, 0.0f);
        continue;
      }
      std::fill(s + ua, s + a[i], kNegInf);
      std::fill(s + e[i], s + ue, kNegInf);
      const float corr = w.sm[r0 + i].add(s + ua, ue - ua);  // s becomes exp2(s - m), 0 if masked
      if (corr != 1.0f) {  // the max grew: rescale what has been accumulated so far
        float* acc = &w.acc[(r0 + i) * Dv];
        for (int64_t d = 0; d < Dv; ++d) acc[d] *= corr;
      }
    }
    with_rows(n, [&]<int R>() { block_accumulate<R>(S, w.v.data(), Dv, ua, ue, &w.acc[r0 * Dv]); });
  }

  const AttentionParams& p_;
  const Problem& pr_;
  const HostLayout& L_;
  const int64_t splits_, group_, bq_;
  std::vector<int64_t> first_tile_;
};

}  // namespace

int32_t cpu_num_splits(const Problem& pr, int workers) {
  if (pr.num_splits > 0) return pr.num_splits;
  const int64_t group = pr.h_q / pr.h_kv;
  const int64_t bq = CpuTiling::block_q(group);
  const int64_t tiles = pr.batch * pr.h_kv * ((pr.max_q_len + bq - 1) / bq);
  if (workers <= 1 || tiles == 0 || tiles >= workers) return 1;
  // Enough splits to give every worker a tile or two, but each split at least 4 key blocks.
  const int64_t want = (2 * workers + tiles - 1) / tiles;
  const int64_t most = pr.max_kv_len / (4 * CpuTiling::kBlockK);
  return static_cast<int32_t>(std::max<int64_t>(1, std::min<int64_t>({want, most, 64})));
}

namespace {

// The split-KV partials of all rows at once would be O(num_splits x rows): 95 MB of input with an
// explicit num_splits took 4.2 GB (issue 9). Rows run in chunks whose partials fit this budget
// (at least one query block per chunk); each chunk's rows are combined before the next starts.
constexpr int64_t kSplitPartialsBudget = int64_t{32} << 20;

int64_t split_chunk_rows(const Problem& pr, int32_t splits, int64_t total_q_rows) {
  const int64_t per_row =
      static_cast<int64_t>(SplitPartials::bytes(splits, 1, pr.h_q, pr.head_dim_v));
  const int64_t rows =
      std::max(CpuTiling::block_q(pr.h_q / pr.h_kv), kSplitPartialsBudget / per_row);
  return std::min(rows, total_q_rows);
}

}  // namespace

size_t cpu_scratch_bytes(const Problem& pr, int64_t total_q_rows, int workers) {
  const int64_t rows = CpuTiling::tile_rows(pr.h_q / pr.h_kv);
  size_t bytes = workers * Workspace::bytes(rows, pr.head_dim, pr.head_dim_v);
  const int32_t splits = cpu_num_splits(pr, workers);
  if (splits > 1)
    bytes += SplitPartials::bytes(splits, split_chunk_rows(pr, splits, total_q_rows), pr.h_q,
                                  pr.head_dim_v);
  return bytes;
}

void cpu_forward(const AttentionParams& params, const Problem& problem) {
  if (problem.device.type != DeviceType::kCPU)
    throw Error(ErrorKind::kInternal, "q", "cpu_forward called with non-CPU tensors");
  const HostLayout layout(params, problem);
  ThreadPool& pool = ThreadPool::global();
  const int32_t splits = cpu_num_splits(problem, pool.size());
  const Forward fwd(params, problem, layout, splits);

  std::vector<Workspace> workspaces;
  workspaces.reserve(pool.size());
  for (int i = 0; i < pool.size(); ++i)
    workspaces.emplace_back(fwd.rows_per_tile(), problem.head_dim, problem.head_dim_v);

  if (splits == 1) {
    pool.parallel_for(fwd.num_tiles(), [&](int64_t i, int worker) {
      fwd.run(fwd.tile(i), workspaces[worker], nullptr);
    });
    return;
  }
  const int64_t capacity = split_chunk_rows(problem, splits, layout.q_rows());
  std::vector<float> scratch(
      SplitPartials::bytes(splits, capacity, problem.h_q, problem.head_dim_v) / sizeof(float));
  SplitPartials partials{
      scratch.data(), scratch.data() + splits * capacity * problem.h_q * problem.head_dim_v,
      splits,         capacity,
      problem.h_q,    problem.head_dim_v};
  // Chunks of consecutive query blocks (in tile order, so each chunk's tiles are one contiguous
  // range and its rows one contiguous stretch of q).
  std::vector<RowSpan> spans;
  int64_t chunk_rows = 0, tile_lo = 0;
  auto flush = [&](int64_t tile_hi) {
    if (spans.empty()) return;
    partials.row_base = layout.q_row(spans.front().b, spans.front().t0);
    pool.parallel_for(tile_hi - tile_lo, [&](int64_t i, int worker) {
      fwd.run(fwd.tile(tile_lo + i), workspaces[worker], &partials);
    });
    combine_splits(partials, spans, params, problem, layout, pool);
    spans.clear();
    chunk_rows = 0;
    tile_lo = tile_hi;
  };
  const int64_t bq = fwd.block_q();
  for (int64_t b = 0; b < problem.batch; ++b)
    for (int64_t t0 = 0; t0 < layout.q_len(b); t0 += bq) {
      const int64_t t1 = std::min(layout.q_len(b), t0 + bq);
      if (chunk_rows + (t1 - t0) > capacity) flush(fwd.first_tile(b, t0 / bq));
      if (!spans.empty() && spans.back().b == b)
        spans.back().t1 = t1;
      else
        spans.push_back({b, t0, t1});
      chunk_rows += t1 - t0;
    }
  flush(fwd.num_tiles());
}

}  // namespace flashserve::attention
