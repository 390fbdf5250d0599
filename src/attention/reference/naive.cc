// Float64 naive attention (and its float32 "naive kernel in low precision" emulation): for every
// (sequence, head) it materialises the whole score matrix S, turns it into P = softmax(S) in place
// and multiplies by V. Deliberately simple; speed only matters because tests call it a lot.
#include "attention/reference/naive.h"

#include <cmath>
#include <limits>

#include "attention/problem.h"
#include "attention/reference/online_softmax.h"
#include "common/half.h"

namespace flashserve::attention::reference {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

double load_double(const void* base, int64_t i, DType dtype) {
  if (dtype == DType::kFloat64) return static_cast<const double*>(base)[i];
  return load_float(base, i, dtype);  // exact for float32, float16, bfloat16
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

// Reads the keys (or values) of sequence b, KV head hk, as a contiguous [kv_len, dim] array.
template <typename T>
std::vector<T> gather_kv(const TensorView& x, const HostLayout& L, bool is_k, int64_t b, int64_t hk,
                         int64_t dim) {
  const int64_t n = L.kv_len(b);
  std::vector<T> r(n * dim);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t off = is_k ? L.k_offset(b, j, hk) : L.v_offset(b, j, hk);
    for (int64_t d = 0; d < dim; ++d)
      r[j * dim + d] = static_cast<T>(load_double(x.data, off + d, x.dtype));
  }
  return r;
}

// One (sequence, query head): T is double for kExact, float for kLowPrecision.
template <typename T>
void head_forward(const AttentionParams& p, const Problem& pr, const HostLayout& L, int64_t b,
                  int64_t h, const std::vector<T>& K, const std::vector<T>& V, bool low,
                  NaiveOutput& o) {
  const int64_t n_q = L.q_len(b), n_k = L.kv_len(b), D = pr.head_dim, Dv = pr.head_dim_v;
  const T scale = static_cast<T>(pr.scale);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> q(D);
  std::vector<T> S(n_q * n_k);  // the whole score matrix, then P in place
  for (int64_t t = 0; t < n_q; ++t) {
    const int64_t q_off = L.q_offset(b, t, h);
    for (int64_t d = 0; d < D; ++d)
      q[d] = static_cast<T>(load_double(p.q.data, q_off + d, p.q.dtype));
    T* s = S.data() + t * n_k;
    for (int64_t j = 0; j < n_k; ++j) {
      if (!pr.mask.visible(t, j, n_q, n_k)) {
        s[j] = neg_inf;
        continue;
      }
      T acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += q[d] * K[j * D + d];
      s[j] = scale * acc;
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
    if (m == neg_inf) {  // the row sees no key
      for (int64_t d = 0; d < Dv; ++d) out[d] = 0.0;
      lse = -kInf;
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
      if (low) s[j] = static_cast<T>(round_to(static_cast<float>(s[j]), pr.dtype));
    }
    // Only the keys the row sees: a NaN or inf value at a masked key (weight 0) says nothing about
    // this row, as in FlashAttention. (0 x NaN would be NaN: a matmul over the whole score matrix,
    // as PyTorch's math path does, makes the column NaN.)
    for (int64_t d = 0; d < Dv; ++d) {
      T acc = 0;
      for (int64_t j = 0; j < n_k; ++j)
        if (pr.mask.visible(t, j, n_q, n_k)) acc += s[j] * V[j * Dv + d];
      out[d] = low ? round_to(static_cast<float>(acc), pr.dtype) : static_cast<double>(acc);
    }
  }
}

template <typename T>
void forward_all(const AttentionParams& p, const Problem& pr, const HostLayout& L, bool low,
                 NaiveOutput& o) {
  const int64_t group = pr.h_q / pr.h_kv;
  for (int64_t b = 0; b < pr.batch; ++b) {
    for (int64_t hk = 0; hk < pr.h_kv; ++hk) {
      const std::vector<T> K = gather_kv<T>(p.k, L, true, b, hk, pr.head_dim);
      const std::vector<T> V = gather_kv<T>(p.v, L, false, b, hk, pr.head_dim_v);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
        head_forward<T>(p, pr, L, b, h, K, V, low, o);
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
  if (mode == Emulate::kExact)
    forward_all<double>(params, pr, L, false, o);
  else
    forward_all<float>(params, pr, L, true, o);
  return o;
}

NaiveGrads naive_backward(const AttentionParams& params, const TensorView& dout) {
  const Problem pr = describe_on_host(params, "naive_backward");
  if (pr.paged)
    throw Error(ErrorKind::kUnsupported, "block_table", "naive_backward takes dense or varlen KV");
  const TensorView& out = params.out;
  check_view(dout, "dout", out.rank);
  for (int i = 0; i < out.rank; ++i)
    if (dout.shape[i] != out.shape[i])
      throw Error(ErrorKind::kInvalidArgument, "dout", "must have out's shape");
  if (dout.dtype == DType::kInt32)
    throw Error(ErrorKind::kInvalidArgument, "dout", "must be a float tensor");
  if (!(dout.device == pr.device))
    throw Error(ErrorKind::kInvalidArgument, "dout", "must be on the same device as q");
  AttentionParams with_dout = params;  // so HostLayout::out_offset addresses dout
  with_dout.out = dout;
  const HostLayout L(with_dout, pr);

  const int64_t D = pr.head_dim, Dv = pr.head_dim_v, G = pr.h_q / pr.h_kv;
  const int64_t q_rows = L.q_rows();
  const int64_t k_rows = pr.varlen_k ? params.k.shape[0] : pr.batch * params.k.shape[1];
  NaiveGrads g;
  g.dq.assign(q_rows * pr.h_q * D, 0.0);
  g.dk.assign(k_rows * pr.h_kv * D, 0.0);
  g.dv.assign(k_rows * pr.h_kv * Dv, 0.0);
  const double scale = pr.scale;
  for (int64_t b = 0; b < pr.batch; ++b) {
    const int64_t nq = L.q_len(b), nk = L.kv_len(b);
    const int64_t qrow0 = L.q_row(b, 0);
    const int64_t krow0 =
        pr.varlen_k ? params.cu_seqlens_k.ptr<const int32_t>()[b] : b * params.k.shape[1];
    for (int64_t hk = 0; hk < pr.h_kv; ++hk) {
      const std::vector<double> K = gather_kv<double>(params.k, L, true, b, hk, D);
      const std::vector<double> V = gather_kv<double>(params.v, L, false, b, hk, Dv);
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        std::vector<double> Q(nq * D), dO(nq * Dv), P(nq * nk, 0.0);
        for (int64_t t = 0; t < nq; ++t) {
          for (int64_t d = 0; d < D; ++d)
            Q[t * D + d] = load_double(params.q.data, L.q_offset(b, t, h) + d, params.q.dtype);
          for (int64_t d = 0; d < Dv; ++d)
            dO[t * Dv + d] = load_double(dout.data, L.out_offset(b, t, h) + d, dout.dtype);
        }
        // P = softmax(S) row by row (a row that sees no key stays 0: it has no gradient).
        for (int64_t t = 0; t < nq; ++t) {
          double* p = P.data() + t * nk;
          double m = -kInf;
          for (int64_t j = 0; j < nk; ++j) {
            if (!pr.mask.visible(t, j, nq, nk)) continue;
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += Q[t * D + d] * K[j * D + d];
            p[j] = scale * dot;
            m = std::max(m, p[j]);
          }
          if (m == -kInf) continue;
          double sum = 0;
          for (int64_t j = 0; j < nk; ++j)
            if (pr.mask.visible(t, j, nq, nk)) sum += (p[j] = std::exp(p[j] - m));
          for (int64_t j = 0; j < nk; ++j) p[j] /= sum;
        }
        for (int64_t t = 0; t < nq; ++t) {
          const double* p = P.data() + t * nk;
          const double* go = dO.data() + t * Dv;
          // delta = rowsum(dO o O) with O = P V.
          double delta = 0;
          for (int64_t d = 0; d < Dv; ++d) {
            double o = 0;
            for (int64_t j = 0; j < nk; ++j) o += p[j] * V[j * Dv + d];
            delta += go[d] * o;
          }
          double* dq = &g.dq[((qrow0 + t) * pr.h_q + h) * D];
          for (int64_t j = 0; j < nk; ++j) {
            if (p[j] == 0.0) continue;  // masked (or underflowed): contributes nothing
            double dp = 0;              // dP = dO V^T
            for (int64_t d = 0; d < Dv; ++d) dp += go[d] * V[j * Dv + d];
            const double ds = p[j] * (dp - delta);  // dS = P o (dP - delta)
            double* dk = &g.dk[((krow0 + j) * pr.h_kv + hk) * D];
            double* dv = &g.dv[((krow0 + j) * pr.h_kv + hk) * Dv];
            for (int64_t d = 0; d < D; ++d) {
              dq[d] += scale * ds * K[j * D + d];
              dk[d] += scale * ds * Q[t * D + d];  // summed over the group's query heads
            }
            for (int64_t d = 0; d < Dv; ++d) dv[d] += p[j] * go[d];
          }
        }
      }
    }
  }
  return g;
}

}  // namespace flashserve::attention::reference
