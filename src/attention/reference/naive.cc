// Float64 naive attention (and its float32 "naive kernel in low precision" emulation): for every
// (sequence, head) it materialises the whole score matrix S, turns it into P = softmax(S) in place
// and multiplies by V. Deliberately simple; speed only matters because tests call it a lot.
#include "attention/reference/naive.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "attention/problem.h"
#include "attention/reference/online_softmax.h"
#include "common/half.h"

namespace flashserve::attention::reference {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

double load_double(const void* base, int64_t i, DType dtype) {
  if (dtype == DType::kFloat64) return static_cast<const double*>(base)[i];
  return load_float(base, i, dtype);  // exact for float32, float16, bfloat16, e4m3
}

// Element i of x dequantised: times x's descale factor for (b, hk) (1 unless x is e4m3).
template <typename T>
T load_dequantised(const TensorView& x, int64_t i, const TensorView& descale, int64_t b,
                   int64_t hk) {
  const T v = static_cast<T>(load_double(x.data, i, x.dtype));
  if (!descale.defined()) return v;
  return v * static_cast<T>(HostLayout::descale(descale, b, hk));
}

// What storing x in the input dtype and reading it back gives.
float round_to(float x, DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return to_float(to_fp16(x));
    case DType::kBFloat16:
      return to_float(to_bf16(x));
    default:
      return x;
  }
}

Problem describe_on_host(const AttentionParams& params, const char* who) {
  Problem pr = describe(params);
  if (pr.device.type != DeviceType::kCPU)
    throw Error(ErrorKind::kInvalidArgument, "q", std::string(who) + " needs host (CPU) tensors");
  return pr;
}

// A row that sees no key: O = 0, LSE = -inf.
void write_unseen_row(double* out, double& lse, int64_t dv) {
  std::fill(out, out + dv, 0.0);
  lse = -kInf;
}

// Reads the keys (or values) of sequence b, KV head hk, dequantised, as a contiguous
// [kv_len, dim] array.
template <typename T>
std::vector<T> gather_kv(const AttentionParams& p, const HostLayout& L, bool is_k, int64_t b,
                         int64_t hk, int64_t dim) {
  const TensorView& x = is_k ? p.k : p.v;
  const TensorView& descale = is_k ? p.k_descale : p.v_descale;
  const int64_t n = L.kv_len(b);
  std::vector<T> r(n * dim);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t off = is_k ? L.k_offset(b, j, hk) : L.v_offset(b, j, hk);
    for (int64_t d = 0; d < dim; ++d)
      r[j * dim + d] = load_dequantised<T>(x, off + d, descale, b, hk);
  }
  return r;
}

// One (sequence, query head): T is double for kExact, float for kLowPrecision.
template <typename T>
void head_forward(const AttentionParams& p, const Problem& pr, const HostLayout& L, int64_t b,
                  int64_t h, const std::vector<T>& K, const std::vector<T>& V, bool low,
                  NaiveOutput& o) {
  const int64_t n_q = L.q_len(b), n_k = L.kv_len(b), D = pr.head_dim, Dv = pr.head_dim_v;
  const int64_t hk = h / (pr.h_q / pr.h_kv);
  // kLowPrecision rounds P to q's dtype (an e4m3 k and v do not make P e4m3) and out to out's.
  const DType p_dtype = pr.dtype, o_dtype = pr.out_dtype;
  const T scale = static_cast<T>(pr.scale);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> q(D);
  std::vector<T> S(n_q * n_k);  // the whole score matrix, then P in place
  for (int64_t t = 0; t < n_q; ++t) {
    const int64_t q_off = L.q_offset(b, t, h);
    for (int64_t d = 0; d < D; ++d) q[d] = load_dequantised<T>(p.q, q_off + d, p.q_descale, b, hk);
    T* s = S.data() + t * n_k;
    for (int64_t j = 0; j < n_k; ++j) {
      if (!pr.mask.visible(t, j, n_q, n_k)) {
        s[j] = neg_inf;
        continue;
      }
      T acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += q[d] * K[j * D + d];
      s[j] = pr.score_mod.apply(scale * acc, b, h, n_k - n_q + t, j);
    }
  }
  const int64_t row0 = L.q_row(b, 0);
  for (int64_t t = 0; t < n_q; ++t) {
    T* s = S.data() + t * n_k;
    // The max propagates NaN: a NaN score (NaN in q or k) makes the row NaN, as in PyTorch; a
    // +inf one does too (inf - inf below); -inf scores weigh 0 like masked keys.
    T m = neg_inf;
    for (int64_t j = 0; j < n_k; ++j) m = nan_max(m, s[j]);
    double* out = o.out.data() + ((row0 + t) * pr.h_q + h) * Dv;
    double& lse = o.lse[(row0 + t) * pr.h_q + h];
    if (m == neg_inf) {
      write_unseen_row(out, lse, Dv);
      continue;
    }
    T sum = 0;
    for (int64_t j = 0; j < n_k; ++j) {
      s[j] = std::exp(s[j] - m);  // exp(-inf) = 0 for masked keys
      sum += s[j];
    }
    lse = static_cast<double>(m + std::log(sum));
    for (int64_t j = 0; j < n_k; ++j) {
      s[j] /= sum;
      if (low) s[j] = static_cast<T>(round_to(static_cast<float>(s[j]), p_dtype));
    }
    // Only the keys the row sees: a NaN or inf value at a masked key (weight 0) says nothing about
    // this row, as in FlashAttention. (0 x NaN would be NaN: a matmul over the whole score matrix,
    // as PyTorch's math path does, makes the column NaN.)
    for (int64_t d = 0; d < Dv; ++d) {
      T acc = 0;
      for (int64_t j = 0; j < n_k; ++j)
        if (pr.mask.visible(t, j, n_q, n_k)) acc += s[j] * V[j * Dv + d];
      out[d] = low ? round_to(static_cast<float>(acc), o_dtype) : static_cast<double>(acc);
    }
  }
}

// Emulate::kFp8Kernel for one (sequence, query head), K and V dequantised in float32.
void head_forward_fp8(const AttentionParams& p, const Problem& pr, const HostLayout& L, int64_t b,
                      int64_t h, const std::vector<float>& K, const std::vector<float>& V,
                      NaiveOutput& o) {
  const int64_t n_q = L.q_len(b), n_k = L.kv_len(b), D = pr.head_dim, Dv = pr.head_dim_v;
  const int64_t hk = h / (pr.h_q / pr.h_kv);
  constexpr float kPScale = 256.0f;  // 2^8: P in (0, 256], inside e4m3's range
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> q(D), s(kFp8BlockK), acc(Dv);
  const int64_t row0 = L.q_row(b, 0);
  for (int64_t t = 0; t < n_q; ++t) {
    const int64_t q_off = L.q_offset(b, t, h);
    for (int64_t d = 0; d < D; ++d)
      q[d] = load_dequantised<float>(p.q, q_off + d, p.q_descale, b, hk);
    float m = neg_inf, l = 0.0f;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t j0 = 0; j0 < n_k; j0 += kFp8BlockK) {
      const int64_t nb = std::min(kFp8BlockK, n_k - j0);
      float block_max = neg_inf;
      for (int64_t j = 0; j < nb; ++j) {
        s[j] = neg_inf;
        if (!pr.mask.visible(t, j0 + j, n_q, n_k)) continue;
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += q[d] * K[(j0 + j) * D + d];
        s[j] = pr.score_mod.apply(pr.scale * dot, b, h, n_k - n_q + t, j0 + j);
        block_max = nan_max(block_max, s[j]);
      }
      const float m_new = nan_max(m, block_max);
      if (m_new == neg_inf) continue;  // nothing visible yet
      const float corr = m == neg_inf ? 0.0f : std::exp(m - m_new);
      l *= corr;
      for (float& a : acc) a *= corr;
      m = m_new;
      for (int64_t j = 0; j < nb; ++j) {
        if (s[j] == neg_inf) continue;
        const float pj = std::exp(s[j] - m) * kPScale;
        l += pj;
        const float pq = round_to_e4m3(pj);
        for (int64_t d = 0; d < Dv; ++d) acc[d] += pq * V[(j0 + j) * Dv + d];
      }
    }
    double* out = o.out.data() + ((row0 + t) * pr.h_q + h) * Dv;
    double& lse = o.lse[(row0 + t) * pr.h_q + h];
    if (m == neg_inf) {
      write_unseen_row(out, lse, Dv);
      continue;
    }
    lse = static_cast<double>(m + std::log(l) - std::log(kPScale));
    for (int64_t d = 0; d < Dv; ++d) out[d] = to_float(to_bf16(acc[d] / l));
  }
}

template <typename T>
void forward_all(const AttentionParams& p, const Problem& pr, const HostLayout& L, Emulate mode,
                 NaiveOutput& o) {
  const int64_t group = pr.h_q / pr.h_kv;
  for (int64_t b = 0; b < pr.batch; ++b) {
    for (int64_t hk = 0; hk < pr.h_kv; ++hk) {
      const std::vector<T> K = gather_kv<T>(p, L, true, b, hk, pr.head_dim);
      const std::vector<T> V = gather_kv<T>(p, L, false, b, hk, pr.head_dim_v);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        if constexpr (std::is_same_v<T, float>) {
          if (mode == Emulate::kFp8Kernel) {
            head_forward_fp8(p, pr, L, b, h, K, V, o);
            continue;
          }
        }
        head_forward<T>(p, pr, L, b, h, K, V, mode != Emulate::kExact, o);
      }
    }
  }
}

}  // namespace

NaiveOutput naive_forward(const AttentionParams& params, Emulate mode) {
  const Problem pr = describe_on_host(params, "naive_forward");
  const HostLayout L(params, pr);
  NaiveOutput o;
  o.rows = L.q_rows();
  o.h_q = pr.h_q;
  o.head_dim_v = pr.head_dim_v;
  o.out.assign(o.rows * pr.h_q * pr.head_dim_v, kNaN);
  o.lse.assign(o.rows * pr.h_q, kNaN);
  // A kernel on e4m3 q is FA3's fp8 kernel: its low-precision emulation is kFp8Kernel.
  if (mode == Emulate::kLowPrecision && pr.dtype == DType::kFloat8E4M3) mode = Emulate::kFp8Kernel;
  if (mode == Emulate::kExact)
    forward_all<double>(params, pr, L, mode, o);
  else
    forward_all<float>(params, pr, L, mode, o);
  return o;
}

namespace {

// The backward of one call in T (double: exact; float: the low-precision emulation, which rounds
// P, O, dS and the gradients to the input dtype where a naive kernel in that dtype stores them).
template <typename T>
NaiveGrads backward_all(const AttentionParams& params, const Problem& pr, const HostLayout& L,
                        const TensorView& dout, const TensorView& dlse, bool low) {
  const int64_t D = pr.head_dim, Dv = pr.head_dim_v, G = pr.h_q / pr.h_kv;
  const int64_t q_rows = L.q_rows();
  const int64_t k_rows = pr.varlen_k ? params.k.shape[0] : pr.batch * params.k.shape[1];
  auto rnd = [&](T x) {
    return low ? static_cast<T>(round_to(static_cast<float>(x), pr.dtype)) : x;
  };
  std::vector<T> dq(q_rows * pr.h_q * D, T(0)), dk(k_rows * pr.h_kv * D, T(0)),
      dv(k_rows * pr.h_kv * Dv, T(0));
  const T scale = static_cast<T>(pr.scale);
  for (int64_t b = 0; b < pr.batch; ++b) {
    const int64_t nq = L.q_len(b), nk = L.kv_len(b);
    const int64_t qrow0 = L.q_row(b, 0);
    const int64_t krow0 =
        pr.varlen_k ? params.cu_seqlens_k.ptr<const int32_t>()[b] : b * params.k.shape[1];
    for (int64_t hk = 0; hk < pr.h_kv; ++hk) {
      const std::vector<T> K = gather_kv<T>(params, L, true, b, hk, D);
      const std::vector<T> V = gather_kv<T>(params, L, false, b, hk, Dv);
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        std::vector<T> Q(nq * D), dO(nq * Dv), P(nq * nk, T(0));
        std::vector<T> raw(nq * nk, T(0));  // the scaled scores before softcap (its derivative)
        for (int64_t t = 0; t < nq; ++t) {
          for (int64_t d = 0; d < D; ++d)
            Q[t * D + d] =
                static_cast<T>(load_double(params.q.data, L.q_offset(b, t, h) + d, params.q.dtype));
          for (int64_t d = 0; d < Dv; ++d)
            dO[t * Dv + d] =
                static_cast<T>(load_double(dout.data, L.out_offset(b, t, h) + d, dout.dtype));
        }
        // P = softmax(S) row by row (a row that sees no key stays 0: it has no gradient).
        for (int64_t t = 0; t < nq; ++t) {
          T* p = P.data() + t * nk;
          T m = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < nk; ++j) {
            if (!pr.mask.visible(t, j, nq, nk)) continue;
            T dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += Q[t * D + d] * K[j * D + d];
            raw[t * nk + j] = scale * dot;
            p[j] = pr.score_mod.apply(scale * dot, b, h, nk - nq + t, j);
            m = std::max(m, p[j]);
          }
          if (m == -std::numeric_limits<T>::infinity()) continue;
          T sum = 0;
          for (int64_t j = 0; j < nk; ++j)
            if (pr.mask.visible(t, j, nq, nk)) sum += (p[j] = std::exp(p[j] - m));
          for (int64_t j = 0; j < nk; ++j) p[j] = rnd(p[j] / sum);
        }
        for (int64_t t = 0; t < nq; ++t) {
          const T* p = P.data() + t * nk;
          const T* go = dO.data() + t * Dv;
          // delta = rowsum(dO o O) - dlse with O = P V (as stored: rounded in low precision).
          T delta = 0;
          for (int64_t d = 0; d < Dv; ++d) {
            T o = 0;
            for (int64_t j = 0; j < nk; ++j) o += p[j] * V[j * Dv + d];
            delta += go[d] * rnd(o);
          }
          if (dlse.defined())
            delta -= static_cast<T>(dlse.ptr<const float>()[L.lse_offset(b, t, h)]);
          T* gq = &dq[((qrow0 + t) * pr.h_q + h) * D];
          for (int64_t j = 0; j < nk; ++j) {
            if (p[j] == T(0)) continue;  // masked (or underflowed): contributes nothing
            T dp = 0;                    // dP = dO V^T
            for (int64_t d = 0; d < Dv; ++d) dp += go[d] * V[j * Dv + d];
            // dS = P o (dP - delta), through the softcap's tanh to the scaled score.
            const T ds = rnd(p[j] * (dp - delta) * pr.score_mod.derivative(raw[t * nk + j]));
            T* gk = &dk[((krow0 + j) * pr.h_kv + hk) * D];
            T* gv = &dv[((krow0 + j) * pr.h_kv + hk) * Dv];
            for (int64_t d = 0; d < D; ++d) {
              gq[d] += scale * ds * K[j * D + d];
              gk[d] += scale * ds * Q[t * D + d];  // summed over the group's query heads
            }
            for (int64_t d = 0; d < Dv; ++d) gv[d] += p[j] * go[d];
          }
        }
      }
    }
  }
  NaiveGrads g;
  auto out = [&](const std::vector<T>& x, std::vector<double>& y) {
    y.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = static_cast<double>(rnd(x[i]));
  };
  out(dq, g.dq);
  out(dk, g.dk);
  out(dv, g.dv);
  return g;
}

}  // namespace

NaiveGrads naive_backward(const AttentionParams& params, const TensorView& dout, Emulate mode,
                          const TensorView& dlse) {
  const Problem pr = describe_on_host(params, "naive_backward");
  if (pr.paged)
    throw Error(ErrorKind::kUnsupported, "block_table", "naive_backward takes dense or varlen KV");
  if (pr.fp8())
    throw Error(ErrorKind::kUnsupported, "q", "naive_backward has no float8_e4m3fn path");
  const TensorView& out = params.out;
  check_view(dout, "dout", out.rank);
  for (int i = 0; i < out.rank; ++i)
    if (dout.shape[i] != out.shape[i])
      throw Error(ErrorKind::kInvalidArgument, "dout", "must have out's shape");
  if (dout.dtype == DType::kInt32)
    throw Error(ErrorKind::kInvalidArgument, "dout", "must be a float tensor");
  if (!(dout.device == pr.device))
    throw Error(ErrorKind::kInvalidArgument, "dout", "must be on the same device as q");
  AttentionParams with_dout = params;  // so HostLayout::out_offset addresses dout (lse: dlse)
  with_dout.out = dout;
  if (dlse.defined()) {
    check_view(dlse, "dlse", params.lse.rank);
    if (!params.lse.defined() || dlse.dtype != DType::kFloat32)
      throw Error(ErrorKind::kInvalidArgument, "dlse", "must be float32, shaped like params.lse");
    with_dout.lse = dlse;
  }
  const HostLayout L(with_dout, pr);
  if (mode == Emulate::kExact) return backward_all<double>(params, pr, L, dout, dlse, false);
  return backward_all<float>(params, pr, L, dout, dlse, true);
}

}  // namespace flashserve::attention::reference
