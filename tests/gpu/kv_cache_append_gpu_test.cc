// The KV-cache append kernel (src/attention/cuda/kv_cache_append.cu) against the CPU path of the
// same call (itself checked against an independent NumPy reference in
// python/tests/test_kvcache_cpu.py): contiguous, cache_batch_idx and paged caches (page 16 and 7),
// rotary in both layouts with float32 and same-dtype tables, q rotated per token or at the length,
// every float dtype, and float8_e4m3fn caches (no rotary: the codes are copied, so bit for bit,
// every byte value included). Every buffer is a cudaMalloc of exactly its tensor's size, so that
// compute-sanitizer's memcheck sees any write past a cache; the caches start random and every slot
// the append does not own must come back bit for bit. Device-resident lengths are trusted: a case
// with lengths that overflow the cache, a page outside the pool and rotary positions past the
// table checks that the kernel drops those tokens (never writes out of bounds), clamps
// seqlens_out, and writes NaN where a rotation has no angle. KvAppendSanitize runs under
// compute-sanitizer (scripts/gpu-check.sh runs *Sanitize*).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/half.h"
#include "flashserve/kv_cache.h"
#include "support/attention_case.h"  // seed_for
#include "support/cuda_skip.h"
#include "support/scoped_env.h"

namespace flashserve::testing {
namespace {

// A host tensor and its exact-size device copy.
struct Pair {
  std::vector<unsigned char> host;
  void* dev = nullptr;
  TensorView h, d;
  Pair() = default;
  Pair(DType dtype, std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    host.resize(static_cast<size_t>(n) * dtype_size(dtype));
    if (!host.empty()) {
      EXPECT_EQ(cudaMalloc(&dev, host.size()), cudaSuccess);
    }
    h = make_view(host.data(), dtype, shape);
    d = make_view(dev, dtype, shape, Device{DeviceType::kCUDA, 0});
  }
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;
  Pair(Pair&& o) noexcept { *this = std::move(o); }
  Pair& operator=(Pair&& o) noexcept {
    host = std::move(o.host);
    dev = o.dev;
    o.dev = nullptr;
    h = o.h;
    d = o.d;
    h.data = host.empty() ? nullptr : host.data();
    return *this;
  }
  ~Pair() { cudaFree(dev); }
  void upload() {
    if (dev) {
      EXPECT_EQ(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> out(host.size());
    if (dev) {
      EXPECT_EQ(cudaMemcpy(out.data(), dev, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return out;
  }
  int32_t* ints() { return reinterpret_cast<int32_t*>(host.data()); }
};

void fill_random(Pair& p, std::mt19937_64& rng) {
  if (p.h.dtype == DType::kFloat8E4M3) {  // every code, the NaNs 0x7f and 0xff too
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& c : p.host) c = static_cast<unsigned char>(byte(rng));
    return;
  }
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < p.h.numel(); ++i) store_float(p.host.data(), i, p.h.dtype, normal(rng));
}

struct Spec {
  std::string layout;  // "contiguous", "batch_idx", "paged16", "paged7"
  DType dtype = DType::kBFloat16;
  bool rotary = true, rot_f32 = true, interleaved = true, per_token = true, scalar_len = false;
  int64_t batch = 3, s_new = 2, s_q = 2, h_kv = 2, h_q = 8, d = 64, rot_cols = 32;
  int64_t capacity = 40;
  bool overflow = false;  // device lengths past the capacity, a page outside the pool, no angles
};

struct Case {
  Spec s;
  Pair kc, vc, kn, vn, lens, idx, table, cos, sin, q, q_out, out;
  KvCacheAppendParams host, dev;
  int64_t rows = 0, rpe = 0;

  explicit Case(const Spec& spec) : s(spec) {
    std::mt19937_64 rng(0x5eed + spec.batch * 131 + spec.d);
    const bool paged = s.layout.rfind("paged", 0) == 0, idx_map = s.layout == "batch_idx";
    const int64_t page = paged ? std::stoi(s.layout.substr(5)) : 0;
    const int64_t per_seq = paged ? (s.capacity + page - 1) / page : 1;
    rows = paged ? s.batch * per_seq + 2 : s.batch + (idx_map ? 2 : 0);
    rpe = paged ? page : s.capacity;
    const int64_t cap = paged ? per_seq * page : s.capacity;
    kc = Pair(s.dtype, {rows, rpe, s.h_kv, s.d});
    vc = Pair(s.dtype, {rows, rpe, s.h_kv, s.d});
    kn = Pair(s.dtype, {s.batch, s.s_new, s.h_kv, s.d});
    vn = Pair(s.dtype, {s.batch, s.s_new, s.h_kv, s.d});
    for (Pair* p : {&kc, &vc, &kn, &vn}) fill_random(*p, rng);
    host.k_cache = kc.h, host.v_cache = vc.h, host.k_new = kn.h, host.v_new = vn.h;
    dev.k_cache = kc.d, dev.v_cache = vc.d, dev.k_new = kn.d, dev.v_new = vn.d;
    std::uniform_int_distribution<int64_t> len_of(0, cap - s.s_new);
    lens = Pair(DType::kInt32, {s.batch});
    for (int64_t b = 0; b < s.batch; ++b) lens.ints()[b] = static_cast<int32_t>(len_of(rng));
    lens.ints()[0] = static_cast<int32_t>(cap - s.s_new);  // fills the cache to the last slot
    if (s.overflow) lens.ints()[0] = static_cast<int32_t>(cap - 1);  // s_new - 1 tokens too many
    if (s.scalar_len) {
      host.cache_seqlen = dev.cache_seqlen = lens.ints()[1 % s.batch];
    } else {
      host.cache_seqlens = lens.h, dev.cache_seqlens = lens.d;
    }
    if (idx_map) {
      idx = Pair(DType::kInt32, {s.batch});
      std::vector<int32_t> perm(static_cast<size_t>(rows));
      for (int64_t i = 0; i < rows; ++i) perm[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::memcpy(idx.host.data(), perm.data(), idx.host.size());
      host.cache_batch_idx = idx.h, dev.cache_batch_idx = idx.d;
    }
    if (paged) {
      table = Pair(DType::kInt32, {s.batch, per_seq});
      std::vector<int32_t> perm(static_cast<size_t>(rows));
      for (int64_t i = 0; i < rows; ++i) perm[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::memcpy(table.host.data(), perm.data(), table.host.size());
      if (s.overflow && s.batch > 1 && s.s_new > 0) {  // sequence 1's first new token: no page
        const int64_t pos = lens.ints()[1];
        table.ints()[1 * per_seq + pos / page] = static_cast<int32_t>(rows + 5);
      }
      host.block_table = table.h, dev.block_table = table.d;
    }
    if (s.rotary) {
      const DType rd = s.rot_f32 ? DType::kFloat32 : s.dtype;
      // The overflow case's table is one position short of what sequence 0's q needs.
      const int64_t s_rot = s.overflow ? cap - 1 : cap + s.s_q;
      cos = Pair(rd, {s_rot, s.rot_cols});
      sin = Pair(rd, {s_rot, s.rot_cols});
      std::uniform_real_distribution<float> angle(-3.14159f, 3.14159f);
      for (int64_t i = 0; i < s_rot * s.rot_cols; ++i) {
        const float a = angle(rng);
        store_float(cos.host.data(), i, rd, std::cos(a));
        store_float(sin.host.data(), i, rd, std::sin(a));
      }
      host.rotary_cos = cos.h, host.rotary_sin = sin.h;
      dev.rotary_cos = cos.d, dev.rotary_sin = sin.d;
      host.rotary_interleaved = dev.rotary_interleaved = s.interleaved;
      q = Pair(s.dtype, {s.batch, s.s_q, s.h_q, s.d});
      q_out = Pair(s.dtype, {s.batch, s.s_q, s.h_q, s.d});
      fill_random(q, rng);
      host.q = q.h, host.q_out = q_out.h, dev.q = q.d, dev.q_out = q_out.d;
      host.q_positions_per_token = dev.q_positions_per_token = s.per_token;
    }
    out = Pair(DType::kInt32, {s.batch});
    host.seqlens_out = out.h, dev.seqlens_out = out.d;
    for (Pair* p : {&kc, &vc, &kn, &vn, &lens, &idx, &table, &cos, &sin, &q})
      if (p->dev) p->upload();
    if (q_out.dev) {
      EXPECT_EQ(cudaMemset(q_out.dev, 0xff, q_out.host.size()), cudaSuccess);
    }
    EXPECT_EQ(cudaMemset(out.dev, 0xff, out.host.size()), cudaSuccess);
  }
};

// Elements equal up to one rounding of a float32 rotation (the CPU path and the kernel may round
// the products differently: FMA contraction).
void expect_close(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want,
                  DType dtype, const char* what) {
  const int64_t n = static_cast<int64_t>(want.size() / dtype_size(dtype));
  const double tol = dtype == DType::kFloat32 ? 1e-5 : dtype == DType::kFloat16 ? 1e-3 : 8e-3;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double a = load_float(got.data(), i, dtype), b = load_float(want.data(), i, dtype);
    if (!(std::abs(a - b) <= tol * (1 + std::abs(b)))) ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " elements differ";
}

void check_against_cpu(const Spec& spec) {
  Case c(spec);
  const std::vector<unsigned char> k_before = c.kc.host, v_before = c.vc.host;
  kv_cache_append(c.dev);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  kv_cache_append(c.host);  // the CPU path on the host copies: the expected result
  if (spec.dtype == DType::kFloat8E4M3) {
    EXPECT_TRUE(c.kc.download() == c.kc.host) << "k_cache: e4m3 codes are copied bit for bit";
  } else {
    expect_close(c.kc.download(), c.kc.host, spec.dtype, "k_cache");
  }
  EXPECT_EQ(c.vc.download(), c.vc.host) << "v_cache";
  if (spec.rotary) expect_close(c.q_out.download(), c.q_out.host, spec.dtype, "q_out");
  EXPECT_EQ(c.out.download(), c.out.host) << "seqlens_out";
  EXPECT_NE(c.kc.host, k_before) << "the case appends nothing";
}

class KvAppendGpu : public ::testing::TestWithParam<Spec> {};

TEST_P(KvAppendGpu, MatchesTheCpuPath) {
  SKIP_WITHOUT_CUDA();
  check_against_cpu(GetParam());
}

std::vector<Spec> specs() {
  std::vector<Spec> all;
  for (const char* layout : {"contiguous", "batch_idx", "paged16", "paged7"})
    for (DType dt : {DType::kBFloat16, DType::kFloat16, DType::kFloat32})
      for (int variant = 0; variant < 3; ++variant) {
        Spec s;
        s.layout = layout;
        s.dtype = dt;
        s.interleaved = variant != 1;
        s.per_token = variant != 2;
        s.rot_f32 = variant != 0 || dt == DType::kFloat32;
        s.scalar_len = variant == 2;
        if (variant == 1) s.rot_cols = 16, s.d = 128, s.h_q = 2, s.h_kv = 1;  // partial rotary
        all.push_back(s);
      }
  Spec plain;  // no rotary: a copy with the lengths
  plain.layout = "paged16";
  plain.rotary = false;
  all.push_back(plain);
  for (const char* layout : {"contiguous", "batch_idx", "paged16", "paged7"}) {
    Spec e4m3;  // an fp8 cache: e4m3 codes copied as they are (rotary is refused for it)
    e4m3.layout = layout;
    e4m3.dtype = DType::kFloat8E4M3;
    e4m3.rotary = false;
    e4m3.s_new = 5;
    all.push_back(e4m3);
  }
  Spec decode;  // one token, long cache
  decode.layout = "contiguous", decode.s_new = decode.s_q = 1, decode.capacity = 4000;
  decode.batch = 2, decode.h_kv = 8, decode.h_q = 32, decode.d = 128, decode.rot_cols = 64;
  all.push_back(decode);
  return all;
}

std::string spec_name(const ::testing::TestParamInfo<Spec>& info) {
  const Spec& s = info.param;
  return s.layout + "_" + dtype_name(s.dtype) +
         (s.rotary ? (s.interleaved ? "_gptj" : "_neox") : "_norot") +
         (s.per_token ? "_pertoken" : "_atlen") + (s.scalar_len ? "_scalar" : "") + "_d" +
         std::to_string(s.d) + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Cases, KvAppendGpu, ::testing::ValuesIn(specs()), spec_name);

// Device lengths that overflow: sequence 0 holds capacity - 1 keys and gets s_new = 3 tokens (two
// past the end), sequence 1's first new token falls on a page outside the pool (paged), and the
// rotary table lacks the last positions. Nothing may be written out of bounds, and what is written
// is what the contract says.
void check_overflow(const std::string& layout) {
  Spec s;
  s.layout = layout;
  s.overflow = true;
  s.s_new = 3;
  s.s_q = 1;
  Case c(s);
  const std::vector<unsigned char> k_before = c.kc.host, v_before = c.vc.host;
  kv_cache_append(c.dev);  // trusted device lengths: no error
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto k_after = c.kc.download(), v_after = c.vc.download();
  const auto seqlens = c.out.download();
  const int32_t* lens_out = reinterpret_cast<const int32_t*>(seqlens.data());
  const int64_t cap = layout == "paged16" ? 48 : s.capacity;
  EXPECT_EQ(lens_out[0], cap) << "seqlens_out is clamped to the capacity";
  // Sequence 0: only its slot cap - 1 may have changed in its rows; compare every slot not
  // reachable by an in-bounds token of any sequence.
  const size_t row_bytes = static_cast<size_t>(s.h_kv * s.d) * dtype_size(s.dtype);
  std::vector<bool> owned(static_cast<size_t>(c.rows * c.rpe), false);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.s_new; ++i) {
      const int64_t pos = c.lens.ints()[b] + i;
      if (pos >= cap) continue;
      int64_t entry = b, row = pos;
      if (layout == "paged16") {
        const int64_t per_seq = c.table.h.shape[1];
        entry = c.table.ints()[b * per_seq + pos / 16];
        row = pos % 16;
        if (entry < 0 || entry >= c.rows) continue;
      }
      owned[static_cast<size_t>(entry * c.rpe + row)] = true;
    }
  for (size_t slot = 0; slot < owned.size(); ++slot) {
    if (owned[slot]) continue;
    EXPECT_EQ(std::memcmp(k_after.data() + slot * row_bytes, k_before.data() + slot * row_bytes,
                          row_bytes),
              0)
        << "k slot " << slot << " changed";
    EXPECT_EQ(std::memcmp(v_after.data() + slot * row_bytes, v_before.data() + slot * row_bytes,
                          row_bytes),
              0)
        << "v slot " << slot << " changed";
  }
  // Sequence 0's new key at cap - 1 has no angle (the table holds cap - 1 positions): NaN.
  const auto q_out = c.q_out.download();
  EXPECT_TRUE(std::isnan(load_float(q_out.data(), 0, s.dtype)))
      << "q of sequence 0 sits at position cap - 1, past the table";
}

TEST(KvAppendGpu, DeviceOverflowNeverWritesOutOfBounds) {
  SKIP_WITHOUT_CUDA();
  check_overflow("contiguous");
  check_overflow("paged16");
}

// Under compute-sanitizer: the overflow cases and a paged one with rotary.
TEST(KvAppendSanitize, OverflowAndPaged) {
  SKIP_WITHOUT_CUDA();
  check_overflow("contiguous");
  check_overflow("paged16");
  Spec s;
  s.layout = "paged7";
  check_against_cpu(s);
}

// Issue 9: K and V caches split from one tensor (kv[:, :, 0], kv[:, :, 1]: disjoint elements)
// are accepted on the device too, and the append writes exactly what the CPU path writes into
// the same layout (no rotary: a copy, so bit for bit), touching neither half's other slots.
TEST(KvAppendGpu, InterleavedCachesMatchTheCpuPath) {
  SKIP_WITHOUT_CUDA();
  const int64_t batch = 3, cap = 20, h_kv = 2, d = 64, s_new = 3;
  std::mt19937_64 rng(seed_for("InterleavedCachesMatchTheCpuPath"));
  Pair kv(DType::kBFloat16, {batch, cap, 2 * h_kv, d});  // [batch, cap, 2, h_kv, d] in memory
  Pair kn(DType::kBFloat16, {batch, s_new, h_kv, d}), vn(DType::kBFloat16, {batch, s_new, h_kv, d});
  Pair lens(DType::kInt32, {batch});
  fill_random(kv, rng), fill_random(kn, rng), fill_random(vn, rng);
  for (int64_t b = 0; b < batch; ++b) lens.ints()[b] = static_cast<int32_t>(4 * b + 1);
  kv.upload(), kn.upload(), vn.upload(), lens.upload();
  auto halves = [&](const TensorView& whole, KvCacheAppendParams& p) {
    p.k_cache = whole;
    p.k_cache.shape[2] = h_kv;
    p.v_cache = p.k_cache;
    p.v_cache.data = static_cast<char*>(whole.data) + h_kv * d * dtype_size(DType::kBFloat16);
  };
  KvCacheAppendParams host, dev;
  halves(kv.h, host), halves(kv.d, dev);
  host.k_new = kn.h, host.v_new = vn.h, host.cache_seqlens = lens.h;
  dev.k_new = kn.d, dev.v_new = vn.d, dev.cache_seqlens = lens.d;
  kv_cache_append(dev);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  kv_cache_append(host);
  EXPECT_TRUE(kv.download() == kv.host) << "the device append differs from the CPU path's";
}

// Issue 9: two sequences appending to one cache row race on the device (either write may land).
// Device indices are trusted as given (reading them would synchronize every call); with
// FLASHSERVE_CHECK_INDICES=1 they are checked on the host like the CPU path's, and duplicates
// are refused before anything is written.
TEST(KvAppendGpu, CheckIndicesRefusesTwoAppendsToOneCacheRow) {
  SKIP_WITHOUT_CUDA();
  const int64_t batch = 2, rows = 3, cap = 10, h_kv = 1, d = 64;
  std::mt19937_64 rng(seed_for("CheckIndicesRefusesTwoAppendsToOneCacheRow"));
  Pair kc(DType::kFloat16, {rows, cap, h_kv, d}), vc(DType::kFloat16, {rows, cap, h_kv, d});
  Pair kn(DType::kFloat16, {batch, 1, h_kv, d}), vn(DType::kFloat16, {batch, 1, h_kv, d});
  Pair lens(DType::kInt32, {batch}), idx(DType::kInt32, {batch});
  fill_random(kc, rng), fill_random(vc, rng), fill_random(kn, rng), fill_random(vn, rng);
  lens.ints()[0] = 2, lens.ints()[1] = 5;
  idx.ints()[0] = 1, idx.ints()[1] = 1;
  for (Pair* p : {&kc, &vc, &kn, &vn, &lens, &idx}) p->upload();
  KvCacheAppendParams dev;
  dev.k_cache = kc.d, dev.v_cache = vc.d, dev.k_new = kn.d, dev.v_new = vn.d;
  dev.cache_seqlens = lens.d, dev.cache_batch_idx = idx.d;
  {
    ScopedEnv check("FLASHSERVE_CHECK_INDICES", "1");
    try {
      kv_cache_append(dev);
      ADD_FAILURE() << "duplicate cache_batch_idx accepted with FLASHSERVE_CHECK_INDICES=1";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "cache_batch_idx") << e.what();
    }
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(kc.download() == kc.host) << "the refused call wrote the cache";
}

}  // namespace
}  // namespace flashserve::testing
