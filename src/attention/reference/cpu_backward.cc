// cpu_backward: see cpu_backward.h for the shape of the algorithm.
#include "attention/reference/cpu_backward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/reference/block_softmax.h"
#include "attention/reference/cpu_gemm.h"
#include "attention/reference/online_softmax.h"
#include "common/half.h"
#include "common/thread_pool.h"

namespace flashserve::attention {
namespace {

constexpr float kLog2e = 1.44269504088896340736f;
constexpr int64_t kBK = CpuBackwardTiling::kBlockK;

// One block of scores, key-major (p[j * ld + r]: key j0 + j, tile row r), as the block products
// leave it: p holds S^T in log2 units and ds holds dP^T on entry; on return p = P^T and
// ds = scale P^T o (dP^T - D), both 0 where row r does not see the key.
struct ProbBlock {
  float* p;
  float* ds;
  int64_t ld, nb, rows, j0;
  const int64_t* first_key;  // [rows] row r sees keys first_key[r] <= key < end_key[r]
  const int64_t* end_key;
  const float* lse2;   // [rows] the forward's LSE in log2 units
  const float* delta;  // [rows] D
  float scale;
  // The score modifiers in log2 units, as the forward's (block_softmax.h's ScoreBlock).
  float softcap = 0.0f;
  const float* slope = nullptr;
  const float* pos = nullptr;
};

// Branch-free across rows so that it vectorises (one body, compiled for AVX-512 and for the
// baseline ISA, as block_softmax.cc). The exponent is clamped to <= 0 before exp2: P <= 1 holds
// exactly, so the clamp only removes rounding above 0, and it keeps a row that saw no key (lse =
// -inf, exponent +inf) finite inside exp2_nonpositive before the mask selects 0; NaN passes.
//
// With softcap the scores are capped first (s = c tanh(s_raw / c), log2 units, by the forward's
// modify_scores) and dS carries the tanh's derivative 1 - (s / c)^2 to the scaled score; ALiBi's
// bias, subtracted after the cap, only shifts the scores. Both are template flags so that the
// plain path runs the loop it always ran.
template <bool kCapped, bool kAlibi>
__attribute__((always_inline)) inline void probs_body(const ProbBlock& b) {
  if constexpr (kCapped)
    modify_scores(b.p, b.ld, b.nb, b.rows, b.j0, 1.0f, b.softcap, nullptr, nullptr);
  const float inv_cap = kCapped ? 1.0f / b.softcap : 0.0f;
  for (int64_t j = 0; j < b.nb; ++j) {
    float* __restrict p = b.p + j * b.ld;
    float* __restrict ds = b.ds + j * b.ld;
    const int64_t key = b.j0 + j;
    [[maybe_unused]] const float keyf = static_cast<float>(key);
    for (int64_t r = 0; r < b.rows; ++r) {
      const bool seen = b.first_key[r] <= key && key < b.end_key[r];
      float x = p[r] - b.lse2[r];
      float grad = 1.0f;
      if constexpr (kCapped) {
        const float t = p[r] * inv_cap;  // tanh(s_raw / c)
        grad = 1.0f - t * t;
      }
      if constexpr (kAlibi) x -= b.slope[r] * std::fabs(b.pos[r] - keyf);
      const float prob = seen ? exp2_nonpositive(x > 0.0f ? 0.0f : x) : 0.0f;
      p[r] = prob;
      ds[r] = seen ? b.scale * prob * (ds[r] - b.delta[r]) * grad : 0.0f;
    }
  }
}

// The four instantiations, picked once per block.
__attribute__((always_inline)) inline void probs_any(const ProbBlock& b) {
  const bool capped = b.softcap > 0.0f, alibi = b.slope != nullptr;
  if (capped && alibi) return probs_body<true, true>(b);
  if (capped) return probs_body<true, false>(b);
  if (alibi) return probs_body<false, true>(b);
  probs_body<false, false>(b);
}

void probs_portable(const ProbBlock& b) {
  probs_any(b);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f"))) void probs_avx512(const ProbBlock& b) {
  probs_any(b);
}
#endif

void block_probs(const ProbBlock& b) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (cpu_isa() >= CpuIsa::kAvx512) return probs_avx512(b);
#endif
  probs_portable(b);
}

// Per-worker buffers, sized once per call: O(tile), independent of the sequence lengths.
struct Buffers {
  int64_t ld;                // row stride of the key-major blocks: the most rows a tile has
  std::vector<float> qt;     // [D][ld] the tile's queries, transposed, times scale * log2(e)
  std::vector<float> q;      // [ld][D] the tile's queries as rows (dK += dS^T Q)
  std::vector<float> dot;    // [Dv][ld] dout transposed (dP^T = V dO^T)
  std::vector<float> dout;   // [ld][Dv] dout as rows (dV += P^T dO)
  std::vector<float> lse2;   // [ld] the forward's LSE in log2 units (-inf: the row saw no key)
  std::vector<float> delta;  // [ld] D = rowsum(dout o out) - dlse
  std::vector<int64_t> first_key, end_key;  // [ld] each row's visible keys
  std::vector<float> slope, pos;            // [ld] ALiBi: slope * log2(e), query position
  std::vector<float> k, v;                  // [kBK][D], [kBK][Dv] the block's keys and values
  std::vector<float> p;                     // [kBK][ld] P^T
  std::vector<float> ds;                    // [kBK][ld] dP^T, then dS^T in place
  std::vector<float> acc_k;                 // dK/dV pass: [kBK][D] dK; dQ pass: [ld][D] dQ
  std::vector<float> acc_v;                 // dK/dV pass: [kBK][Dv] dV

  Buffers(int64_t rows, int64_t D, int64_t Dv)
      : ld(rows),
        qt(D * rows),
        q(rows * D),
        dot(Dv * rows),
        dout(rows * Dv),
        lse2(rows),
        delta(rows),
        first_key(rows),
        end_key(rows),
        slope(rows),
        pos(rows),
        k(kBK * D),
        v(kBK * Dv),
        p(kBK * rows),
        ds(kBK * rows),
        acc_k(std::max(kBK, rows) * D),
        acc_v(kBK * Dv) {}
};

class Backward {
 public:
  Backward(const AttentionBackwardParams& bp, const Problem& pr, const HostLayout& L,
           const HostLayout& G)
      : a_(bp.attn),
        bp_(bp),
        pr_(pr),
        L_(L),
        G_(G),
        group_(pr.h_q / pr.h_kv),
        bq_(CpuBackwardTiling::block_q(group_)),
        qmul_(pr.scale * kLog2e) {}

  int64_t block_q() const { return bq_; }
  int64_t group() const { return group_; }

  // D for every (query row, head) in HostLayout row order: row * h_q + h.
  void preprocess(std::vector<float>& delta, ThreadPool& pool) const {
    const int64_t Dv = pr_.head_dim_v, H = pr_.h_q;
    pool.parallel_for(pr_.batch, [&](int64_t b, int) {
      std::vector<float> o(Dv), g(Dv);
      for (int64_t t = 0; t < L_.q_len(b); ++t)
        for (int64_t h = 0; h < H; ++h) {
          convert_row(element(a_.out, L_.out_offset(b, t, h)), a_.out.dtype, Dv, 1.0f, o.data());
          convert_row(element(bp_.dout, G_.out_offset(b, t, h)), bp_.dout.dtype, Dv, 1.0f,
                      g.data());
          float d = 0;
          for (int64_t i = 0; i < Dv; ++i) d += o[i] * g[i];
          if (bp_.dlse.defined()) d -= bp_.dlse.ptr<const float>()[G_.lse_offset(b, t, h)];
          delta[L_.q_row(b, t) * H + h] = d;
        }
    });
  }

  // Loads the query rows [t0, t1) x the group of KV head hk into w (row r: query t0 + r / G,
  // head hk * G + r % G); returns the row count.
  int64_t load_queries(int64_t b, int64_t hk, int64_t t0, int64_t t1,
                       const std::vector<float>& delta, Buffers& w) const {
    const int64_t D = pr_.head_dim, Dv = pr_.head_dim_v, G = group_, ld = w.ld;
    const int64_t nq = L_.q_len(b), nk = L_.kv_len(b);
    const int64_t rows = (t1 - t0) * G;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = t0 + r / G, h = hk * G + r % G;
      float* q = &w.q[r * D];
      convert_row(element(a_.q, L_.q_offset(b, t, h)), a_.q.dtype, D, 1.0f, q);
      for (int64_t d = 0; d < D; ++d) w.qt[d * ld + r] = q[d] * qmul_;
      float* g = &w.dout[r * Dv];
      convert_row(element(bp_.dout, G_.out_offset(b, t, h)), bp_.dout.dtype, Dv, 1.0f, g);
      for (int64_t d = 0; d < Dv; ++d) w.dot[d * ld + r] = g[d];
      w.lse2[r] = a_.lse.ptr<const float>()[L_.lse_offset(b, t, h)] * kLog2e;
      w.delta[r] = delta[L_.q_row(b, t) * pr_.h_q + h];
      w.first_key[r] = pr_.mask.first_key(t, nq, nk);
      w.end_key[r] = pr_.mask.last_key(t, nq, nk) + 1;
      if (pr_.score_mod.has_alibi()) {
        w.slope[r] = pr_.score_mod.slope(b, h) * kLog2e;
        w.pos[r] = static_cast<float>(nk - nq + t);
      }
    }
    return rows;
  }

  // Loads keys and values [j0, j0 + nb) of KV head hk into w.k, w.v as float rows.
  void load_keys(int64_t b, int64_t hk, int64_t j0, int64_t nb, Buffers& w) const {
    const int64_t D = pr_.head_dim, Dv = pr_.head_dim_v;
    for (int64_t j = 0; j < nb; ++j) {
      convert_row(element(a_.k, L_.k_offset(b, j0 + j, hk)), a_.k.dtype, D, 1.0f, &w.k[j * D]);
      convert_row(element(a_.v, L_.v_offset(b, j0 + j, hk)), a_.v.dtype, Dv, 1.0f, &w.v[j * Dv]);
    }
  }

  // For the loaded rows and keys [j0, j0 + nb): w.p = P^T and w.ds = dS^T (scale included), both
  // [nb][ld], zero where the mask hides the key or the row saw no key.
  void block(int64_t rows, int64_t j0, int64_t nb, Buffers& w) const {
    const int64_t D = pr_.head_dim, Dv = pr_.head_dim_v, ld = w.ld;
    block_gemm(nb, rows, D, w.k.data(), D, 1, w.qt.data(), ld, w.p.data(), ld, false);
    block_gemm(nb, rows, Dv, w.v.data(), Dv, 1, w.dot.data(), ld, w.ds.data(), ld, false);
    // A row that saw no key has lse = -inf and every key masked: P = 0, not exp2(+inf).
    block_probs({w.p.data(), w.ds.data(), ld, nb, rows, j0, w.first_key.data(), w.end_key.data(),
                 w.lse2.data(), w.delta.data(), pr_.scale, pr_.score_mod.softcap * kLog2e,
                 pr_.score_mod.has_alibi() ? w.slope.data() : nullptr, w.pos.data()});
  }

  // dK/dV tile: keys [j0, j0 + nb) of KV head hk of sequence b, every query block that sees them.
  void run_kv(int64_t b, int64_t hk, int64_t j0, const std::vector<float>& delta,
              Buffers& w) const {
    const int64_t D = pr_.head_dim, Dv = pr_.head_dim_v, ld = w.ld;
    const int64_t nq = L_.q_len(b), nk = L_.kv_len(b);
    const int64_t nb = std::min(kBK, nk - j0);
    load_keys(b, hk, j0, nb, w);
    std::fill(w.acc_k.begin(), w.acc_k.begin() + nb * D, 0.0f);
    std::fill(w.acc_v.begin(), w.acc_v.begin() + nb * Dv, 0.0f);
    const Mask& mask = pr_.mask;
    for (int64_t t0 = 0; t0 < nq; t0 += bq_) {
      const int64_t t1 = std::min(nq, t0 + bq_);
      // The block's rows see keys [first_key(t0), last_key(t1 - 1)] at most (both ends are
      // non-decreasing in t): a query block wholly outside this key block is skipped.
      if (mask.first_key(t0, nq, nk) >= j0 + nb || mask.last_key(t1 - 1, nq, nk) < j0) continue;
      const int64_t rows = load_queries(b, hk, t0, t1, delta, w);
      block(rows, j0, nb, w);
      block_gemm(nb, Dv, rows, w.p.data(), ld, 1, w.dout.data(), Dv, w.acc_v.data(), Dv, true);
      block_gemm(nb, D, rows, w.ds.data(), ld, 1, w.q.data(), D, w.acc_k.data(), D, true);
    }
    for (int64_t j = 0; j < nb; ++j) {
      store_row(bp_.dk.data, bp_.dk.dtype, G_.k_offset(b, j0 + j, hk), D, &w.acc_k[j * D]);
      store_row(bp_.dv.data, bp_.dv.dtype, G_.v_offset(b, j0 + j, hk), Dv, &w.acc_v[j * Dv]);
    }
  }

  // dQ tile: queries [t0, t1) of the group of KV head hk of sequence b, every key block they see.
  void run_q(int64_t b, int64_t hk, int64_t t0, const std::vector<float>& delta, Buffers& w) const {
    const int64_t D = pr_.head_dim, G = group_, ld = w.ld;
    const int64_t nq = L_.q_len(b), nk = L_.kv_len(b);
    const int64_t t1 = std::min(nq, t0 + bq_);
    const int64_t rows = load_queries(b, hk, t0, t1, delta, w);
    std::fill(w.acc_k.begin(), w.acc_k.begin() + rows * D, 0.0f);
    const int64_t lo = pr_.mask.first_key(t0, nq, nk), hi = pr_.mask.last_key(t1 - 1, nq, nk) + 1;
    for (int64_t j0 = lo; j0 < hi; j0 += kBK) {
      const int64_t nb = std::min(kBK, hi - j0);
      load_keys(b, hk, j0, nb, w);
      block(rows, j0, nb, w);
      block_gemm(rows, D, nb, w.ds.data(), 1, ld, w.k.data(), D, w.acc_k.data(), D, true);
    }
    for (int64_t r = 0; r < rows; ++r)
      store_row(bp_.dq.data, bp_.dq.dtype, G_.q_offset(b, t0 + r / G, hk * G + r % G), D,
                &w.acc_k[r * D]);
  }

 private:
  static const void* element(const TensorView& t, int64_t off) {
    return static_cast<const std::byte*>(t.data) + off * static_cast<int64_t>(dtype_size(t.dtype));
  }

  const AttentionParams& a_;
  const AttentionBackwardParams& bp_;
  const Problem& pr_;
  const HostLayout& L_;  // the forward's tensors
  const HostLayout& G_;  // the gradients' (dq, dk, dv, dout, dlse in q, k, v, out, lse's places)
  const int64_t group_, bq_;
  const float qmul_;
};

// Writes zeros into every element of a well-formed view (rank 3 or 4, contiguous last dim).
void zero_fill(const TensorView& t) {
  if (t.numel() == 0) return;
  const int64_t esz = static_cast<int64_t>(dtype_size(t.dtype));
  const int64_t rows = t.numel() / t.shape[t.rank - 1];
  for (int64_t i = 0; i < rows; ++i) {
    int64_t off = 0, rest = i;
    for (int d = t.rank - 2; d >= 0; --d) {
      off += (rest % t.shape[d]) * t.stride[d];
      rest /= t.shape[d];
    }
    std::memset(static_cast<std::byte*>(t.data) + off * esz, 0, t.shape[t.rank - 1] * esz);
  }
}

// A tile of one of the passes: sequence, KV head, first key (dK/dV) or first query (dQ).
struct Tile {
  int64_t b, hk, start;
};

}  // namespace

void cpu_backward(const AttentionBackwardParams& params, const Problem& pr) {
  if (pr.device.type != DeviceType::kCPU)
    throw Error(ErrorKind::kInternal, "q", "cpu_backward called with non-CPU tensors");
  const AttentionParams& a = params.attn;
  const HostLayout L(a, pr);
  AttentionParams grads = a;  // the gradients addressed as the tensors they are the gradients of
  grads.q = params.dq;
  grads.k = params.dk;
  grads.v = params.dv;
  grads.out = params.dout;
  grads.lse = params.dlse;
  const HostLayout G(grads, pr);
  const Backward bwd(params, pr, L, G);
  ThreadPool& pool = ThreadPool::global();

  // Rows and keys no tile owns (a varlen row of no sequence, keys past seqused_k or in no
  // sequence) have a zero gradient: everything starts at zero, the tiles overwrite what they own.
  zero_fill(params.dq);
  zero_fill(params.dk);
  zero_fill(params.dv);

  std::vector<float> delta(static_cast<size_t>(L.q_rows() * pr.h_q));
  bwd.preprocess(delta, pool);

  std::vector<Tile> kv_tiles, q_tiles;
  for (int64_t b = 0; b < pr.batch; ++b)
    for (int64_t hk = 0; hk < pr.h_kv; ++hk) {
      for (int64_t j0 = 0; j0 < L.kv_len(b); j0 += kBK) kv_tiles.push_back({b, hk, j0});
      for (int64_t t0 = 0; t0 < L.q_len(b); t0 += bwd.block_q()) q_tiles.push_back({b, hk, t0});
    }
  std::vector<Buffers> buffers;
  buffers.reserve(pool.size());
  for (int i = 0; i < pool.size(); ++i)
    buffers.emplace_back(CpuBackwardTiling::tile_rows(bwd.group()), pr.head_dim, pr.head_dim_v);
  pool.parallel_for(static_cast<int64_t>(kv_tiles.size()), [&](int64_t i, int worker) {
    const Tile& t = kv_tiles[i];
    bwd.run_kv(t.b, t.hk, t.start, delta, buffers[worker]);
  });
  pool.parallel_for(static_cast<int64_t>(q_tiles.size()), [&](int64_t i, int worker) {
    const Tile& t = q_tiles[i];
    bwd.run_q(t.b, t.hk, t.start, delta, buffers[worker]);
  });
}

}  // namespace flashserve::attention
