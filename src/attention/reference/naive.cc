// Float64 naive attention (and its float32 "naive kernel in low precision" emulation): for every
// (sequence, head) it materialises the whole score matrix S, turns it into P = softmax(S) in place
// and multiplies by V. Deliberately simple; speed only matters because tests call it a lot.
#include "attention/reference/naive.h"

#include <cmath>
#include <limits>

#include "attention/problem.h"
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

// Index of the first row of sequence b in the NaiveOutput row order.
int64_t first_q_row(const AttentionParams& p, const Problem& pr, int64_t b) {
  return pr.varlen_q ? p.cu_seqlens_q.ptr<const int32_t>()[b] : b * p.q.shape[1];
}
int64_t num_q_rows(const AttentionParams& p, const Problem& pr) {
  return pr.varlen_q ? p.q.shape[0] : pr.batch * p.q.shape[1];
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
    T* s = &S[t * n_k];
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
  const int64_t row0 = first_q_row(p, pr, b);
  for (int64_t t = 0; t < n_q; ++t) {
    T* s = &S[t * n_k];
    T m = neg_inf;
    for (int64_t j = 0; j < n_k; ++j) m = std::max(m, s[j]);
    double* out = &o.out[((row0 + t) * pr.h_q + h) * Dv];
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
    for (int64_t d = 0; d < Dv; ++d) {
      T acc = 0;
      for (int64_t j = 0; j < n_k; ++j) acc += s[j] * V[j * Dv + d];
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
  o.rows = num_q_rows(params, pr);
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

}  // namespace flashserve::attention::reference
