// Validation of AttentionParams: every way a call can break the contract becomes an Error that
// names the argument, before any backend touches memory.
#include "problem.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "common/checked_math.h"
#include "common/str_cat.h"

namespace flashserve::attention {
namespace {

constexpr int64_t kMaxHeadDim = 512;  // CPU path; the CUDA dispatch narrows this further
constexpr int32_t kMaxSplits = 256;

[[noreturn]] void fail(const std::string& arg, const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, arg, what);
}

bool is_float(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

// True when the view has no element. Not numel() == 0: the product of the sizes can overflow
// int64 (dimensions of stride 0) on views that validation has yet to reject.
bool empty(const TensorView& t) {
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] == 0) return true;
  return false;
}

// One past the last element the view can address, in elements; throws on int64 overflow.
int64_t extent(const TensorView& t, const char* name) {
  int64_t last = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] == 0) return 0;
    int64_t term = 0;
    if (__builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &term) ||
        __builtin_add_overflow(last, term, &last))
      fail(name, "shape and strides address more elements than fit in 64 bits");
  }
  int64_t bytes = 0;
  if (__builtin_add_overflow(last, int64_t{1}, &last) ||
      __builtin_mul_overflow(last, static_cast<int64_t>(dtype_size(t.dtype)), &bytes))
    fail(name, "shape and strides address more bytes than fit in 64 bits");
  return last;
}

}  // namespace

void check_view(const TensorView& t, const char* name, int rank) {
  if (t.rank != rank) fail(name, str_cat("expected rank ", rank, ", got rank ", t.rank));
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0) fail(name, str_cat("negative size ", t.shape[i], " in dimension ", i));
    if (t.stride[i] < 0) fail(name, str_cat("negative stride ", t.stride[i], " in dimension ", i));
  }
  if (t.rank > 0 && t.shape[t.rank - 1] > 1 && t.stride[t.rank - 1] != 1)
    fail(name, str_cat("the last dimension must be contiguous (stride 1), got stride ",
                       t.stride[t.rank - 1]));
  if (t.data == nullptr && !empty(t)) fail(name, "null data pointer");
  // A misaligned element is undefined behaviour to read through its type on the CPU (and a
  // misaligned-address fault on the GPU): refused, like any other malformed view.
  const size_t size = dtype_size(t.dtype);
  if (!empty(t) && reinterpret_cast<uintptr_t>(t.data) % size != 0) {
    char where[32];
    std::snprintf(where, sizeof where, "%p", t.data);
    fail(name, str_cat("data pointer ", where, " is not aligned to its ", size, "-byte elements (",
                       dtype_name(t.dtype), ")"));
  }
  extent(t, name);
}

namespace {

// A tensor of fixed dtype beside q: lse (float32), and the int32 lengths and page indices
// (cu_seqlens_*, seqused_k, block_table; check_view already makes a 1-D one contiguous).
void check_aux(const TensorView& t, const char* name, int rank, DType dtype, const Device& dev) {
  check_view(t, name, rank);
  if (t.dtype != dtype)
    fail(name, str_cat("expected ", dtype_name(dtype), ", got ", dtype_name(t.dtype)));
  if (!(t.device == dev)) fail(name, "must be on the same device as q");
}

void check_entries(const TensorView& t, const char* name, int64_t len) {
  if (t.shape[0] != len) fail(name, str_cat("expected ", len, " entries, got ", t.shape[0]));
}

// An output may share memory with no input (the backends read inputs while they write outputs;
// on the CPU path a clobbered block_table or cu_seqlens would send reads out of bounds). Runs after
// check_view of every tensor, so extent() cannot throw here.
void check_disjoint(const TensorView& output, const char* name, const AttentionParams& p) {
  const std::pair<const TensorView*, const char*> inputs[] = {{&p.q, "q"},
                                                              {&p.k, "k"},
                                                              {&p.v, "v"},
                                                              {&p.cu_seqlens_q, "cu_seqlens_q"},
                                                              {&p.cu_seqlens_k, "cu_seqlens_k"},
                                                              {&p.seqused_k, "seqused_k"},
                                                              {&p.block_table, "block_table"},
                                                              {&p.q_descale, "q_descale"},
                                                              {&p.k_descale, "k_descale"},
                                                              {&p.v_descale, "v_descale"}};
  for (const auto& [input, input_name] : inputs)
    if (input->defined() && overlaps(output, *input))
      fail(name, str_cat("overlaps ", input_name, " in memory"));
}

}  // namespace

namespace {

// The search's sums: 128 bits, so that no sum of two 64-bit extents can overflow.
using Wide = __int128;

// Floor and ceiling of n / d for d > 0 (C++ division truncates toward zero).
Wide floor_div(Wide n, Wide d) {
  return n / d - (n % d != 0 && n < 0);
}
Wide ceil_div(Wide n, Wide d) {
  return n / d + (n % d != 0 && n > 0);
}

// One term of sum_k t_k c_k = target: the coefficient (bytes) and the range of the digit t_k.
struct Term {
  int64_t c, lo, hi;
};

// Whether sum_k t_k c_k = target has a solution with lo_k <= t_k <= hi_k. Terms are sorted by
// decreasing coefficient; rest_lo/hi[k] bound what the terms after k can add, gcd[k] divides every
// coefficient from k on. Depth-first over the digits, largest first: for views whose strides nest
// (each stride beyond the span of the smaller ones: every layout a framework produces) at most
// two digits fit at each level, so the search is tiny; `budget` bounds it otherwise, and an
// exhausted budget answers "may overlap".
bool solvable(const std::vector<Term>& terms, const std::vector<Wide>& rest_lo,
              const std::vector<Wide>& rest_hi, const std::vector<int64_t>& gcd, size_t k,
              Wide target, int64_t& budget) {
  if (--budget < 0) return true;
  if (k == terms.size()) return target == 0;
  if (target % gcd[k] != 0) return false;
  const Term& t = terms[k];
  const Wide lo = std::max<Wide>(t.lo, ceil_div(target - rest_hi[k], t.c));
  const Wide hi = std::min<Wide>(t.hi, floor_div(target - rest_lo[k], t.c));
  for (Wide x = lo; x <= hi; ++x)
    if (solvable(terms, rest_lo, rest_hi, gcd, k + 1, target - x * t.c, budget)) return true;
  return false;
}

}  // namespace

// Element-exact: a byte of element x of a lies at a0 + sum_i x_i sa_i + e (0 <= e < size_a), and
// likewise for b, so the views share a byte iff
//   sum_i x_i sa_i + e - sum_j y_j sb_j - f = b0 - a0
// has a solution in their index boxes. Views cut from one buffer whose elements interleave
// without meeting (K and V of one [.., 2, h, d] tensor) do not overlap; the byte intervals alone
// would say they do.
bool overlaps(const TensorView& a, const TensorView& b) {
  if (empty(a) || empty(b)) return false;
  const char* a0 = static_cast<const char*>(a.data);
  const char* b0 = static_cast<const char*>(b.data);
  const int64_t size_a = static_cast<int64_t>(dtype_size(a.dtype));
  const int64_t size_b = static_cast<int64_t>(dtype_size(b.dtype));
  const char* a1 = a0 + extent(a, "") * size_a;
  const char* b1 = b0 + extent(b, "") * size_b;
  if (!(a0 < b1 && b0 < a1)) return false;

  // The terms, a's digits in [0, n - 1] and b's in [-(n - 1), 0]; terms of equal coefficient
  // merge into one digit whose range is the sum of theirs.
  std::vector<Term> terms;
  auto add = [&](int64_t c, int64_t lo, int64_t hi) {
    if (c == 0 || lo == hi) return;
    for (Term& t : terms)
      if (t.c == c) {
        t.lo += lo, t.hi += hi;
        return;
      }
    terms.push_back({c, lo, hi});
  };
  // (A dimension of size 1 adds nothing, whatever its stride: it is skipped before the product.)
  for (int i = 0; i < a.rank; ++i)
    if (a.shape[i] > 1) add(a.stride[i] * size_a, 0, a.shape[i] - 1);
  for (int i = 0; i < b.rank; ++i)
    if (b.shape[i] > 1) add(b.stride[i] * size_b, -(b.shape[i] - 1), 0);
  add(1, 0, size_a - 1);
  add(1, -(size_b - 1), 0);
  std::sort(terms.begin(), terms.end(), [](const Term& x, const Term& y) { return x.c > y.c; });
  const size_t n = terms.size();
  std::vector<Wide> rest_lo(n, 0), rest_hi(n, 0);
  std::vector<int64_t> gcd(n, 0);
  for (size_t k = n; k-- > 0;) {
    if (k + 1 < n) {
      rest_lo[k] = rest_lo[k + 1] + Wide{terms[k + 1].lo} * terms[k + 1].c;
      rest_hi[k] = rest_hi[k + 1] + Wide{terms[k + 1].hi} * terms[k + 1].c;
    }
    gcd[k] = std::gcd(terms[k].c, k + 1 < n ? gcd[k + 1] : int64_t{0});
  }
  if (n == 0) return b0 == a0;
  int64_t budget = 100000;
  return solvable(terms, rest_lo, rest_hi, gcd, 0, Wide{b0 - a0}, budget);
}

// True when two distinct elements of the view share memory (e.g. a zero stride on a dimension of
// size > 1). Sorting the dimensions by stride, the view is free of self-overlap when every stride
// exceeds the span of the smaller-strided dimensions; outputs must be, or writes would race.
bool aliases_itself(const TensorView& t) {
  if (empty(t)) return false;
  int dims[kMaxRank];
  int n = 0;
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] > 1) dims[n++] = i;
  std::sort(dims, dims + n, [&](int a, int b) { return t.stride[a] < t.stride[b]; });
  int64_t span = 0;  // one past the largest offset reachable with the dimensions so far
  for (int k = 0; k < n; ++k) {
    if (t.stride[dims[k]] <= span) return true;
    span += (t.shape[dims[k]] - 1) * t.stride[dims[k]];
  }
  return false;
}

Problem describe(const AttentionParams& p) {
  Problem pr;
  const bool varlen_q = p.cu_seqlens_q.defined();
  pr.varlen_q = varlen_q;
  pr.paged = p.block_table.defined();
  pr.varlen_k = p.cu_seqlens_k.defined();
  pr.seqused = p.seqused_k.defined();
  if (pr.paged && pr.varlen_k) fail("cu_seqlens_k", "cannot be combined with block_table");
  if (pr.paged && !pr.seqused) fail("seqused_k", "is required with block_table (paged KV)");

  // Tensors, ranks, dtypes, devices.
  check_view(p.q, "q", varlen_q ? 3 : 4);
  check_view(p.out, "out", varlen_q ? 3 : 4);
  check_view(p.k, "k", (pr.varlen_k ? 3 : 4));
  check_view(p.v, "v", (pr.varlen_k ? 3 : 4));
  pr.device = p.q.device;
  pr.dtype = p.q.dtype;
  constexpr DType kE4m3 = DType::kFloat8E4M3;
  if (!is_float(pr.dtype) && pr.dtype != kE4m3)
    fail("q", str_cat("dtype ", dtype_name(pr.dtype),
                      " is not supported (float32, float16, bfloat16, float8_e4m3fn)"));
  // e4m3 q needs e4m3 k and v and gives bfloat16 (FA3's fp8 path); a float q may read an e4m3
  // k and v (an fp8 KV cache), and a float32 q a 16-bit one (the CPU runner's bf16 cache).
  const bool narrower_kv = pr.dtype == DType::kFloat32 &&
                           (p.k.dtype == DType::kBFloat16 || p.k.dtype == DType::kFloat16);
  pr.kv_dtype = pr.dtype == kE4m3 || p.k.dtype == kE4m3 ? kE4m3
                : narrower_kv                           ? p.k.dtype
                                                        : pr.dtype;
  pr.out_dtype = pr.dtype == kE4m3 ? DType::kBFloat16 : pr.dtype;
  const TensorView* same[] = {&p.k, &p.v, &p.out};
  const char* same_name[] = {"k", "v", "out"};
  const DType want[] = {pr.kv_dtype, pr.kv_dtype, pr.out_dtype};
  for (int i = 0; i < 3; ++i) {
    if (same[i]->dtype != want[i]) {
      const std::string got = str_cat("dtype ", dtype_name(same[i]->dtype));
      if (i == 2 && pr.dtype == kE4m3)
        fail("out", got + " is not bfloat16 (a float8_e4m3fn q gives a bfloat16 out)");
      if (i == 1 && pr.kv_dtype != pr.dtype)  // v follows k where k may differ from q
        fail("v", got + " differs from k's " + dtype_name(pr.kv_dtype));
      fail(same_name[i], got + " differs from q's " + dtype_name(pr.dtype));
    }
    if (!(same[i]->device == pr.device)) fail(same_name[i], "must be on the same device as q");
  }
  const int qr = p.q.rank, kr = p.k.rank;

  // Sizes.
  pr.h_q = p.q.shape[qr - 2];
  pr.head_dim = p.q.shape[qr - 1];
  pr.h_kv = p.k.shape[kr - 2];
  pr.head_dim_v = p.v.shape[kr - 1];
  if (pr.h_q <= 0) fail("q", "number of heads must be positive");
  if (pr.h_kv <= 0) fail("k", "number of heads must be positive");
  if (pr.h_q % pr.h_kv != 0)
    fail("k", str_cat("h_q (", pr.h_q, ") must be a multiple of h_kv (", pr.h_kv, ")"));
  if (pr.head_dim <= 0 || pr.head_dim > kMaxHeadDim)
    fail("q", str_cat("head_dim ", pr.head_dim, " is not supported (1..", kMaxHeadDim, ")"));
  if (pr.head_dim_v <= 0 || pr.head_dim_v > kMaxHeadDim)
    fail("v", str_cat("head_dim ", pr.head_dim_v, " is not supported (1..", kMaxHeadDim, ")"));
  if (p.k.shape[kr - 1] != pr.head_dim)
    fail("k", str_cat("head_dim ", p.k.shape[kr - 1], " differs from q's ", pr.head_dim));
  for (int i = 0; i < kr - 1; ++i)
    if (p.v.shape[i] != p.k.shape[i])
      fail("v", str_cat("shape ", shape_string(p.v), " does not match k's ", shape_string(p.k),
                        " (except the head dim)"));
  for (int i = 0; i < qr - 1; ++i)
    if (p.out.shape[i] != p.q.shape[i])
      fail("out",
           str_cat("shape ", shape_string(p.out), " does not match q's ", shape_string(p.q)));
  if (p.out.shape[qr - 1] != pr.head_dim_v)
    fail("out", str_cat("head_dim ", p.out.shape[qr - 1], " differs from v's ", pr.head_dim_v));

  if (varlen_q) {
    check_aux(p.cu_seqlens_q, "cu_seqlens_q", 1, DType::kInt32, pr.device);
    if (p.cu_seqlens_q.shape[0] < 1) fail("cu_seqlens_q", "needs batch + 1 >= 1 entries");
  }
  pr.batch = varlen_q ? p.cu_seqlens_q.shape[0] - 1 : p.q.shape[0];
  if (pr.paged) {
    check_aux(p.block_table, "block_table", 2, DType::kInt32, pr.device);
    if (p.block_table.shape[0] != pr.batch)
      fail("block_table",
           str_cat("has ", p.block_table.shape[0], " rows for a batch of ", pr.batch));
    pr.num_pages = p.k.shape[0];
    pr.page_size = p.k.shape[1];
    pr.pages_per_seq = p.block_table.shape[1];
    if (pr.page_size <= 0) fail("k", "page size (dimension 1 of the paged cache) must be positive");
  } else if (pr.varlen_k) {
    check_aux(p.cu_seqlens_k, "cu_seqlens_k", 1, DType::kInt32, pr.device);
    check_entries(p.cu_seqlens_k, "cu_seqlens_k", pr.batch + 1);
  } else if (p.k.shape[0] != pr.batch) {
    fail("k", str_cat("batch ", p.k.shape[0], " differs from q's ", pr.batch));
  }
  if (pr.seqused) {
    check_aux(p.seqused_k, "seqused_k", 1, DType::kInt32, pr.device);
    check_entries(p.seqused_k, "seqused_k", pr.batch);
  }

  // Descale factors: float32 [batch, h_kv], each only beside the e4m3 tensor it scales.
  const std::pair<const TensorView*, const char*> descales[] = {
      {&p.q_descale, "q_descale"}, {&p.k_descale, "k_descale"}, {&p.v_descale, "v_descale"}};
  for (int i = 0; i < 3; ++i) {
    const auto& [d, name] = descales[i];
    if (!d->defined()) continue;
    if ((i == 0 ? pr.dtype : pr.kv_dtype) != kE4m3)
      fail(name, str_cat("applies to a float8_e4m3fn ",
                         i == 0   ? "q"
                         : i == 1 ? "k"
                                  : "v",
                         ", not a ", dtype_name(i == 0 ? pr.dtype : pr.kv_dtype), " one"));
    check_aux(*d, name, 2, DType::kFloat32, pr.device);
    if (d->shape[0] != pr.batch || d->shape[1] != pr.h_kv)
      fail(name, str_cat("shape ", shape_string(*d), " is not [batch, h_kv] = [", pr.batch, ", ",
                         pr.h_kv, "]"));
  }

  if (p.lse.defined()) {
    check_aux(p.lse, "lse", varlen_q ? 2 : 3, DType::kFloat32, pr.device);
    const bool ok = varlen_q ? (p.lse.shape[0] == pr.h_q && p.lse.shape[1] == p.q.shape[0])
                             : (p.lse.shape[0] == pr.batch && p.lse.shape[1] == pr.h_q &&
                                p.lse.shape[2] == p.q.shape[1]);
    if (!ok)
      fail("lse", str_cat("shape ", shape_string(p.lse), " does not match ",
                          varlen_q ? "[h_q, total_q]" : "[batch, h_q, seqlen_q]"));
  }

  // Aliasing, now that every tensor's view is known to be well formed.
  check_disjoint(p.out, "out", p);
  if (aliases_itself(p.out)) fail("out", "strides make distinct elements share memory");
  if (p.lse.defined()) {
    if (overlaps(p.lse, p.out)) fail("lse", "overlaps out in memory");
    check_disjoint(p.lse, "lse", p);
    if (aliases_itself(p.lse)) fail("lse", "strides make distinct elements share memory");
  }

  // Scalars.
  if (!std::isfinite(p.softmax_scale)) fail("softmax_scale", "must be finite");
  // 0 means the default; a subnormal scale is not a smaller scale but, in the GPU kernels'
  // flush-to-zero arithmetic, a zero one (uniform attention): refused, not silently changed.
  if (p.softmax_scale != 0.0f && std::abs(p.softmax_scale) < std::numeric_limits<float>::min())
    fail("softmax_scale", str_cat(static_cast<double>(p.softmax_scale),
                                  " is subnormal in float32 (0 asks for 1/sqrt(head_dim))"));
  pr.scale =
      p.softmax_scale != 0.0f ? p.softmax_scale : 1.0f / std::sqrt(static_cast<float>(pr.head_dim));
  // softcap: as the scale, a subnormal value would be a different one (0: off) in flush-to-zero
  // arithmetic; a negative one is no capping anyone defines (FlashAttention-2 ignores it).
  if (!std::isfinite(p.softcap)) fail("softcap", "must be finite");
  // Above 1e30 it caps nothing a float32 score reaches, and softcap * log2(e) (the CPU path's
  // units) would overflow.
  if (p.softcap < 0.0f || (p.softcap != 0.0f && p.softcap < std::numeric_limits<float>::min()) ||
      p.softcap > 1e30f)
    fail("softcap", str_cat("must be 0 (off) or a normal float32 in (0, 1e30], got ",
                            static_cast<double>(p.softcap)));
  pr.score_mod.softcap = p.softcap;
  if (p.alibi_slopes.defined()) {
    // [h_q] (one slope per head) or [batch, h_q] (per sequence and head), as FlashAttention-2.
    const TensorView& a = p.alibi_slopes;
    check_aux(a, "alibi_slopes", a.rank == 2 ? 2 : 1, DType::kFloat32, pr.device);
    const bool ok =
        a.rank == 1 ? a.shape[0] == pr.h_q : a.shape[0] == pr.batch && a.shape[1] == pr.h_q;
    if (!ok)
      fail("alibi_slopes", str_cat("shape ", shape_string(a), " is neither [h_q] = [", pr.h_q,
                                   "] nor [batch, h_q] = [", pr.batch, ", ", pr.h_q, "]"));
    pr.score_mod.alibi = a.ptr<const float>();
    pr.score_mod.alibi_batch_stride = a.rank == 2 ? a.stride[0] : 0;
    pr.score_mod.alibi_head_stride = a.stride[a.rank - 1];
    if (a.shape[a.rank - 1] == 1) pr.score_mod.alibi_head_stride = 0;
    if (pr.device.type == DeviceType::kCPU)
      for (int64_t b = 0; b < (a.rank == 2 ? pr.batch : 1); ++b)
        for (int64_t h = 0; h < pr.h_q; ++h)
          if (!std::isfinite(pr.score_mod.slope(b, h)))
            fail("alibi_slopes", str_cat("entry for sequence ", b, ", head ", h, " is not finite"));
  }
  if (p.window_left < -1) fail("window_left", str_cat("must be >= -1, got ", p.window_left));
  if (p.window_right < -1) fail("window_right", str_cat("must be >= -1, got ", p.window_right));
  if (p.causal && p.window_right > 0)
    fail("window_right", str_cat("must be 0 or -1 with causal, got ", p.window_right));
  pr.mask.left = p.window_left;
  pr.mask.right = p.causal ? 0 : p.window_right;
  if (p.num_splits < 0 || p.num_splits > kMaxSplits)
    fail("num_splits", str_cat("must be in [0, ", kMaxSplits, "], got ", p.num_splits));
  pr.num_splits = p.num_splits;
  if (p.max_seqlen_q < 0) fail("max_seqlen_q", "must not be negative");
  if (p.max_seqlen_k < 0) fail("max_seqlen_k", "must not be negative");

  // Lengths. Host-resident index tensors are read and checked entry by entry.
  const bool host = pr.device.type == DeviceType::kCPU;
  pr.max_q_len = varlen_q ? p.max_seqlen_q : p.q.shape[1];
  pr.max_kv_len = pr.paged ? p.max_seqlen_k : pr.varlen_k ? p.max_seqlen_k : p.k.shape[1];
  if (!host) {
    if (varlen_q && p.max_seqlen_q == 0 && p.q.shape[0] > 0)
      fail("max_seqlen_q", "is required with cu_seqlens_q on a CUDA device");
    if ((pr.paged || pr.varlen_k) && p.max_seqlen_k == 0)
      fail("max_seqlen_k", "is required with cu_seqlens_k or block_table on a CUDA device");
    return pr;
  }
  // max_len (max_seqlen_q/k) must bound every length unless `bounds_lengths` is false: with
  // seqused_k, max_seqlen_k bounds the keys used, which the seqused_k loop below checks.
  auto read_cu = [&](const TensorView& cu, const char* name, int64_t rows, const char* max_name,
                     int64_t& max_len, bool bounds_lengths) {
    const int32_t* c = cu.ptr<const int32_t>();
    if (c[0] < 0) fail(name, str_cat("entry 0 is negative (", c[0], ")"));
    int64_t longest = 0;
    for (int64_t b = 0; b < pr.batch; ++b) {
      if (c[b + 1] < c[b])
        fail(name, str_cat("must be non-decreasing, but entry ", b + 1, " (", c[b + 1],
                           ") < entry ", b, " (", c[b], ")"));
      longest = std::max<int64_t>(longest, c[b + 1] - c[b]);
    }
    if (c[pr.batch] > rows)
      fail(name, str_cat("last entry ", c[pr.batch], " exceeds the ", rows, " rows of the tensor"));
    if (bounds_lengths && max_len != 0 && max_len < longest)
      fail(max_name, str_cat(max_len, " is less than the longest sequence (", longest, ")"));
    max_len = longest;
  };
  if (varlen_q)
    read_cu(p.cu_seqlens_q, "cu_seqlens_q", p.q.shape[0], "max_seqlen_q", pr.max_q_len, true);
  if (pr.varlen_k)
    read_cu(p.cu_seqlens_k, "cu_seqlens_k", p.k.shape[0], "max_seqlen_k", pr.max_kv_len,
            !pr.seqused);
  if (pr.seqused) {
    const int32_t* used = p.seqused_k.ptr<const int32_t>();
    const int32_t* cu = pr.varlen_k ? p.cu_seqlens_k.ptr<const int32_t>() : nullptr;
    int64_t longest = 0;
    for (int64_t b = 0; b < pr.batch; ++b) {
      // Page size and pages per sequence are the caller's sizes (a stride-0 cache can make the
      // page size huge): their product saturates instead of overflowing.
      const int64_t cap = pr.paged ? saturating_mul(pr.pages_per_seq, pr.page_size)
                          : cu     ? int64_t{cu[b + 1]} - cu[b]
                                   : p.k.shape[1];
      if (used[b] < 0 || used[b] > cap)
        fail("seqused_k", str_cat("entry ", b, " is ", used[b], ", outside [0, ", cap, "]"));
      longest = std::max<int64_t>(longest, used[b]);
      if (pr.paged) {
        const int64_t pages = used[b] / pr.page_size + (used[b] % pr.page_size != 0);
        const int32_t* row = p.block_table.ptr<const int32_t>() + b * p.block_table.stride[0];
        for (int64_t i = 0; i < pages; ++i)
          if (row[i] < 0 || row[i] >= pr.num_pages)
            fail("block_table", str_cat("entry [", b, ", ", i, "] is ", row[i],
                                        ", outside the pool of ", pr.num_pages, " pages"));
      }
    }
    if ((pr.paged || pr.varlen_k) && p.max_seqlen_k != 0 && p.max_seqlen_k < longest)
      fail("max_seqlen_k",
           str_cat(p.max_seqlen_k, " is less than the longest sequence (", longest, ")"));
    if (pr.paged || pr.varlen_k) pr.max_kv_len = longest;
  }
  return pr;
}

HostLayout::HostLayout(const AttentionParams& p, const Problem& pr) : p_(p), pr_(pr) {
  const int64_t B = pr.batch;
  q_start_.resize(B);
  q_len_.resize(B);
  kv_start_.resize(B);
  kv_len_.resize(B);
  for (int64_t b = 0; b < B; ++b) {
    if (pr.varlen_q) {
      const int32_t* cu = p.cu_seqlens_q.ptr<const int32_t>();
      q_start_[b] = cu[b];
      q_len_[b] = cu[b + 1] - cu[b];
    } else {
      q_start_[b] = b * p.q.shape[1];
      q_len_[b] = p.q.shape[1];
    }
    if (pr.varlen_k) {
      const int32_t* cu = p.cu_seqlens_k.ptr<const int32_t>();
      kv_start_[b] = cu[b];
      kv_len_[b] = cu[b + 1] - cu[b];
    } else {
      kv_start_[b] = 0;
      kv_len_[b] = pr.paged ? 0 : p.k.shape[1];
    }
    if (pr.seqused) kv_len_[b] = p.seqused_k.ptr<const int32_t>()[b];
  }
}

int64_t HostLayout::q_rows() const {
  return pr_.varlen_q ? p_.q.shape[0] : pr_.batch * p_.q.shape[1];
}

int64_t HostLayout::q_offset(int64_t b, int64_t t, int64_t h) const {
  const TensorView& q = p_.q;
  return pr_.varlen_q ? (q_start_[b] + t) * q.stride[0] + h * q.stride[1]
                      : b * q.stride[0] + t * q.stride[1] + h * q.stride[2];
}

int64_t HostLayout::out_offset(int64_t b, int64_t t, int64_t h) const {
  const TensorView& o = p_.out;
  return pr_.varlen_q ? (q_start_[b] + t) * o.stride[0] + h * o.stride[1]
                      : b * o.stride[0] + t * o.stride[1] + h * o.stride[2];
}

int64_t HostLayout::lse_offset(int64_t b, int64_t t, int64_t h) const {
  const TensorView& l = p_.lse;
  return pr_.varlen_q ? h * l.stride[0] + (q_start_[b] + t) * l.stride[1]
                      : b * l.stride[0] + h * l.stride[1] + t * l.stride[2];
}

int64_t HostLayout::kv_row(const TensorView& x, int64_t b, int64_t j, int64_t h) const {
  if (pr_.paged) {
    const int32_t* row = p_.block_table.ptr<const int32_t>() + b * p_.block_table.stride[0];
    const int64_t page = row[j / pr_.page_size];
    return page * x.stride[0] + (j % pr_.page_size) * x.stride[1] + h * x.stride[2];
  }
  if (pr_.varlen_k) return (kv_start_[b] + j) * x.stride[0] + h * x.stride[1];
  return b * x.stride[0] + j * x.stride[1] + h * x.stride[2];
}

int64_t HostLayout::k_offset(int64_t b, int64_t j, int64_t h) const {
  return kv_row(p_.k, b, j, h);
}
int64_t HostLayout::v_offset(int64_t b, int64_t j, int64_t h) const {
  return kv_row(p_.v, b, j, h);
}

}  // namespace flashserve::attention
