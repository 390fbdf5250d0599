// overlaps() is element-exact (issue 9): views of one buffer whose elements interleave without
// meeting (K and V split from one [b, s, 2, h, d] tensor, as FlashAttention accepts) do not
// overlap, views that share one byte do. Checked against an oracle that marks every byte each view
// addresses, on random views of one small buffer (random ranks, sizes, strides, offsets, dtypes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attention/problem.h"
#include "attention/reference/naive.h"
#include "flashserve/attention.h"

namespace flashserve::attention {
namespace {

// The bytes (offsets from base) a view addresses.
std::vector<uint8_t> bytes_of(const TensorView& t, const std::byte* base, size_t n) {
  std::vector<uint8_t> hit(n, 0);
  const int64_t size = static_cast<int64_t>(dtype_size(t.dtype));
  int64_t idx[kMaxRank] = {0, 0, 0, 0};
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] == 0) return hit;
  for (;;) {
    int64_t off = static_cast<const std::byte*>(t.data) - base;
    for (int i = 0; i < t.rank; ++i) off += idx[i] * t.stride[i] * size;
    for (int64_t e = 0; e < size; ++e) hit.at(off + e) = 1;
    int i = t.rank - 1;
    while (i >= 0 && ++idx[i] == t.shape[i]) idx[i--] = 0;
    if (i < 0) break;
  }
  return hit;
}

// Whether the views share a byte; *interleaved: whether, sharing none, their byte ranges cross
// (the cases a range test would get wrong).
bool oracle(const TensorView& a, const TensorView& b, const std::byte* base, size_t n,
            bool* interleaved) {
  const auto x = bytes_of(a, base, n), y = bytes_of(b, base, n);
  size_t x0 = n, x1 = 0, y0 = n, y1 = 0;
  bool shared = false;
  for (size_t i = 0; i < n; ++i) {
    if (x[i]) x0 = std::min(x0, i), x1 = i + 1;
    if (y[i]) y0 = std::min(y0, i), y1 = i + 1;
    shared |= x[i] && y[i];
  }
  *interleaved = !shared && x0 < y1 && y0 < x1;
  return shared;
}

TensorView strided(void* data, DType dtype, std::vector<int64_t> shape,
                   std::vector<int64_t> stride) {
  TensorView t;
  t.data = data, t.dtype = dtype, t.rank = static_cast<int32_t>(shape.size());
  for (int i = 0; i < t.rank; ++i) t.shape[i] = shape[i], t.stride[i] = stride[i];
  return t;
}

TEST(Overlap, InterleavedKAndVOfOneTensorDoNotOverlap) {
  // kv [b 2, s 5, 2, h 3, d 4]: k = kv[:, :, 0], v = kv[:, :, 1].
  const int64_t B = 2, S = 5, H = 3, D = 4;
  std::vector<float> kv(B * S * 2 * H * D);
  const std::vector<int64_t> shape{B, S, H, D}, stride{S * 2 * H * D, 2 * H * D, D, 1};
  const TensorView k = strided(kv.data(), DType::kFloat32, shape, stride);
  const TensorView v = strided(kv.data() + H * D, DType::kFloat32, shape, stride);
  EXPECT_FALSE(overlaps(k, v));
  EXPECT_FALSE(overlaps(v, k));
  EXPECT_TRUE(overlaps(k, k));
  // One element further, v's first head is k's second: they meet.
  const TensorView shifted = strided(kv.data() + H * D - D, DType::kFloat32, shape, stride);
  EXPECT_TRUE(overlaps(k, shifted));
  // Split along the head dim (k = x[..., :D], v = x[..., D:]) likewise.
  const TensorView lo =
      strided(kv.data(), DType::kFloat32, {B, S, H, D}, {S * H * 2 * D, H * 2 * D, 2 * D, 1});
  const TensorView hi =
      strided(kv.data() + D, DType::kFloat32, {B, S, H, D}, {S * H * 2 * D, H * 2 * D, 2 * D, 1});
  EXPECT_FALSE(overlaps(lo, hi));
  const TensorView hi_wide = strided(kv.data() + D - 1, DType::kFloat32, {B, S, H, D},
                                     {S * H * 2 * D, H * 2 * D, 2 * D, 1});
  EXPECT_TRUE(overlaps(lo, hi_wide));
}

TEST(Overlap, DifferentDtypesMeetAtTheByte) {
  // A float32 view of the even elements and a bf16 view reaching into the second half of one of
  // them share two bytes; the bf16 view of the odd elements' bytes shares none.
  std::vector<float> buf(16);
  const TensorView even = strided(buf.data(), DType::kFloat32, {8}, {2});
  auto* half = reinterpret_cast<uint16_t*>(buf.data());
  EXPECT_TRUE(overlaps(even, strided(half + 1, DType::kBFloat16, {1}, {1})));
  EXPECT_FALSE(overlaps(even, strided(half + 2, DType::kBFloat16, {8}, {4})));
  EXPECT_FALSE(overlaps(even, strided(half + 3, DType::kBFloat16, {8}, {4})));
  EXPECT_TRUE(overlaps(even, strided(half + 3, DType::kBFloat16, {8}, {3})));
}

TEST(Overlap, MatchesAByteOracleOnRandomViews) {
  std::mt19937_64 rng(std::random_device{}());
  const uint64_t seed = rng();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  rng.seed(seed);
  constexpr size_t kBytes = 768;
  std::vector<std::byte> buf(kBytes + 64);
  const std::byte* base = buf.data();
  auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64};
  // A random view inside the buffer: rank 1-4, sizes 0-4, strides 0-12 elements, often the
  // strides of a contiguous parent (so that sibling views of one tensor are common).
  auto random_view = [&](const std::vector<int64_t>* parent) {
    for (;;) {
      const DType dt = dtypes[pick(0, 3)];
      const int64_t size = static_cast<int64_t>(dtype_size(dt));
      const int rank = parent ? static_cast<int>(parent->size()) : static_cast<int>(pick(1, 4));
      std::vector<int64_t> shape(rank), stride(rank);
      for (int i = 0; i < rank; ++i) {
        shape[i] = pick(0, 4);
        stride[i] = parent ? (*parent)[i] * 4 / size : pick(0, 12);
      }
      int64_t span = size;
      for (int i = 0; i < rank; ++i)
        span += (std::max<int64_t>(shape[i], 1) - 1) * stride[i] * size;
      if (span > static_cast<int64_t>(kBytes)) continue;
      const int64_t off = pick(0, (static_cast<int64_t>(kBytes) - span) / size) * size;
      return strided(buf.data() + off, dt, shape, stride);
    }
  };
  int overlapping = 0, disjoint_in_range = 0;
  // 8000 pairs, then more until both answers have occurred often enough (below): 8000 alone left
  // the interleaved disjoint pairs under 100 for about one seed in 1500 (725243044319282447: 96).
  const auto covered = [&] { return overlapping > 200 && disjoint_in_range > 100; };
  for (int iter = 0; iter < 8000 || (!covered() && iter < 80000); ++iter) {
    std::vector<int64_t> parent;
    const bool siblings = iter % 2 == 0;
    if (siblings) {  // a contiguous float32 parent's strides, in float32 elements
      const int rank = static_cast<int>(pick(2, 4));
      parent.assign(rank, 1);
      for (int i = rank - 2; i >= 0; --i) parent[i] = parent[i + 1] * pick(1, 4);
    }
    const TensorView a = random_view(siblings ? &parent : nullptr);
    const TensorView b = random_view(siblings ? &parent : nullptr);
    bool interleaved = false;
    const bool want = oracle(a, b, base, kBytes + 64, &interleaved);
    ASSERT_EQ(overlaps(a, b), want)
        << "a " << shape_string(a) << " at " << (static_cast<const std::byte*>(a.data) - base)
        << ", b " << shape_string(b) << " at " << (static_cast<const std::byte*>(b.data) - base);
    ASSERT_EQ(overlaps(b, a), want);
    overlapping += want;
    disjoint_in_range += interleaved;
  }
  // Both answers occur often enough for the comparison to mean something.
  EXPECT_GT(overlapping, 200);
  EXPECT_GT(disjoint_in_range, 100);
}

// Through attention_forward: q and out as the two halves of one [b, s, 2, h, d] tensor (out
// interleaved with its input, element-disjoint) run and match the float64 reference; an out
// moved one element onto q is refused, naming out, before anything is written.
TEST(Overlap, OutputInterleavedWithAnInputRunsAndSharingOneElementIsRefused) {
  const int64_t B = 2, S = 9, H = 2, D = 16;
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  std::vector<float> qo(B * S * 2 * H * D), kv(2 * B * S * H * D);
  for (float& x : qo) x = normal(rng);
  for (float& x : kv) x = normal(rng);
  const std::vector<int64_t> shape{B, S, H, D}, stride{S * 2 * H * D, 2 * H * D, D, 1};
  AttentionParams p;
  p.q = strided(qo.data(), DType::kFloat32, shape, stride);
  p.out = strided(qo.data() + H * D, DType::kFloat32, shape, stride);
  p.k = make_view(kv.data(), DType::kFloat32, {B, S, H, D});
  p.v = make_view(kv.data() + B * S * H * D, DType::kFloat32, {B, S, H, D});
  p.causal = true;
  const reference::NaiveOutput ref = reference::naive_forward(p);
  attention_forward(p);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const float got = qo[((b * S + t) * 2 + 1) * H * D + h * D + d];
          const double want = ref.out[((b * S + t) * H + h) * D + d];
          ASSERT_NEAR(got, want, 1e-5 * (1 + std::abs(want))) << b << " " << t << " " << h;
        }
  const std::vector<float> before = qo;
  p.out.data = qo.data() + H * D - 1;  // out's last element of a row is q's next row's first
  try {
    attention_forward(p);
    ADD_FAILURE() << "an out sharing elements with q was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "out");
    EXPECT_NE(std::string(e.what()).find("overlaps q"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(qo == before) << "the refused call wrote";
}

}  // namespace
}  // namespace flashserve::attention
