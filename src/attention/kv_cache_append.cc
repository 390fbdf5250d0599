// Validation of a KV-cache append (every malformed call becomes an Error naming the argument,
// before any memory is touched), its CPU implementation, and the choice of device.
#include "kv_cache_append.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends.h"
#include "common/checked_math.h"
#include "common/half.h"
#include "common/str_cat.h"
#include "problem.h"

namespace flashserve {
namespace attention {
namespace {

[[noreturn]] void fail(const std::string& arg, const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, arg, what);
}

bool is_float(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

constexpr DType kE4m3 = DType::kFloat8E4M3;

void check_index(const TensorView& t, const char* name, int rank, const Device& dev) {
  check_view(t, name, rank);
  if (t.dtype != DType::kInt32) fail(name, str_cat("expected int32, got ", dtype_name(t.dtype)));
  if (!(t.device == dev)) fail(name, "must be on the same device as k_cache");
}

void check_same(const TensorView& t, const char* name, const KvAppendProblem& pr) {
  if (t.dtype != pr.dtype)
    fail(name,
         str_cat("dtype ", dtype_name(t.dtype), " differs from k_cache's ", dtype_name(pr.dtype),
                 pr.dtype == kE4m3 ? " (what is written into a float8_e4m3fn cache must be "
                                     "e4m3 codes already, quantised with the scale its "
                                     "descales undo: the append copies codes, it does not "
                                     "quantise)"
                                   : ""));
  if (!(t.device == pr.device)) fail(name, "must be on the same device as k_cache");
}

void check_batch(const TensorView& t, const char* name, int64_t batch) {
  if (t.shape[0] != batch)
    fail(name, str_cat("has ", t.shape[0], " entries in dimension 0 for a batch of ", batch));
}

// The checks of one sequence's length: it fits with the new tokens, and its rotary positions are
// in the table.
void check_length(const KvCacheAppendParams& p, const KvAppendProblem& pr, int64_t b, int64_t len) {
  const char* lengths = "cache_seqlens";
  if (len < 0) fail(lengths, str_cat("entry ", b, " is negative (", len, ")"));
  if (len + pr.s_new > pr.capacity)
    fail(lengths,
         str_cat("sequence ", b, " holds ", len, " keys; appending ", pr.s_new, " new ones needs ",
                 len + pr.s_new, " slots, but the cache holds ", pr.capacity, " per sequence"));
  if (len + pr.s_new > std::numeric_limits<int32_t>::max())
    fail(lengths, str_cat("sequence ", b, " would hold ", len + pr.s_new,
                          " keys, more than int32 lengths can count"));
  if (pr.rotary_dim > 0) {
    // The last position rotated: the last new key, and q's last token (or its only position).
    int64_t last = pr.s_new > 0 ? len + pr.s_new - 1 : -1;
    if (pr.s_q > 0) last = std::max(last, p.q_positions_per_token ? len + pr.s_q - 1 : len);
    if (last >= pr.s_rot)
      fail("rotary_cos", str_cat("has ", pr.s_rot, " positions, but sequence ", b,
                                 " rotates position ", last, " (cache_seqlens ", len, ")"));
  }
}

// No cache slot is written by two new tokens: on a GPU the two writes race and either may land;
// on the CPU the later one silently replaces the earlier. A contiguous cache row is one sequence's
// whole history, so with new tokens two sequences may not map to one row at all (one would append
// into the other's keys). Pages, though, are shared on purpose (prefix caching, forked beams), so
// a paged cache is refused only when two appended tokens land on the same (page, row) slot: the
// written rows of each table entry, sorted by page, must not intersect. O(batch x pages written).
// Call after the per-entry range checks (entries are known to be inside their pools).
void check_distinct_slots(const KvCacheAppendParams& p, const KvAppendProblem& pr) {
  if (pr.s_new == 0) return;
  auto length = [&](int64_t b) {
    return p.cache_seqlens.defined()
               ? int64_t{p.cache_seqlens.ptr<const int32_t>()[b * p.cache_seqlens.stride[0]]}
               : p.cache_seqlen;
  };
  if (!pr.paged) {
    if (!p.cache_batch_idx.defined()) return;                 // sequence b is row b
    std::vector<std::pair<int32_t, int64_t>> rows(pr.batch);  // (cache row, sequence)
    for (int64_t b = 0; b < pr.batch; ++b)
      rows[b] = {p.cache_batch_idx.ptr<const int32_t>()[b * p.cache_batch_idx.stride[0]], b};
    std::sort(rows.begin(), rows.end());
    for (size_t i = 1; i < rows.size(); ++i)
      if (rows[i].first == rows[i - 1].first)
        fail("cache_batch_idx",
             str_cat("entries ", rows[i - 1].second, " and ", rows[i].second, " are both row ",
                     rows[i].first,
                     ": two sequences would append to one cache row (with k and v "
                     "given, each sequence needs its own row)"));
    return;
  }
  struct Written {
    int32_t page;
    int64_t r0, r1;                           // rows [r0, r1) of the page
    int64_t b, i;                             // block_table[b][i]
    bool operator<(const Written& o) const {  // total, so the error names a fixed pair
      return std::tie(page, r0, b, i) < std::tie(o.page, o.r0, o.b, o.i);
    }
  };
  std::vector<Written> slots;
  const int64_t ps = pr.rows_per_entry;
  for (int64_t b = 0; b < pr.batch; ++b) {
    const int64_t len = length(b);
    const int32_t* row = p.block_table.ptr<const int32_t>() + b * p.block_table.stride[0];
    for (int64_t i = len / ps; i <= (len + pr.s_new - 1) / ps; ++i)
      slots.push_back({row[i * p.block_table.stride[1]], std::max(len, i * ps) - i * ps,
                       std::min(len + pr.s_new, (i + 1) * ps) - i * ps, b, i});
  }
  std::sort(slots.begin(), slots.end());
  size_t last = 0;  // of the written ranges so far on this page, the one reaching furthest
  for (size_t k = 1; k < slots.size(); ++k) {
    const Written &w = slots[k], &prev = slots[last];
    if (w.page == prev.page && w.r0 < prev.r1)
      fail("block_table", str_cat("entries [", prev.b, ", ", prev.i, "] and [", w.b, ", ", w.i,
                                  "] are both page ", w.page, ", and both append to its row ", w.r0,
                                  ": two new tokens would be written to one cache slot"));
    if (w.page != prev.page || w.r1 > prev.r1) last = k;
  }
}

}  // namespace

KvAppendProblem describe(const KvCacheAppendParams& p) {
  KvAppendProblem pr;
  check_view(p.k_cache, "k_cache", 4);
  check_view(p.v_cache, "v_cache", 4);
  pr.dtype = p.k_cache.dtype;
  pr.device = p.k_cache.device;
  if (!is_float(pr.dtype) && pr.dtype != kE4m3)
    fail("k_cache", str_cat("dtype ", dtype_name(pr.dtype),
                            " is not supported (float32, float16, bfloat16, float8_e4m3fn)"));
  check_same(p.v_cache, "v_cache", pr);
  for (int i = 0; i < 3; ++i)
    if (p.v_cache.shape[i] != p.k_cache.shape[i])
      fail("v_cache", str_cat("shape ", shape_string(p.v_cache), " does not match k_cache's ",
                              shape_string(p.k_cache), " (except the head dim)"));
  pr.h_kv = p.k_cache.shape[2];
  pr.head_dim = p.k_cache.shape[3];
  pr.head_dim_v = p.v_cache.shape[3];
  if (pr.h_kv <= 0) fail("k_cache", "number of heads must be positive");
  pr.paged = p.block_table.defined();
  pr.cache_rows = p.k_cache.shape[0];
  pr.rows_per_entry = p.k_cache.shape[1];

  // The batch: from the first per-sequence tensor given; every other one must agree.
  const std::pair<const TensorView*, const char*> per_sequence[] = {
      {&p.q, "q"},
      {&p.k_new, "k"},
      {&p.cache_seqlens, "cache_seqlens"},
      {&p.block_table, "block_table"},
      {&p.cache_batch_idx, "cache_batch_idx"},
      {&p.seqlens_out, "seqlens_out"}};
  pr.batch = -1;
  for (const auto& [t, name] : per_sequence)
    if (t->defined() && t->rank > 0) {
      pr.batch = t->shape[0];
      break;
    }
  if (pr.batch < 0) pr.batch = pr.paged ? 0 : pr.cache_rows;

  if (pr.paged) {
    if (p.cache_batch_idx.defined())
      fail("cache_batch_idx", "cannot be combined with block_table (a paged cache)");
    check_index(p.block_table, "block_table", 2, pr.device);
    check_batch(p.block_table, "block_table", pr.batch);
    pr.pages_per_seq = p.block_table.shape[1];
    if (pr.rows_per_entry <= 0)
      fail("k_cache", "page size (dimension 1 of the paged cache) must be positive");
    pr.capacity = saturating_mul(pr.pages_per_seq, pr.rows_per_entry);
  } else {
    pr.capacity = pr.rows_per_entry;
    if (p.cache_batch_idx.defined()) {
      check_index(p.cache_batch_idx, "cache_batch_idx", 1, pr.device);
      check_batch(p.cache_batch_idx, "cache_batch_idx", pr.batch);
    } else if (pr.cache_rows != pr.batch) {
      fail("k_cache", str_cat("batch ", pr.cache_rows, " differs from the batch of ", pr.batch,
                              " (pass cache_batch_idx to map sequences to cache rows)"));
    }
  }
  if (p.cache_seqlens.defined()) {
    check_index(p.cache_seqlens, "cache_seqlens", 1, pr.device);
    check_batch(p.cache_seqlens, "cache_seqlens", pr.batch);
  } else if (p.cache_seqlen < 0 || p.cache_seqlen > pr.capacity) {
    fail("cache_seqlens",
         str_cat(p.cache_seqlen, " is outside [0, ", pr.capacity, "], the capacity of the cache"));
  }

  if (p.k_new.defined() != p.v_new.defined())
    fail(p.k_new.defined() ? "v" : "k", "k and v must be given together (or neither)");
  if (p.k_new.defined()) {
    check_view(p.k_new, "k", 4);
    check_view(p.v_new, "v", 4);
    check_same(p.k_new, "k", pr);
    check_same(p.v_new, "v", pr);
    check_batch(p.k_new, "k", pr.batch);
    pr.s_new = p.k_new.shape[1];
    const int64_t want_k[] = {pr.batch, pr.s_new, pr.h_kv, pr.head_dim};
    const int64_t want_v[] = {pr.batch, pr.s_new, pr.h_kv, pr.head_dim_v};
    for (int i = 0; i < 4; ++i) {
      if (p.k_new.shape[i] != want_k[i])
        fail("k", str_cat("shape ", shape_string(p.k_new), " does not match [batch ", pr.batch,
                          ", s_new, h_kv ", pr.h_kv, ", head_dim ", pr.head_dim, "] of the cache"));
      if (p.v_new.shape[i] != want_v[i])
        fail("v", str_cat("shape ", shape_string(p.v_new), " does not match k's ",
                          shape_string(p.k_new), " (head dim ", pr.head_dim_v, " of v_cache)"));
    }
  }

  if (p.rotary_cos.defined() != p.rotary_sin.defined())
    fail(p.rotary_cos.defined() ? "rotary_sin" : "rotary_cos",
         "rotary_cos and rotary_sin must be given together (or neither)");
  if (p.rotary_cos.defined() && pr.dtype == kE4m3)
    throw Error(ErrorKind::kUnsupported, "rotary_cos",
                "rotary embedding into a float8_e4m3fn cache is not supported: the new k are "
                "e4m3 codes, and rotating them would need a dequantise and a requantise with a "
                "scale the append does not have (rotate k before quantising it, and pass q "
                "rotated)");
  if (p.rotary_cos.defined()) {
    check_view(p.rotary_cos, "rotary_cos", 2);
    check_view(p.rotary_sin, "rotary_sin", 2);
    for (const auto& [t, name] :
         {std::pair{&p.rotary_cos, "rotary_cos"}, std::pair{&p.rotary_sin, "rotary_sin"}}) {
      if (t->dtype != DType::kFloat32 && t->dtype != pr.dtype)
        fail(name, str_cat("dtype ", dtype_name(t->dtype), " must be float32 or the cache's ",
                           dtype_name(pr.dtype)));
      if (!(t->device == pr.device)) fail(name, "must be on the same device as k_cache");
    }
    if (p.rotary_sin.shape[0] != p.rotary_cos.shape[0] ||
        p.rotary_sin.shape[1] != p.rotary_cos.shape[1])
      fail("rotary_sin", str_cat("shape ", shape_string(p.rotary_sin),
                                 " differs from rotary_cos's ", shape_string(p.rotary_cos)));
    pr.s_rot = p.rotary_cos.shape[0];
    pr.rotary_dim = 2 * p.rotary_cos.shape[1];
    if (pr.rotary_dim <= 0 || pr.rotary_dim > pr.head_dim)
      fail("rotary_cos", str_cat("rotary_dim (2 x ", p.rotary_cos.shape[1],
                                 " columns) must be in [2, head_dim ", pr.head_dim, "]"));
  }

  if (p.q.defined() != p.q_out.defined())
    fail(p.q.defined() ? "q_out" : "q", "q and q_out must be given together (or neither)");
  if (p.q.defined()) {
    check_view(p.q, "q", 4);
    check_view(p.q_out, "q_out", 4);
    check_same(p.q, "q", pr);
    check_same(p.q_out, "q_out", pr);
    check_batch(p.q, "q", pr.batch);
    if (p.q.shape[3] != pr.head_dim)
      fail("q", str_cat("head_dim ", p.q.shape[3], " differs from k_cache's ", pr.head_dim));
    for (int i = 0; i < 4; ++i)
      if (p.q_out.shape[i] != p.q.shape[i])
        fail("q_out",
             str_cat("shape ", shape_string(p.q_out), " differs from q's ", shape_string(p.q)));
    pr.s_q = p.q.shape[1];
    pr.h_q = p.q.shape[2];
  }
  if (p.seqlens_out.defined()) {
    check_index(p.seqlens_out, "seqlens_out", 1, pr.device);
    check_batch(p.seqlens_out, "seqlens_out", pr.batch);
  }

  // Outputs (the two caches, q_out, seqlens_out) share memory with no other argument, nor with
  // themselves: two tokens written to one address, or an input clobbered while it is read.
  const std::pair<const TensorView*, const char*> all[] = {{&p.k_cache, "k_cache"},
                                                           {&p.v_cache, "v_cache"},
                                                           {&p.q_out, "q_out"},
                                                           {&p.seqlens_out, "seqlens_out"},
                                                           {&p.k_new, "k"},
                                                           {&p.v_new, "v"},
                                                           {&p.q, "q"},
                                                           {&p.cache_seqlens, "cache_seqlens"},
                                                           {&p.cache_batch_idx, "cache_batch_idx"},
                                                           {&p.block_table, "block_table"},
                                                           {&p.rotary_cos, "rotary_cos"},
                                                           {&p.rotary_sin, "rotary_sin"}};
  constexpr int kOutputs = 4;
  for (int o = 0; o < kOutputs; ++o) {
    const auto& [out, out_name] = all[o];
    if (!out->defined()) continue;
    for (int i = o + 1; i < static_cast<int>(std::size(all)); ++i)
      if (all[i].first->defined() && overlaps(*out, *all[i].first))
        fail(all[i].second, str_cat("overlaps ", out_name, " in memory"));
  }
  // A cache's own aliasing: only rows that are written matter, but a self-overlapping cache is a
  // malformed one whatever the lengths.
  if (p.k_new.defined()) {
    if (aliases_itself(p.k_cache)) fail("k_cache", "strides make distinct elements share memory");
    if (aliases_itself(p.v_cache)) fail("v_cache", "strides make distinct elements share memory");
  }
  if (p.q_out.defined() && aliases_itself(p.q_out))
    fail("q_out", "strides make distinct elements share memory");

  if (pr.device.type == DeviceType::kCPU) {
    check_host_indices(p, pr);
  } else if (!p.cache_seqlens.defined() && pr.batch > 0) {
    check_length(p, pr, 0, p.cache_seqlen);  // one length, known on the host: checked anywhere
  }
  return pr;
}

void check_host_indices(const KvCacheAppendParams& p, const KvAppendProblem& pr) {
  const int32_t* seqlens =
      p.cache_seqlens.defined() ? p.cache_seqlens.ptr<const int32_t>() : nullptr;
  const int64_t seqlens_stride = p.cache_seqlens.defined() ? p.cache_seqlens.stride[0] : 0;
  for (int64_t b = 0; b < pr.batch; ++b) {
    const int64_t len = seqlens ? int64_t{seqlens[b * seqlens_stride]} : p.cache_seqlen;
    check_length(p, pr, b, len);
    if (!pr.paged && p.cache_batch_idx.defined()) {
      const int32_t row = p.cache_batch_idx.ptr<const int32_t>()[b * p.cache_batch_idx.stride[0]];
      if (row < 0 || row >= pr.cache_rows)
        fail("cache_batch_idx", str_cat("entry ", b, " is ", row, ", outside the ", pr.cache_rows,
                                        " rows of k_cache"));
    }
    if (pr.paged && pr.s_new > 0) {
      const int32_t* row = p.block_table.ptr<const int32_t>() + b * p.block_table.stride[0];
      for (int64_t i = len / pr.rows_per_entry; i <= (len + pr.s_new - 1) / pr.rows_per_entry; ++i)
        if (row[i * p.block_table.stride[1]] < 0 ||
            row[i * p.block_table.stride[1]] >= pr.cache_rows)
          fail("block_table",
               str_cat("entry [", b, ", ", i, "] is ", row[i * p.block_table.stride[1]],
                       ", outside the pool of ", pr.cache_rows, " pages"));
    }
  }
  check_distinct_slots(p, pr);
}

namespace {

// Writes row x (head_dim elements at src, of dtype) rotated at `pos` (no rotation: pos < 0) into
// dst, both in elements of their tensors.
void rotate_row(const KvCacheAppendParams& p, const KvAppendProblem& pr, const void* src,
                int64_t src_off, void* dst, int64_t dst_off, int64_t n, int64_t pos) {
  if (pr.dtype == kE4m3) {  // codes copied as they are (rotary is refused for e4m3 caches)
    std::memcpy(static_cast<uint8_t*>(dst) + dst_off, static_cast<const uint8_t*>(src) + src_off,
                static_cast<size_t>(n));
    return;
  }
  const int64_t rd = pos >= 0 ? pr.rotary_dim : 0;
  for (int64_t c = 0; c < n; ++c) {
    const float x = load_float(src, src_off + c, pr.dtype);
    float y = x;
    if (c < rd) {
      const RotaryTerm t = rotary_term(c, rd, p.rotary_interleaved);
      const float cs = load_float(p.rotary_cos.data, pos * p.rotary_cos.stride[0] + t.column,
                                  p.rotary_cos.dtype);
      const float sn = load_float(p.rotary_sin.data, pos * p.rotary_sin.stride[0] + t.column,
                                  p.rotary_sin.dtype);
      y = x * cs + t.sign * load_float(src, src_off + t.partner, pr.dtype) * sn;
    }
    store_float(dst, dst_off + c, pr.dtype, y);
  }
}

int64_t offset(const TensorView& t, int64_t i0, int64_t i1, int64_t i2) {
  return i0 * t.stride[0] + i1 * t.stride[1] + i2 * t.stride[2];
}

void cpu_kv_cache_append(const KvCacheAppendParams& p, const KvAppendProblem& pr) {
  const bool rotary = pr.rotary_dim > 0;
  for (int64_t b = 0; b < pr.batch; ++b) {
    const int64_t len =
        p.cache_seqlens.defined()
            ? int64_t{p.cache_seqlens.ptr<const int32_t>()[b * p.cache_seqlens.stride[0]]}
            : p.cache_seqlen;
    for (int64_t i = 0; i < pr.s_new; ++i) {
      const int64_t pos = len + i;
      int64_t entry, row;
      if (pr.paged) {
        entry =
            p.block_table.ptr<const int32_t>()[b * p.block_table.stride[0] +
                                               pos / pr.rows_per_entry * p.block_table.stride[1]];
        row = pos % pr.rows_per_entry;
      } else {
        entry = p.cache_batch_idx.defined()
                    ? p.cache_batch_idx.ptr<const int32_t>()[b * p.cache_batch_idx.stride[0]]
                    : b;
        row = pos;
      }
      for (int64_t h = 0; h < pr.h_kv; ++h) {
        rotate_row(p, pr, p.k_new.data, offset(p.k_new, b, i, h), p.k_cache.data,
                   offset(p.k_cache, entry, row, h), pr.head_dim, rotary ? pos : -1);
        rotate_row(p, pr, p.v_new.data, offset(p.v_new, b, i, h), p.v_cache.data,
                   offset(p.v_cache, entry, row, h), pr.head_dim_v, -1);
      }
    }
    for (int64_t t = 0; t < pr.s_q; ++t)
      for (int64_t h = 0; h < pr.h_q; ++h)
        rotate_row(p, pr, p.q.data, offset(p.q, b, t, h), p.q_out.data, offset(p.q_out, b, t, h),
                   pr.head_dim, rotary ? len + (p.q_positions_per_token ? t : 0) : -1);
    if (p.seqlens_out.defined())
      p.seqlens_out.ptr<int32_t>()[b * p.seqlens_out.stride[0]] =
          static_cast<int32_t>(len + pr.s_new);
  }
}

}  // namespace
}  // namespace attention

void validate(const KvCacheAppendParams& params) {
  attention::describe(params);
}

void kv_cache_append(const KvCacheAppendParams& params) {
  const attention::KvAppendProblem problem = attention::describe(params);
  if (problem.device.type == DeviceType::kCPU)
    return attention::cpu_kv_cache_append(params, problem);
#if defined(FLASHSERVE_WITH_CUDA)
  return attention::cuda_kv_cache_append(params, problem);
#else
  attention::refuse_without_cuda("k_cache");
#endif
}

}  // namespace flashserve
