// The CPU path of kv_cache_append (flashserve/kv_cache.h) on float8_e4m3fn caches: the new k and
// v are e4m3 codes and are copied as they are (no conversion: NaN codes with either sign, -0 and
// the subnormals come through byte for byte), at the positions cache_seqlens[b] + i, into
// contiguous, cache_batch_idx and paged caches (pages in random order), and into K and V caches
// that are interleaved views of one tensor. Every other byte of the caches must be unchanged.
// What an e4m3 cache cannot take is refused by name: new tokens or a v_cache of another dtype,
// rotary, a q beside it; the usual bounds checks still hold. (The float caches' append is checked
// in python/tests/test_kvcache_cpu.py against NumPy, and the CUDA kernel against this path in
// tests/gpu/kv_cache_append_gpu_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashserve/kv_cache.h"
#include "support/attention_case.h"  // seed_for

namespace flashserve::testing {
namespace {

constexpr DType kE4m3 = DType::kFloat8E4M3;

std::vector<uint8_t> random_codes(std::mt19937_64& rng, int64_t n) {
  std::uniform_int_distribution<int> byte(0, 255);  // every code, the NaNs 0x7f and 0xff too
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (auto& c : v) c = static_cast<uint8_t>(byte(rng));
  return v;
}

struct E4m3Case {
  std::string layout;  // "contiguous", "batch_idx", "paged16", "paged5"
  int64_t batch = 3, s_new = 4, h_kv = 2, d = 64, dv = 64, capacity = 37;
  bool scalar_len = false;
};

// Runs the append on random caches and checks every byte: the new codes at their slots, the rest
// of both caches unchanged, and seqlens_out.
void check_copy(const E4m3Case& c) {
  std::mt19937_64 rng(seed_for("E4m3Append_" + c.layout + std::to_string(c.s_new)));
  const bool paged = c.layout.rfind("paged", 0) == 0, idx_map = c.layout == "batch_idx";
  const int64_t page = paged ? std::stoi(c.layout.substr(5)) : 0;
  const int64_t per_seq = paged ? (c.capacity + page - 1) / page : 1;
  const int64_t rows = paged ? c.batch * per_seq + 3 : c.batch + (idx_map ? 2 : 0);
  const int64_t rpe = paged ? page : c.capacity;
  const int64_t cap = paged ? per_seq * page : c.capacity;
  std::vector<uint8_t> kc = random_codes(rng, rows * rpe * c.h_kv * c.d);
  std::vector<uint8_t> vc = random_codes(rng, rows * rpe * c.h_kv * c.dv);
  std::vector<uint8_t> kn = random_codes(rng, c.batch * c.s_new * c.h_kv * c.d);
  std::vector<uint8_t> vn = random_codes(rng, c.batch * c.s_new * c.h_kv * c.dv);
  const std::vector<uint8_t> k_before = kc, v_before = vc;

  std::vector<int32_t> lens(static_cast<size_t>(c.batch));
  std::uniform_int_distribution<int64_t> len_of(0, cap - c.s_new);
  for (auto& l : lens) l = static_cast<int32_t>(len_of(rng));
  lens[0] = static_cast<int32_t>(cap - c.s_new);  // one sequence fills its last slot
  if (c.scalar_len) std::fill(lens.begin(), lens.end(), lens[1 % lens.size()]);
  std::vector<int32_t> entries(static_cast<size_t>(rows));
  std::iota(entries.begin(), entries.end(), 0);
  std::shuffle(entries.begin(), entries.end(), rng);
  std::vector<int32_t> seqlens_out(static_cast<size_t>(c.batch), -7);

  KvCacheAppendParams p;
  p.k_cache = make_view(kc.data(), kE4m3, {rows, rpe, c.h_kv, c.d});
  p.v_cache = make_view(vc.data(), kE4m3, {rows, rpe, c.h_kv, c.dv});
  p.k_new = make_view(kn.data(), kE4m3, {c.batch, c.s_new, c.h_kv, c.d});
  p.v_new = make_view(vn.data(), kE4m3, {c.batch, c.s_new, c.h_kv, c.dv});
  if (c.scalar_len)
    p.cache_seqlen = lens[0];
  else
    p.cache_seqlens = make_view(lens.data(), DType::kInt32, {c.batch});
  if (idx_map) p.cache_batch_idx = make_view(entries.data(), DType::kInt32, {c.batch});
  if (paged) p.block_table = make_view(entries.data(), DType::kInt32, {c.batch, per_seq});
  p.seqlens_out = make_view(seqlens_out.data(), DType::kInt32, {c.batch});
  kv_cache_append(p);

  // The expected caches: the old bytes, with each new token's codes at its slot.
  std::vector<uint8_t> k_want = k_before, v_want = v_before;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t i = 0; i < c.s_new; ++i) {
      const int64_t pos = lens[b] + i;
      const int64_t entry = paged ? entries[b * per_seq + pos / page] : idx_map ? entries[b] : b;
      const int64_t row = paged ? pos % page : pos;
      const int64_t slot = entry * rpe + row;
      std::copy_n(kn.begin() + (b * c.s_new + i) * c.h_kv * c.d, c.h_kv * c.d,
                  k_want.begin() + slot * c.h_kv * c.d);
      std::copy_n(vn.begin() + (b * c.s_new + i) * c.h_kv * c.dv, c.h_kv * c.dv,
                  v_want.begin() + slot * c.h_kv * c.dv);
    }
    EXPECT_EQ(seqlens_out[b], lens[b] + c.s_new) << "sequence " << b;
  }
  EXPECT_TRUE(kc == k_want) << c.layout << ": k_cache differs from the codes copied in place";
  EXPECT_TRUE(vc == v_want) << c.layout << ": v_cache differs from the codes copied in place";
  if (c.s_new > 0) {
    EXPECT_NE(kc, k_before) << "the case appends nothing";
  }
}

TEST(KvAppendE4m3, CopiesTheCodesAtTheirSlots) {
  for (const char* layout : {"contiguous", "batch_idx", "paged16", "paged5"}) {
    check_copy({layout});
    E4m3Case decode{layout};
    decode.s_new = 1, decode.h_kv = 1, decode.d = decode.dv = 128;
    check_copy(decode);
    E4m3Case scalar{layout};
    scalar.scalar_len = true, scalar.dv = 32;  // one length for all; v's head dim differs
    check_copy(scalar);
    E4m3Case none{layout};
    none.s_new = 0;  // no new tokens: nothing changes, seqlens_out = cache_seqlens
    check_copy(none);
  }
}

// K and V caches as the two halves of one tensor (kv[:, :, 0], kv[:, :, 1]): strided views whose
// elements are disjoint. The append writes each token's codes into its half only.
TEST(KvAppendE4m3, InterleavedViewsOfOneTensor) {
  std::mt19937_64 rng(seed_for("KvAppendE4m3.InterleavedViewsOfOneTensor"));
  const int64_t batch = 2, cap = 11, h_kv = 2, d = 32, s_new = 3;
  std::vector<uint8_t> kv = random_codes(rng, batch * cap * 2 * h_kv * d);
  const std::vector<uint8_t> before = kv;
  std::vector<uint8_t> kn = random_codes(rng, batch * s_new * h_kv * d);
  std::vector<uint8_t> vn = random_codes(rng, batch * s_new * h_kv * d);
  std::vector<int32_t> lens = {5, 8};
  KvCacheAppendParams p;
  p.k_cache = make_view(kv.data(), kE4m3, {batch, cap, 2 * h_kv, d});
  p.k_cache.shape[2] = h_kv;
  p.v_cache = p.k_cache;
  p.v_cache.data = kv.data() + h_kv * d;
  p.k_new = make_view(kn.data(), kE4m3, {batch, s_new, h_kv, d});
  p.v_new = make_view(vn.data(), kE4m3, {batch, s_new, h_kv, d});
  p.cache_seqlens = make_view(lens.data(), DType::kInt32, {batch});
  kv_cache_append(p);
  std::vector<uint8_t> want = before;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < s_new; ++i) {
      const int64_t slot = (b * cap + lens[b] + i) * 2 * h_kv * d;
      const int64_t src = (b * s_new + i) * h_kv * d;
      std::copy_n(kn.begin() + src, h_kv * d, want.begin() + slot);
      std::copy_n(vn.begin() + src, h_kv * d, want.begin() + slot + h_kv * d);
    }
  EXPECT_TRUE(kv == want);
}

// A small valid call on e4m3 caches, for the refusals to change one thing of.
struct Small {
  std::vector<uint8_t> kc = std::vector<uint8_t>(2 * 8 * 2 * 16, 0x38);
  std::vector<uint8_t> vc = kc;
  std::vector<uint8_t> kn = std::vector<uint8_t>(2 * 2 * 2 * 16, 0x40);
  std::vector<uint8_t> vn = kn;
  std::vector<uint16_t> wide = std::vector<uint16_t>(2 * 8 * 2 * 16, 0x3f80);  // bf16 1.0
  std::vector<float> table = std::vector<float>(16 * 8, 0.5f);
  std::vector<int32_t> lens = {1, 3};
  KvCacheAppendParams p;
  Small() {
    p.k_cache = make_view(kc.data(), kE4m3, {2, 8, 2, 16});
    p.v_cache = make_view(vc.data(), kE4m3, {2, 8, 2, 16});
    p.k_new = make_view(kn.data(), kE4m3, {2, 2, 2, 16});
    p.v_new = make_view(vn.data(), kE4m3, {2, 2, 2, 16});
    p.cache_seqlens = make_view(lens.data(), DType::kInt32, {2});
  }
};

void expect_refused(const KvCacheAppendParams& p, const std::string& arg, ErrorKind kind,
                    const std::string& says) {
  try {
    kv_cache_append(p);
    ADD_FAILURE() << "accepted; expected a refusal naming " << arg;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), arg) << e.what();
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(KvAppendE4m3, RefusedByName) {
  {
    Small s;
    kv_cache_append(s.p);  // the base call is valid
  }
  {
    Small s;  // new tokens of another dtype: the append copies codes, it does not quantise
    s.p.k_new = make_view(s.wide.data(), DType::kBFloat16, {2, 2, 2, 16});
    const auto before = s.kc;
    expect_refused(s.p, "k", ErrorKind::kInvalidArgument, "must be e4m3 codes already");
    EXPECT_EQ(s.kc, before) << "the refused call wrote the cache";
  }
  {
    Small s;
    s.p.v_new = make_view(s.wide.data(), DType::kBFloat16, {2, 2, 2, 16});
    expect_refused(s.p, "v", ErrorKind::kInvalidArgument, "differs from k_cache's float8_e4m3fn");
  }
  {
    Small s;  // a bf16 v_cache beside an e4m3 k_cache
    s.p.v_cache = make_view(s.wide.data(), DType::kBFloat16, {2, 8, 2, 16});
    expect_refused(s.p, "v_cache", ErrorKind::kInvalidArgument, "differs from k_cache's");
  }
  {
    Small s;  // rotary: the codes would need a dequantise / requantise
    s.p.rotary_cos = make_view(s.table.data(), DType::kFloat32, {16, 4});
    s.p.rotary_sin = s.p.rotary_cos;
    expect_refused(s.p, "rotary_cos", ErrorKind::kUnsupported, "float8_e4m3fn cache");
  }
  {
    Small s;  // an e4m3 table does not make it meaningful either
    std::vector<uint8_t> cos(16 * 4, 0x38), sin(16 * 4, 0x30);
    s.p.rotary_cos = make_view(cos.data(), kE4m3, {16, 4});
    s.p.rotary_sin = make_view(sin.data(), kE4m3, {16, 4});
    expect_refused(s.p, "rotary_cos", ErrorKind::kUnsupported, "float8_e4m3fn cache");
  }
  {
    Small s;  // a bf16 q beside an e4m3 cache (q is only rotated by the append)
    std::vector<uint16_t> q(2 * 1 * 4 * 16, 0x3f80), q_out(q.size());
    s.p.q = make_view(q.data(), DType::kBFloat16, {2, 1, 4, 16});
    s.p.q_out = make_view(q_out.data(), DType::kBFloat16, {2, 1, 4, 16});
    expect_refused(s.p, "q", ErrorKind::kInvalidArgument, "differs from k_cache's");
  }
  {
    Small s;  // the bounds checks hold: 7 + 2 > 8
    s.lens[1] = 7;
    const auto before = s.kc;
    expect_refused(s.p, "cache_seqlens", ErrorKind::kInvalidArgument, "sequence 1 holds 7 keys");
    EXPECT_EQ(s.kc, before) << "the refused call wrote the cache";
  }
  {
    Small s;  // a paged e4m3 cache with a page outside the pool
    std::vector<int32_t> table = {0, 1, 2, 9};
    s.p.k_cache = make_view(s.kc.data(), kE4m3, {4, 4, 2, 16});
    s.p.v_cache = make_view(s.vc.data(), kE4m3, {4, 4, 2, 16});
    s.p.block_table = make_view(table.data(), DType::kInt32, {2, 2});  // sequence 1 writes 3, 4
    expect_refused(s.p, "block_table", ErrorKind::kInvalidArgument, "outside the pool of 4 pages");
  }
  {
    Small s;  // the other 8-bit codes are not a cache dtype
    s.p.k_cache = make_view(s.kc.data(), DType::kInt32, {2, 8, 2, 4});
    s.p.v_cache = make_view(s.vc.data(), DType::kInt32, {2, 8, 2, 4});
    expect_refused(s.p, "k_cache", ErrorKind::kInvalidArgument, "float8_e4m3fn");
  }
}

}  // namespace
}  // namespace flashserve::testing
