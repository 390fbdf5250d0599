// cpu_forward: see cpu_forward.h for the shape of the algorithm.
#include "attention/reference/cpu_forward.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/backends.h"
#include "attention/reference/block_softmax.h"
#include "attention/reference/combine.h"
#include "attention/reference/cpu_amx.h"
#include "attention/reference/cpu_gemm.h"
#include "common/half.h"
#include "common/thread_pool.h"

namespace flashserve::attention {
namespace {

constexpr float kLog2e = 1.44269504088896340736f;
constexpr int64_t kBK = CpuTiling::kBlockK;

std::atomic<bool> g_bf16_pairs{[] {
  const char* e = std::getenv("FLASHSERVE_CPU_BF16_PAIRS");
  return e != nullptr && std::strcmp(e, "1") == 0;
}()};

std::atomic<bool> g_amx{[] {
  const char* e = std::getenv("FLASHSERVE_CPU_AMX");
  return e == nullptr || std::strcmp(e, "0") != 0;
}()};

// bf16 inputs on AMX tiles (block_gemm_amx) where available (and not turned off, nor the ISA
// forced below the top level); head dims multiples of 32 (a tile's depth).
bool use_amx(const Problem& pr) {
  return pr.dtype == DType::kBFloat16 && pr.kv_dtype == pr.dtype && pr.head_dim % 32 == 0 &&
         pr.head_dim_v % 32 == 0 && g_amx.load(std::memory_order_relaxed) &&
         cpu_isa() == CpuIsa::kAvx512Bf16 && amx_available();
}

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// bf16 inputs run the block products in bf16 pairs (block_gemm_bf16) when enabled, the CPU has
// AVX512-BF16 and the head dim is even (q.k is summed in pairs of d); else they are converted
// to float32 blocks like fp16.
bool use_bf16_pairs(const Problem& pr) {
  return pr.dtype == DType::kBFloat16 && pr.kv_dtype == pr.dtype &&
         cpu_isa() == CpuIsa::kAvx512Bf16 && pr.head_dim % 2 == 0 &&
         g_bf16_pairs.load(std::memory_order_relaxed);
}

// Rows of a worker's buffers: the AMX products run on whole 32 x 32 blocks, so their row count
// is rounded up (the extra rows hold stale values that no output reads).
int64_t buffer_rows(const Problem& pr) {
  const int64_t rows = CpuTiling::tile_rows(pr.h_q / pr.h_kv);
  return use_amx(pr) ? round_up(rows, 32) : rows;
}

// Per-worker buffers, sized once per call: O(tile), independent of the sequence lengths. The
// float32 path fills qt, k, v; the bf16-pair path qp, kb, pp, vp.
struct Workspace {
  int64_t ld;                // row stride of qt and s: the most rows a tile has
  std::vector<float> qt;     // [D][ld] the tile's queries, transposed, times scale * log2(e)
  std::vector<float> k;      // [kBK][D] keys as float rows (when not read in place)
  std::vector<float> v;      // [kBK][Dv] values likewise
  std::vector<uint16_t> qp;  // [D/2][ld] pairs: the tile's queries transposed (unscaled)
  std::vector<uint16_t> kb;  // [kBK][D] keys as adjacent bf16 rows (when not read in place)
  std::vector<uint16_t> pp;  // [kBK/2][ld] pairs: probabilities of key pairs, rounded to bf16
                             // (AMX: [ld][kBK] the probabilities row-major)
  std::vector<uint16_t> vp;  // [kBK/2][Dv] pairs: value rows 2j and 2j + 1 interleaved
  std::vector<float> s;      // [kBK][ld] scores of a key block, key-major, then probabilities
  std::vector<float> acc;    // [rows][Dv] unnormalised output
  std::vector<float> m, l, corr, scratch;   // [rows] running max and sum (log2 units)
  std::vector<int64_t> first_key, end_key;  // [rows] each row's visible keys
  std::vector<float> slope, pos;            // [rows] ALiBi: slope * log2(e), query position
  std::vector<float> row;                   // [max(D, Dv)] one row being converted or written

  Workspace(int64_t rows, int64_t D, int64_t Dv, bool pairs)
      : ld(rows),
        qt(pairs ? 0 : D * rows),
        k(pairs ? 0 : kBK * D),
        v(pairs ? 0 : kBK * Dv),
        qp(pairs ? D * rows : 0),
        kb(pairs ? kBK * D : 0),
        pp(pairs ? kBK * rows : 0),
        vp(pairs ? kBK * Dv : 0),
        s(kBK * rows),
        acc(rows * Dv),
        m(rows),
        l(rows),
        corr(rows),
        scratch(rows),
        first_key(rows),
        end_key(rows),
        slope(rows),
        pos(rows),
        row(std::max(D, Dv)) {}
  static size_t bytes(int64_t rows, int64_t D, int64_t Dv, bool pairs) {
    const int64_t operands = D * rows + kBK * D + kBK * Dv;
    const int64_t pair_operands = D * rows + kBK * D + kBK * rows + kBK * Dv;
    return sizeof(float) * static_cast<size_t>((pairs ? 0 : operands) + kBK * rows + rows * Dv +
                                               6 * rows + std::max(D, Dv)) +
           sizeof(uint16_t) * static_cast<size_t>(pairs ? pair_operands : 0) +
           sizeof(int64_t) * static_cast<size_t>(2 * rows);
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
        amx_(use_amx(pr)),
        pairs_(amx_ || use_bf16_pairs(pr)),
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
    const int64_t D = pr_.head_dim, Dv = pr_.head_dim_v, G = group_, ld = w.ld;
    const int64_t nq = L_.q_len(tl.b), nk = L_.kv_len(tl.b);
    const int64_t rows = (tl.t1 - tl.t0) * G;  // row r: query t0 + r / G, head hk * G + r % G
    const Mask& mask = pr_.mask;
    const ScoreMod& mods = pr_.score_mod;
    // exp(scale * x) = exp2(x * scale * log2(e)); an e4m3 q's descale rides along.
    const float qmul = pr_.scale * kLog2e * HostLayout::descale(p_.q_descale, tl.b, tl.hk);

    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = tl.t0 + r / G, h = tl.hk * G + r % G;
      if (pairs_) {  // qp[d/2][r] = {q[d], q[d+1]}
        const uint16_t* q = static_cast<const uint16_t*>(element(p_.q, L_.q_offset(tl.b, t, h)));
        for (int64_t d = 0; d < D; ++d) w.qp[(d / 2) * 2 * ld + 2 * r + d % 2] = q[d];
      } else {
        convert_row(element(p_.q, L_.q_offset(tl.b, t, h)), p_.q.dtype, D, qmul, w.row.data());
        for (int64_t d = 0; d < D; ++d) w.qt[d * ld + r] = w.row[d];
      }
      w.first_key[r] = mask.first_key(t, nq, nk);
      w.end_key[r] = mask.last_key(t, nq, nk) + 1;
      if (mods.has_alibi()) {
        w.slope[r] = mods.slope(tl.b, h) * kLog2e;
        w.pos[r] = static_cast<float>(nk - nq + t);
      }
    }
    std::fill(w.acc.begin(), w.acc.begin() + rows * Dv, 0.0f);
    std::fill(w.m.begin(), w.m.begin() + rows, -std::numeric_limits<float>::infinity());
    std::fill(w.l.begin(), w.l.begin() + rows, 0.0f);

    // Keys this tile may see: the union of its rows' windows (first_key and last_key are
    // non-decreasing in t), cut to this split's share of the keys.
    int64_t lo = w.first_key[0], hi = w.end_key[rows - 1];
    if (splits_ > 1) {
      // Splits are whole key blocks, so a split boundary never cuts a block.
      const int64_t chunk = ((nk + splits_ - 1) / splits_ + kBK - 1) / kBK * kBK;
      lo = std::max(lo, tl.split * chunk);
      hi = std::min(hi, (tl.split + 1) * chunk);
    }
    for (int64_t j0 = lo; j0 < hi; j0 += kBK) {
      const int64_t nb = std::min(kBK, hi - j0);
      // Rows in chunks of kRowChunk, each with the keys of this block its last row sees (rows'
      // windows end in order): on a causal diagonal the products skip the keys no row of a chunk
      // sees instead of computing the whole block and masking it (the mask pass sets what a
      // chunk skipped to -inf).
      constexpr int64_t kRowChunk = 64;
      auto for_chunks = [&](auto&& fn) {
        if (w.end_key[0] >= j0 + nb) return fn(int64_t{0}, rows, nb);
        for (int64_t r0 = 0; r0 < rows; r0 += kRowChunk) {
          const int64_t r1 = std::min(rows, r0 + kRowChunk);
          const int64_t n = std::clamp<int64_t>(w.end_key[r1 - 1] - j0, 0, nb);
          if (n > 0) fn(r0, r1, n);
        }
      };
      // S^T = K Q^T: keys are the rows of the product, so key rows are used as they lie.
      const int64_t nb32 = round_up(nb, 32);
      if (amx_) {  // whole 32 x 32 blocks: keys past nb (stale rows of kb) give rows never read
        const uint16_t* k = bf16_keys(tl, j0, nb, w.kb.data(), /*copy=*/true);
        block_gemm_amx(nb32, ld, D, k, D, w.qp.data(), 2 * ld, w.s.data(), ld, false);
      } else if (pairs_) {
        const uint16_t* k = bf16_keys(tl, j0, nb, w.kb.data());
        for_chunks([&](int64_t r0, int64_t r1, int64_t n) {
          block_gemm_bf16(n, r1 - r0, D / 2, k, D, 2, &w.qp[2 * r0], 2 * ld, &w.s[r0], ld, false);
        });
      } else {
        int64_t k_ld = D;
        const float* k = keys(p_.k, tl, j0, nb, D, w.k.data(), &k_ld);
        for_chunks([&](int64_t r0, int64_t r1, int64_t n) {
          block_gemm(n, r1 - r0, D, k, k_ld, 1, &w.qt[r0], ld, &w.s[r0], ld, false);
        });
      }
      // Row windows are non-decreasing: the last row starts latest, the first ends earliest.
      const ScoreBlock sb{w.s.data(),
                          ld,
                          nb,
                          rows,
                          j0,
                          w.first_key.data(),
                          w.end_key.data(),
                          w.first_key[rows - 1] <= j0 && w.end_key[0] >= j0 + nb,
                          pairs_ ? qmul : 1.0f,
                          mods.softcap * kLog2e,
                          mods.has_alibi() ? w.slope.data() : nullptr,
                          w.pos.data()};
      block_softmax(sb, w.m.data(), w.l.data(), w.corr.data(), w.scratch.data());
      for (int64_t r = 0; r < rows; ++r)
        if (w.corr[r] != 1.0f) {  // the max grew: rescale what row r has accumulated
          float* acc = &w.acc[r * Dv];
          const float c = w.corr[r];
          for (int64_t d = 0; d < Dv; ++d) acc[d] *= c;
        }
      if (amx_) {
        // O += P V: P row-major bf16 (zeros past nb), V in pairs (zeros past nb).
        transpose_to_bf16(w.s.data(), ld, nb, rows, w.pp.data(), kBK, nb32);
        const uint16_t* v = p_.v.ptr<const uint16_t>();
        for (int64_t j = 0; j < nb; j += 2)
          pack_bf16_pairs(v + L_.v_offset(tl.b, j0 + j, tl.hk),
                          j + 1 < nb ? v + L_.v_offset(tl.b, j0 + j + 1, tl.hk) : nullptr, Dv,
                          &w.vp[j * Dv]);
        std::fill(w.vp.begin() + round_up(nb, 2) * Dv, w.vp.begin() + nb32 * Dv, uint16_t{0});
        block_gemm_amx(round_up(rows, 32), Dv, nb32, w.pp.data(), kBK, w.vp.data(), 2 * Dv,
                       w.acc.data(), Dv, true);
      } else if (pairs_) {
        // O += P V in pairs of keys: P rounded to bf16 (as the GPU kernels do), V interleaved.
        const uint16_t* v = p_.v.ptr<const uint16_t>();
        for (int64_t j = 0; j < nb; j += 2) {
          const bool two = j + 1 < nb;  // an odd block ends in a pair with a zero second half
          pack_float_pairs(&w.s[j * ld], two ? &w.s[(j + 1) * ld] : nullptr, rows, &w.pp[j * ld]);
          pack_bf16_pairs(v + L_.v_offset(tl.b, j0 + j, tl.hk),
                          two ? v + L_.v_offset(tl.b, j0 + j + 1, tl.hk) : nullptr, Dv,
                          &w.vp[j * Dv]);
        }
        for_chunks([&](int64_t r0, int64_t r1, int64_t n) {
          block_gemm_bf16(r1 - r0, Dv, (n + 1) / 2, &w.pp[2 * r0], 2, 2 * ld, w.vp.data(), 2 * Dv,
                          &w.acc[r0 * Dv], Dv, true);
        });
      } else {
        // O += P V with P read column-wise from s.
        int64_t v_ld = Dv;
        const float* v = keys(p_.v, tl, j0, nb, Dv, w.v.data(), &v_ld);
        for_chunks([&](int64_t r0, int64_t r1, int64_t n) {
          block_gemm(r1 - r0, Dv, n, &w.s[r0], 1, ld, v, v_ld, &w.acc[r0 * Dv], Dv, true);
        });
      }
    }

    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = tl.t0 + r / G, h = tl.hk * G + r % G;
      const float l = w.l[r];
      // As RunningSoftmax::lse: -inf when no key contributed, NaN for a NaN row.
      const float lse = l == 0.0f ? -std::numeric_limits<float>::infinity()
                                  : (w.m[r] + std::log2(l)) * 0.69314718055994530942f;
      float* o = w.row.data();
      if (l != 0.0f) {
        const float inv = 1.0f / l;  // NaN for a NaN row: its output is NaN
        for (int64_t d = 0; d < Dv; ++d) o[d] = w.acc[r * Dv + d] * inv;
      } else {  // the row saw no key (in this split)
        std::fill(o, o + Dv, 0.0f);
      }
      if (partials) {
        const int64_t row = L_.q_row(tl.b, t);
        std::copy(o, o + Dv, partials->out_at(tl.split, row, h));
        partials->lse_at(tl.split, row, h) = lse;
      } else {
        store_row(p_.out.data, p_.out.dtype, L_.out_offset(tl.b, t, h), Dv, o);
        if (p_.lse.defined()) p_.lse.ptr<float>()[L_.lse_offset(tl.b, t, h)] = lse;
      }
    }
  }

 private:
  static const void* element(const TensorView& t, int64_t off) {
    return static_cast<const std::byte*>(t.data) + off * static_cast<int64_t>(dtype_size(t.dtype));
  }

  // Keys [j0, j0 + nb) of the tile's KV head as adjacent bf16 rows: in place when they are
  // (one KV head, not paged), else copied into buf.
  const uint16_t* bf16_keys(const Tile& tl, int64_t j0, int64_t nb, uint16_t* buf,
                            bool copy = false) const {
    const int64_t D = pr_.head_dim;
    const uint16_t* k = p_.k.ptr<const uint16_t>();
    const int64_t off0 = L_.k_offset(tl.b, j0, tl.hk);
    if (!copy && !pr_.paged && (nb == 1 || L_.k_offset(tl.b, j0 + 1, tl.hk) - off0 == D))
      return k + off0;
    for (int64_t j = 0; j < nb; ++j)
      std::memcpy(buf + j * D, k + L_.k_offset(tl.b, j0 + j, tl.hk), D * sizeof(uint16_t));
    return buf;
  }

  // Rows [j0, j0 + nb) of the tile's KV head of `t` (K or V, row length n) as contiguous float
  // rows: in place when t is float32, not paged and its rows already adjacent (one KV head), else
  // copied / converted into buf. Copying beats reading rows h_kv * n apart in place: the block
  // products' strided loads then miss L1 and the prefetchers (a 2-core measurement: 93 against
  // 120 GFLOP/s, docs/cpu-path.md).
  const float* keys(const TensorView& t, const Tile& tl, int64_t j0, int64_t nb, int64_t n,
                    float* buf, int64_t* ld) const {
    const bool is_k = &t == &p_.k;
    auto offset = [&](int64_t j) {
      return is_k ? L_.k_offset(tl.b, j, tl.hk) : L_.v_offset(tl.b, j, tl.hk);
    };
    // An e4m3 K or V is dequantised as it is converted (1 otherwise).
    const float mul = HostLayout::descale(is_k ? p_.k_descale : p_.v_descale, tl.b, tl.hk);
    const int64_t off0 = offset(j0);
    *ld = n;
    if (t.dtype == DType::kFloat32 && !pr_.paged && (nb == 1 || offset(j0 + 1) - off0 == n))
      return t.ptr<const float>() + off0;
    // Rows lie h_kv * n apart (or on scattered pages): the prefetchers do not follow, so each row
    // is requested kAhead rows before it is converted (the copy ran at ~5 GB/s without).
    constexpr int64_t kAhead = 8;
    const int64_t bytes = n * static_cast<int64_t>(dtype_size(t.dtype));
    auto prefetch = [&](int64_t j) {
      const char* r = static_cast<const char*>(element(t, offset(j0 + j)));
      for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(r + b);
    };
    for (int64_t j = 0; j < std::min(kAhead, nb); ++j) prefetch(j);
    for (int64_t j = 0; j < nb; ++j) {
      if (j + kAhead < nb) prefetch(j + kAhead);
      convert_row(element(t, offset(j0 + j)), t.dtype, n, mul, buf + j * n);
    }
    return buf;
  }

  const AttentionParams& p_;
  const Problem& pr_;
  const HostLayout& L_;
  const int64_t splits_, group_, bq_;
  const bool amx_, pairs_;
  std::vector<int64_t> first_tile_;
};

}  // namespace

void cpu_use_amx(bool on) {
  g_amx.store(on, std::memory_order_relaxed);
}
bool cpu_amx() {
  return g_amx.load(std::memory_order_relaxed) && amx_available();
}

void cpu_use_bf16_pairs(bool on) {
  g_bf16_pairs.store(on, std::memory_order_relaxed);
}
bool cpu_bf16_pairs() {
  return g_bf16_pairs.load(std::memory_order_relaxed);
}

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
  size_t bytes = workers * Workspace::bytes(buffer_rows(pr), pr.head_dim, pr.head_dim_v,
                                            use_amx(pr) || use_bf16_pairs(pr));
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
    workspaces.emplace_back(buffer_rows(problem), problem.head_dim, problem.head_dim_v,
                            use_amx(problem) || use_bf16_pairs(problem));

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
