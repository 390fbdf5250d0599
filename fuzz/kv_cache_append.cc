// Fuzzes the KV-cache append on the CPU (flashserve/kv_cache.h): a random case whose tensors lie
// exactly inside their buffers (the caller's part of the contract), with adversarial lengths,
// cache_batch_idx and block_table entries, rotary tables too short, a cache too small. Properties:
//   - validate() either accepts, or throws flashserve::Error of kind invalid-argument naming an
//     argument; it never crashes or trips ASan/UBSan (the buffers are exactly the views' extent, so
//     a write past a cache shows);
//   - an accepted call writes the new keys (rotated) and values at their slots, and nothing else:
//     every other cache element is bit for bit unchanged; q_out is q rotated; seqlens_out is
//     cache_seqlens + s_new;
//   - no accepted call writes one cache slot twice (duplicate cache_batch_idx rows with new
//     tokens, two block-table entries on one page slot: refused);
//   - K and V caches split from one tensor (kv[:, :, 0], kv[:, :, 1]) are accepted and appended
//     like separate ones; caches that share an element (v shifted onto k, or the same view) are
//     refused.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "byte_reader.h"
#include "common/half.h"
#include "flashserve/kv_cache.h"

namespace fs = flashserve;
using fs::fuzz::ByteReader;

namespace {

[[noreturn]] void fail(const char* what, double a = 0, double b = 0) {
  std::fprintf(stderr, "kv_cache_append fuzz: %s (%g, %g)\n", what, a, b);
  std::abort();
}

struct Buffer {  // a contiguous tensor in a buffer of exactly its size
  std::vector<unsigned char> bytes;
  fs::TensorView view;
};

Buffer make(fs::DType dtype, std::initializer_list<int64_t> shape) {
  Buffer b;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  b.bytes.resize(static_cast<size_t>(n) * fs::dtype_size(dtype) + (n == 0 ? 1 : 0));
  b.view = fs::make_view(b.bytes.data(), dtype, shape);
  return b;
}

void fill(Buffer& b, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  const int64_t n = b.view.numel();
  for (int64_t i = 0; i < n; ++i) fs::store_float(b.bytes.data(), i, b.view.dtype, normal(rng));
}

int32_t* ints(Buffer& b) {
  return reinterpret_cast<int32_t*>(b.bytes.data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const int64_t batch = in.in(0, 3), h_kv = in.in(1, 3), h_q = h_kv * in.in(1, 2);
  const int64_t d = in.in(1, 12), dv = in.in(1, 12);
  const bool paged = in.flag(), use_idx = !paged && in.flag();
  const int64_t page = in.in(1, 5), pages_per_seq = in.in(0, 3), s_cache = in.in(0, 10);
  const int64_t rows =
      paged ? batch * pages_per_seq + in.in(0, 2) : batch + (use_idx ? in.in(0, 2) : 0);
  const int64_t rpe = paged ? page : s_cache;
  const int64_t s_new = in.flag() ? in.in(0, 4) : -1;  // -1: no new tokens
  const bool rotary = in.flag(), with_q = rotary && in.flag();
  const int64_t rot_cols = in.in(1, 7), s_rot = in.in(0, 16), s_q = in.in(0, 3);
  const fs::DType dtype = static_cast<fs::DType>(in.in(0, 2));  // float32, float16, bfloat16
  const fs::DType rot_dtype = in.flag() ? fs::DType::kFloat32 : dtype;
  const bool lengths_tensor = in.flag(), with_out = in.flag();
  std::mt19937_64 rng(in.raw<uint64_t>());

  fs::KvCacheAppendParams p;
  Buffer kc = make(dtype, {rows, rpe, h_kv, d}), vc = make(dtype, {rows, rpe, h_kv, dv});
  fill(kc, rng), fill(vc, rng);
  p.k_cache = kc.view, p.v_cache = vc.view;
  Buffer kn, vn, lens, idx, table, cos, sin, q, q_out, out;
  if (s_new >= 0) {
    kn = make(dtype, {batch, s_new, h_kv, d}), vn = make(dtype, {batch, s_new, h_kv, dv});
    fill(kn, rng), fill(vn, rng);
    p.k_new = kn.view, p.v_new = vn.view;
  }
  if (lengths_tensor) {
    lens = make(fs::DType::kInt32, {batch});
    for (int64_t b = 0; b < batch; ++b) ints(lens)[b] = static_cast<int32_t>(in.in(-2, 14));
    p.cache_seqlens = lens.view;
  } else {
    p.cache_seqlen = in.in(-2, 14);
  }
  if (use_idx) {
    idx = make(fs::DType::kInt32, {batch});
    for (int64_t b = 0; b < batch; ++b) ints(idx)[b] = static_cast<int32_t>(in.in(-1, rows));
    p.cache_batch_idx = idx.view;
  }
  if (paged) {
    table = make(fs::DType::kInt32, {batch, pages_per_seq});
    for (int64_t i = 0; i < batch * pages_per_seq; ++i)
      ints(table)[i] = static_cast<int32_t>(in.in(-1, rows));
    p.block_table = table.view;
  }
  if (rotary) {
    cos = make(rot_dtype, {s_rot, rot_cols}), sin = make(rot_dtype, {s_rot, rot_cols});
    fill(cos, rng), fill(sin, rng);
    p.rotary_cos = cos.view, p.rotary_sin = sin.view;
    p.rotary_interleaved = in.flag();
  }
  if (with_q) {
    q = make(dtype, {batch, s_q, h_q, d}), q_out = make(dtype, {batch, s_q, h_q, d});
    fill(q, rng);
    p.q = q.view, p.q_out = q_out.view;
    p.q_positions_per_token = in.flag();
  }
  if (with_out) {
    out = make(fs::DType::kInt32, {batch});
    p.seqlens_out = out.view;
  }
  // Read last, so the corpus from before these options keeps its meaning (an exhausted reader
  // gives 0): the caches as two views of one [rows, rpe, 2, h_kv, d] tensor, k at [.., 0, ..],
  // v at [.., 1, ..] moved back by `shift` elements (shift > 0: v's first elements are k's), or
  // v the very view of k.
  const int interleave = dv == d && in.flag() ? static_cast<int>(in.in(0, 2)) : -1;
  const int64_t shift = interleave == 1 ? in.in(1, h_kv * d) : 0;
  Buffer kv;
  if (interleave >= 0) {
    kv = make(dtype, {rows, rpe, 2 * h_kv, d});  // [rows, rpe, 2, h_kv, d] in memory
    auto split = [&](int64_t element) {
      fs::TensorView t = kc.view;
      t.data = kv.bytes.data() + element * static_cast<int64_t>(fs::dtype_size(dtype));
      t.stride[0] = rpe * 2 * h_kv * d, t.stride[1] = 2 * h_kv * d;
      return t;
    };
    p.k_cache = split(0);
    p.v_cache = interleave == 2 ? p.k_cache : split(h_kv * d - shift);
    for (int64_t e = 0; e < rows * rpe; ++e)  // the same values as the separate caches
      for (int64_t c = 0; c < h_kv * d; ++c) {
        fs::store_float(kv.bytes.data(), e * 2 * h_kv * d + c, dtype,
                        fs::load_float(kc.bytes.data(), e * h_kv * d + c, dtype));
        fs::store_float(kv.bytes.data(), e * 2 * h_kv * d + h_kv * d + c, dtype,
                        fs::load_float(vc.bytes.data(), e * h_kv * d + c, dtype));
      }
  }
  const bool aliasing = interleave >= 1 && rows * rpe * h_kv * d > 0;

  try {
    fs::validate(p);
  } catch (const fs::Error& e) {
    if (e.kind() != fs::ErrorKind::kInvalidArgument || e.argument().empty())
      fail("validation threw something other than an invalid argument naming one");
    if (interleave == 0 && std::strstr(e.what(), "overlaps k_cache") != nullptr)
      fail("K and V caches with disjoint elements refused as overlapping");
    return 0;
  }
  if (aliasing) fail("caches sharing elements were accepted", static_cast<double>(shift));
  // Element addresses by the views' strides (separate caches, or the one interleaved tensor).
  unsigned char* kbuf = interleave >= 0 ? kv.bytes.data() : kc.bytes.data();
  unsigned char* vbuf = interleave >= 0 ? kv.bytes.data() : vc.bytes.data();
  const int64_t v_base = interleave >= 0 ? (static_cast<unsigned char*>(p.v_cache.data) - kbuf) /
                                               static_cast<int64_t>(fs::dtype_size(dtype))
                                         : 0;
  auto k_at = [&](int64_t slot, int64_t h, int64_t c) {
    return slot / rpe * p.k_cache.stride[0] + slot % rpe * p.k_cache.stride[1] +
           h * p.k_cache.stride[2] + c;
  };
  auto v_at = [&](int64_t slot, int64_t h, int64_t c) {
    return v_base + slot / rpe * p.v_cache.stride[0] + slot % rpe * p.v_cache.stride[1] +
           h * p.v_cache.stride[2] + c;
  };
  const std::vector<unsigned char> k_before(kbuf, kbuf + (interleave >= 0 ? kv : kc).bytes.size());
  const std::vector<unsigned char> v_before(vbuf, vbuf + (interleave >= 0 ? kv : vc).bytes.size());
  fs::kv_cache_append(p);

  // Expected: every new token at its slot; every other element unchanged.
  const int64_t n_new = s_new < 0 ? 0 : s_new, rd = rotary ? 2 * rot_cols : 0;
  std::vector<int> writes(static_cast<size_t>(rows * rpe), 0);
  auto len_of = [&](int64_t b) -> int64_t {
    return lengths_tensor ? ints(lens)[b] : p.cache_seqlen;
  };
  auto slot_of = [&](int64_t b, int64_t pos) -> int64_t {
    const int64_t entry = paged     ? ints(table)[b * pages_per_seq + pos / page]
                          : use_idx ? ints(idx)[b]
                                    : b;
    return entry * rpe + (paged ? pos % page : pos);
  };
  // The rotated element c of a row `x` (head_dim elements of dtype) at position pos, in double;
  // `scale` gets the size of its terms (the rounding error is relative to them, not to the sum).
  double scale = 1;
  auto rotated = [&](const void* x, int64_t base, int64_t c, int64_t pos) -> double {
    const double v = fs::load_float(x, base + c, dtype);
    scale = 1 + std::abs(v);
    if (c >= rd) return v;
    const bool interleaved = p.rotary_interleaved;
    const int64_t half = rd / 2;
    const int64_t col = interleaved ? c / 2 : c % half;
    const int64_t partner = interleaved ? (c ^ 1) : (c < half ? c + half : c - half);
    const bool first = interleaved ? c % 2 == 0 : c < half;
    const double cs = fs::load_float(cos.bytes.data(), pos * rot_cols + col, rot_dtype);
    const double sn = fs::load_float(sin.bytes.data(), pos * rot_cols + col, rot_dtype);
    const double w = fs::load_float(x, base + partner, dtype);
    scale = 1 + std::abs(v * cs) + std::abs(w * sn);
    return first ? v * cs - w * sn : v * cs + w * sn;
  };
  const double tol = dtype == fs::DType::kFloat32   ? 1e-5
                     : dtype == fs::DType::kFloat16 ? 2e-3
                                                    : 1.6e-2;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n_new; ++i) ++writes[static_cast<size_t>(slot_of(b, len_of(b) + i))];
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < n_new; ++i) {
      const int64_t pos = len_of(b) + i, slot = slot_of(b, pos);
      if (writes[static_cast<size_t>(slot)] != 1)
        fail("two new tokens on one cache slot were accepted", static_cast<double>(slot));
      for (int64_t h = 0; h < h_kv; ++h) {
        for (int64_t c = 0; c < d; ++c) {
          const double want = rotated(kn.bytes.data(), ((b * s_new + i) * h_kv + h) * d, c, pos);
          const double got = fs::load_float(kbuf, k_at(slot, h, c), dtype);
          if (std::abs(got - want) > tol * scale) fail("new k differs", got, want);
        }
        for (int64_t c = 0; c < dv; ++c)
          if (fs::load_float(vbuf, v_at(slot, h, c), dtype) !=
              fs::load_float(vn.bytes.data(), ((b * s_new + i) * h_kv + h) * dv + c, dtype))
            fail("new v differs");
      }
    }
    if (with_out && ints(out)[b] != len_of(b) + n_new) fail("seqlens_out", ints(out)[b], len_of(b));
    if (with_q)
      for (int64_t t = 0; t < s_q; ++t) {
        const int64_t pos = len_of(b) + (p.q_positions_per_token ? t : 0);
        for (int64_t e = 0; e < h_q * d; ++e) {
          const int64_t base = ((b * s_q + t) * h_q + e / d) * d;
          const double want = rotated(q.bytes.data(), base, e % d, pos);
          const double got = fs::load_float(q_out.bytes.data(), base + e % d, dtype);
          if (std::abs(got - want) > tol * scale) fail("q_out differs", got, want);
        }
      }
  }
  const size_t esz = fs::dtype_size(dtype);
  for (size_t slot = 0; slot < writes.size(); ++slot) {
    if (writes[slot]) continue;
    const auto e = static_cast<int64_t>(slot);
    for (int64_t h = 0; h < h_kv; ++h) {
      for (int64_t c = 0; c < d; ++c)
        if (std::memcmp(kbuf + k_at(e, h, c) * esz, &k_before[k_at(e, h, c) * esz], esz) != 0)
          fail("a k slot not appended changed");
      for (int64_t c = 0; c < dv; ++c)
        if (std::memcmp(vbuf + v_at(e, h, c) * esz, &v_before[v_at(e, h, c) * esz], esz) != 0)
          fail("a v slot not appended changed");
    }
  }
  return 0;
}
