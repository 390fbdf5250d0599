// Fuzzes the attention API on the CPU: a random well-formed case (tests/support/AttentionCase:
// dense/varlen q, dense/varlen/paged KV, GQA, masks, split-KV, strided views, seqused_k, every
// float dtype, softcap and ALiBi, a few NaNs in q and k), then adversarial edits of any field of AttentionParams and
// of the host index tensors (cu_seqlens, seqused_k, block_table entries), including a view moved
// into an input's buffer (an out interleaved with q's padding is accepted, one sharing an element
// refused: the reference, computed after the call, would see a clobbered input). Properties:
//   - validate() either accepts, or throws flashserve::Error of kind invalid-argument or
//     unsupported naming an argument; it never crashes, hangs or trips ASan/UBSan;
//   - an accepted call whose views lie inside the buffers (the caller's part of the contract)
//     runs, and agrees with the float64 reference: NaN in the same elements of out (a NaN in q or
//     a seen key makes a row NaN; one in v, where a moved view reads q's or k's NaNs, a column)
//     and of lse, the same rows with no key (zero, lse -inf), the rest within the tests' tolerance.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

#include "attention/problem.h"
#include "attention/reference/naive.h"
#include "byte_reader.h"
#include "common/half.h"
#include "flashserve/attention.h"
#include "support/attention_case.h"
#include "support/compare.h"

namespace fs = flashserve;
using fs::fuzz::ByteReader;
using fs::testing::AttentionCase;
using fs::testing::CaseSpec;

namespace {

[[noreturn]] void fail(const char* what, double a = 0, double b = 0) {
  std::fprintf(stderr, "attention fuzz: %s (%g, %g)\n", what, a, b);
  std::abort();
}

CaseSpec spec_from(ByteReader& in) {
  CaseSpec s;
  s.batch = in.in(0, 3);
  s.q_layout = in.flag() ? fs::testing::QLayout::kVarlen : fs::testing::QLayout::kDense;
  const int64_t kv = in.in(0, 2);
  s.kv_layout = kv == 0   ? fs::testing::KVLayout::kDense
                : kv == 1 ? fs::testing::KVLayout::kVarlen
                          : fs::testing::KVLayout::kPaged;
  s.use_seqused_k = in.flag();
  s.kv_extra = s.use_seqused_k ? in.in(0, 3) : 0;
  const bool dense_q = s.q_layout == fs::testing::QLayout::kDense;
  const bool dense_kv = s.kv_layout == fs::testing::KVLayout::kDense && !s.use_seqused_k;
  s.q_lens.assign(std::max<int64_t>(s.batch, 1), 0);
  s.kv_lens.assign(std::max<int64_t>(s.batch, 1), 0);
  for (size_t b = 0; b < s.q_lens.size(); ++b) {
    s.q_lens[b] = dense_q && b ? s.q_lens[0] : in.in(0, 20);
    s.kv_lens[b] = dense_kv && b ? s.kv_lens[0] : in.in(0, 40);
  }
  s.h_kv = in.in(1, 3);
  s.h_q = s.h_kv * in.in(1, 3);
  s.head_dim = in.in(1, 40);
  s.head_dim_v = in.in(0, 40);
  const int64_t dt = in.in(0, 2);
  s.dtype = dt == 0 ? fs::DType::kFloat32 : dt == 1 ? fs::DType::kFloat16 : fs::DType::kBFloat16;
  s.page_size = in.in(1, 9);
  s.spare_pages = in.in(0, 2);
  s.causal = in.flag();
  s.window_left = static_cast<int32_t>(in.in(-1, 12));
  s.window_right = s.causal ? 0 : static_cast<int32_t>(in.in(-1, 12));
  s.with_lse = in.flag();
  s.num_splits = static_cast<int32_t>(in.in(0, 5));
  s.pad = in.in(0, 2);
  s.poison_unused_kv = false;  // v's own buffer holds no NaN
  s.seed = in.raw<uint64_t>();
  // The score modifiers from the seed's top bits, so that every input kept in the corpus parses
  // as before: softcap off or 0.5, 2, 30; ALiBi off, per head, or per sequence and head.
  const float caps[4] = {0.0f, 0.5f, 2.0f, 30.0f};
  s.softcap = caps[s.seed >> 62];
  s.alibi = static_cast<int>((s.seed >> 60) & 3) % 3;
  return s;
}

// Overwrites the NaN padding of q, k, v (AttentionCase marks it so a kernel reading it shows) with
// finite values: edited views may legitimately read it here.
void unpoison_inputs(AttentionCase& c) {
  auto bufs = c.buffers();
  const fs::DType dt = c.spec().dtype;
  for (int i : {AttentionCase::kQ, AttentionCase::kK, AttentionCase::kV}) {
    const int64_t n = static_cast<int64_t>(bufs[i].bytes / fs::dtype_size(dt));
    for (int64_t e = 0; e < n; ++e)
      if (std::isnan(fs::load_float(bufs[i].host, e, dt)))
        fs::store_float(bufs[i].host, e, dt, 0.25f * static_cast<float>((e * 7919) % 13) - 1.5f);
  }
}

fs::TensorView* view_of(fs::AttentionParams& p, int64_t i) {
  fs::TensorView* views[] = {
      &p.q,         &p.k,          &p.v, &p.out, &p.lse, &p.cu_seqlens_q, &p.cu_seqlens_k,
      &p.seqused_k, &p.block_table};
  return views[i];
}

// One adversarial edit of the params or of the host index tensors.
void edit(ByteReader& in, AttentionCase& c, fs::AttentionParams& p) {
  fs::TensorView& t = *view_of(p, in.in(0, 8));
  switch (in.in(0, 14)) {
    case 0:
      t.shape[in.in(0, 3)] = in.flag() ? in.in(-3, 64) : in.raw<int64_t>();
      break;
    case 1:
      t.stride[in.in(0, 3)] = in.flag() ? in.in(-3, 64) : in.raw<int64_t>();
      break;
    case 2:
      t.rank = static_cast<int32_t>(in.in(-1, 5));
      break;
    case 3:
      t.dtype = static_cast<fs::DType>(in.in(-1, 5));
      break;
    case 4:  // a pointer off by a few bytes: misaligned, or into a neighbour
      if (t.data) t.data = static_cast<char*>(t.data) + in.in(-3, 3);
      break;
    case 5:
      t = {};
      break;
    case 6: {  // an entry of an int32 index tensor
      auto bufs = c.buffers();
      const int64_t which = in.in(AttentionCase::kCuSeqlensQ, AttentionCase::kBlockTable);
      if (bufs[which].bytes >= 4) {
        auto* e = reinterpret_cast<int32_t*>(bufs[which].host);
        const int64_t n = static_cast<int64_t>(bufs[which].bytes / 4);
        e[in.in(0, n - 1)] = in.flag() ? static_cast<int32_t>(in.in(-2, 64)) : in.raw<int32_t>();
      }
      break;
    }
    case 7:
      (in.flag() ? p.max_seqlen_q : p.max_seqlen_k) = in.flag() ? in.in(-2, 64) : in.raw<int64_t>();
      break;
    case 8:
      p.softmax_scale = in.flag() ? in.raw<float>() : static_cast<float>(in.in(-4, 4)) * 0.25f;
      break;
    case 9:
      p.window_left = in.flag() ? static_cast<int32_t>(in.in(-3, 30)) : in.raw<int32_t>();
      break;
    case 10:
      p.window_right = in.flag() ? static_cast<int32_t>(in.in(-3, 30)) : in.raw<int32_t>();
      break;
    case 11:
      p.num_splits = in.flag() ? static_cast<int32_t>(in.in(-2, 300)) : in.raw<int32_t>();
      break;
    case 12:
      p.causal = !p.causal;
      break;
    case 13: {  // into q's, k's or v's buffer: interleaved with that input (padding, or another
                // head's elements), or sharing elements with it; overlap is decided per element
      auto bufs = c.buffers();
      const int64_t which = in.in(AttentionCase::kQ, AttentionCase::kV);
      const int64_t esz = static_cast<int64_t>(fs::dtype_size(c.spec().dtype));
      const int64_t elems = static_cast<int64_t>(bufs[which].bytes) / esz;
      if (elems > 0) t.data = bufs[which].host + in.in(0, std::min<int64_t>(elems - 1, 255)) * esz;
      break;
    }
    default:
      t.device = {in.flag() ? fs::DeviceType::kCUDA : fs::DeviceType::kCPU, 0};
      break;
  }
}

// Whether the elements of `t` lie inside one of the case's buffers. A view that is not well formed
// (negative sizes or strides, an extent past int64) counts as inside: validation refuses it before
// reading anything through it.
bool inside_buffers(AttentionCase& c, const fs::TensorView& t) {
  if (!t.defined() || t.rank < 0 || t.rank > fs::kMaxRank) return true;
  int64_t last = 0;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] < 0 || t.stride[d] < 0) return true;
    if (t.shape[d] == 0) return true;  // no element
    int64_t term;
    if (__builtin_mul_overflow(t.shape[d] - 1, t.stride[d], &term) ||
        __builtin_add_overflow(last, term, &last))
      return true;
  }
  const int64_t size = static_cast<int64_t>(fs::dtype_size(t.dtype));
  if (last > (INT64_MAX / size) - 1) return true;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(t.data);
  const uintptr_t hi = lo + static_cast<uintptr_t>((last + 1) * size);
  for (const auto& b : c.buffers()) {
    const uintptr_t b0 = reinterpret_cast<uintptr_t>(b.host);
    if (b.bytes && lo >= b0 && hi <= b0 + b.bytes) return true;
  }
  return false;
}

// Whether a key that query t of sequence b (head h) does not see has a NaN or inf value in column
// d. The reference, like FlashAttention, leaves such keys out of the row; the CPU path multiplies
// a tile's values by every row's probabilities, a masked key's being 0, and 0 x NaN is NaN: the
// column may then be NaN (docs/cpu-path.md; the contract leaves it open).
bool unseen_value_not_finite(const fs::AttentionParams& p, const fs::attention::Problem& pr,
                             const fs::attention::HostLayout& L, int64_t b, int64_t t, int64_t h,
                             int64_t d) {
  const int64_t hk = h / (pr.h_q / pr.h_kv);
  for (int64_t j = 0; j < L.kv_len(b); ++j)
    if (!pr.mask.visible(t, j, L.q_len(b), L.kv_len(b)) &&
        !std::isfinite(fs::load_float(p.v.data, L.v_offset(b, j, hk) + d, pr.dtype)))
      return true;
  return false;
}

// The accepted call against the float64 reference: NaN in the same elements of out and of lse
// (element by element: a v view moved into q's or k's buffer carries their NaNs into some columns
// of rows whose lse is finite; a NaN column may also come from a key the row does not see, above),
// then the tests' tolerance (support/compare.h: rows with no key zero with lse -inf, the rest
// within twice the error of a naive kernel in the same precision).
void compare_with_reference(const fs::AttentionParams& p) {
  namespace ref = fs::attention::reference;
  const fs::attention::Problem pr = fs::attention::describe(p);
  const fs::attention::HostLayout L(p, pr);
  ref::NaiveOutput exact = ref::naive_forward(p, ref::Emulate::kExact);
  const ref::NaiveOutput lowp = ref::naive_forward(p, ref::Emulate::kLowPrecision);
  const ref::NaiveOutput got = fs::testing::read_output(p);
  const int64_t Dv = pr.head_dim_v;
  for (int64_t b = 0; b < pr.batch; ++b)
    for (int64_t t = 0; t < L.q_len(b); ++t)
      for (int64_t h = 0; h < pr.h_q; ++h) {
        const int64_t row = L.q_row(b, t) * pr.h_q + h;
        for (int64_t d = 0; d < Dv; ++d) {
          const int64_t i = row * Dv + d;
          if (std::isnan(got.out[i]) == std::isnan(exact.out[i])) continue;
          if (std::isnan(got.out[i]) && unseen_value_not_finite(p, pr, L, b, t, h, d)) {
            exact.out[i] = got.out[i];  // NaN here is allowed: not compared below
            continue;
          }
          fail("out: NaN where the reference is not, or the reverse", got.out[i], exact.out[i]);
        }
        if (!got.lse.empty() && std::isnan(got.lse[row]) != std::isnan(exact.lse[row]))
          fail("lse: NaN where the reference is not, or the reverse", got.lse[row], exact.lse[row]);
      }
  const ::testing::AssertionResult close = fs::testing::attention_close(got, exact, lowp, pr.dtype);
  if (!close) {
    std::fprintf(stderr, "%s\n", close.message());
    fail("the call differs from the float64 reference beyond the tolerance");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  AttentionCase c(spec_from(in));  // spec_from keeps to what AttentionCase accepts
  unpoison_inputs(c);
  // A few NaNs in q and k (v stays finite: see spec_from).
  for (int64_t n = in.in(0, 3); n > 0; --n) {
    auto bufs = c.buffers();
    const int64_t which = in.flag() ? AttentionCase::kQ : AttentionCase::kK;
    const int64_t elems = static_cast<int64_t>(bufs[which].bytes / fs::dtype_size(c.spec().dtype));
    if (elems > 0)
      fs::store_float(bufs[which].host, in.in(0, elems - 1), c.spec().dtype,
                      std::numeric_limits<float>::quiet_NaN());
  }
  fs::AttentionParams p = c.params();
  for (int64_t n = in.in(0, 3); n > 0; --n) edit(in, c, p);

  // Validation reads the host index tensors (cu_seqlens, seqused_k, block_table) once their views
  // are well formed: views that are well formed but reach past their buffers are the caller
  // breaking the contract, not something the library can detect.
  for (int64_t i = AttentionCase::kCuSeqlensQ; i <= AttentionCase::kBlockTable; ++i)
    if (!inside_buffers(c, *view_of(p, i))) return 0;
  fs::attention::Problem pr;
  try {
    pr = fs::attention::describe(p);
  } catch (const fs::Error& e) {
    if (e.kind() != fs::ErrorKind::kInvalidArgument && e.kind() != fs::ErrorKind::kUnsupported)
      fail("validation threw an error of an unexpected kind");
    if (e.argument().empty()) fail("validation error names no argument");
    return 0;
  }
  if (pr.device.type != fs::DeviceType::kCPU) return 0;
  for (int64_t i = 0; i < 9; ++i)
    if (!inside_buffers(c, *view_of(p, i))) return 0;  // the caller's part of the contract
  // Scales far from 1/sqrt(d) make float32 scores overflow where float64 does not: validation
  // is fuzzed with any scale above, the comparison only with these.
  if (p.softmax_scale != 0 &&
      !(std::abs(p.softmax_scale) >= 1e-3f && std::abs(p.softmax_scale) <= 4))
    return 0;
  // Bound the work (stride-0 views can describe huge problems over tiny buffers).
  double work = 0;
  {
    const fs::attention::HostLayout L(p, pr);
    for (int64_t b = 0; b < pr.batch; ++b)
      work += static_cast<double>(L.q_len(b)) * static_cast<double>(L.kv_len(b) + 1);
  }
  if (work * static_cast<double>(pr.h_q * (pr.head_dim + pr.head_dim_v)) > 4e6) return 0;
  fs::attention_forward(p);
  compare_with_reference(p);
  return 0;
}
