// block_softmax (the key-major online-softmax step of the CPU path, AVX-512 and portable) against
// RunningSoftmax, the row-by-row recurrence whose NaN/inf rule online_softmax_test checks against
// the textbook softmax: random blocks of scores seeded with NaN, +inf, -inf, huge finite values,
// subnormals and -0.0, masked keys, rows that see nothing for several blocks, over several
// blocks. m, the NaN-ness and emptiness of l, corr and every probability must agree (to a few
// ulps: FMA contraction), l within float rounding of a differently ordered sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention/reference/block_softmax.h"
#include "attention/reference/cpu_gemm.h"
#include "attention/reference/online_softmax.h"

namespace flashserve::attention {
namespace {

class BlockSoftmaxIsa : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    force_cpu_isa(GetParam());
    if (cpu_isa() != GetParam()) GTEST_SKIP() << "this CPU lacks " << cpu_isa_name(GetParam());
  }
  void TearDown() override { force_cpu_isa(CpuIsa::kAvx512Bf16); }
};

// Equal, both NaN, or (finite, non-zero) within a few ulps: the AVX-512 clone contracts the
// exp2 polynomial into FMAs, the scalar reference does not, so bits differ in the last place.
bool same(float a, float b) {
  if ((std::isnan(a) && std::isnan(b)) || a == b) return true;
  if (!std::isfinite(a) || !std::isfinite(b) || a == 0.0f || b == 0.0f) return false;
  return std::abs(a - b) <= 4e-7f * std::max(std::abs(a), std::abs(b));
}

TEST_P(BlockSoftmaxIsa, MatchesRunningSoftmaxOnSpecialValues) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {nan, inf, -inf, 3e38f, -3e38f, 1e-45f, -0.0f, 0.0f, 80.0f, -200.0f};
  std::uniform_int_distribution<int> pick(0, 99);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  int nan_rows = 0, empty_rows = 0, plain_rows = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t rows = 1 + pick(rng) % 37, blocks = 1 + pick(rng) % 4;
    const float scale = pick(rng) % 2 ? 1.0f : 0.37f;
    // Row windows [first, end) over blocks x nb keys; special values at a rate that varies
    // per trial, so some rows stay clean.
    const int64_t nb = 1 + pick(rng) % 40, ld = rows + pick(rng) % 3;
    const int rate = pick(rng) % 6;
    std::vector<int64_t> first(rows), end(rows);
    for (int64_t i = 0; i < rows; ++i) {
      first[i] = pick(rng) % (blocks * nb + 1);
      end[i] = first[i] + pick(rng) % (blocks * nb + 1);
    }
    std::vector<float> m(rows, -inf), l(rows, 0.0f), corr(rows), scratch(rows);
    std::vector<RunningSoftmax<float>> ref(rows);
    for (int64_t blk = 0; blk < blocks; ++blk) {
      std::vector<float> s(nb * ld);
      for (float& x : s) x = pick(rng) < rate ? specials[pick(rng) % 10] : normal(rng);
      // The reference per row: visible keys scaled, masked ones -inf.
      std::vector<std::vector<float>> want(rows, std::vector<float>(nb));
      std::vector<float> want_corr(rows);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < nb; ++j) {
          const int64_t key = blk * nb + j;
          want[i][j] = key >= first[i] && key < end[i] ? s[j * ld + i] * scale : -inf;
        }
        want_corr[i] = ref[i].add(want[i].data(), nb);
      }
      bool all_visible = true;
      for (int64_t i = 0; i < rows; ++i)
        all_visible &= first[i] <= blk * nb && end[i] >= (blk + 1) * nb;
      const ScoreBlock b{s.data(),     ld,         nb,          rows, blk * nb,
                         first.data(), end.data(), all_visible, scale};
      block_softmax(b, m.data(), l.data(), corr.data(), scratch.data());
      for (int64_t i = 0; i < rows; ++i) {
        ASSERT_TRUE(same(m[i], ref[i].m) || std::isnan(ref[i].m))
            << "m, row " << i << " block " << blk << ": " << m[i] << " vs " << ref[i].m;
        ASSERT_EQ(std::isnan(l[i]), std::isnan(ref[i].l)) << "l NaN, row " << i;
        ASSERT_EQ(l[i] == 0.0f, ref[i].l == 0.0f) << "l empty, row " << i;
        if (!std::isnan(l[i])) ASSERT_NEAR(l[i], ref[i].l, 1e-6f * ref[i].l * nb) << "l, row " << i;
        if (!std::isnan(ref[i].l)) {
          ASSERT_TRUE(same(corr[i], want_corr[i])) << "corr, row " << i;
          for (int64_t j = 0; j < nb; ++j)
            ASSERT_TRUE(same(s[j * ld + i], want[i][j]))
                << "p, row " << i << " key " << j << ": " << s[j * ld + i] << " vs " << want[i][j];
        }
      }
    }
    for (int64_t i = 0; i < rows; ++i) {
      nan_rows += std::isnan(l[i]);
      empty_rows += l[i] == 0.0f;
      plain_rows += std::isfinite(l[i]) && l[i] > 0;
    }
  }
  // Every kind of row occurred often enough to mean something.
  EXPECT_GT(nan_rows, 100);
  EXPECT_GT(empty_rows, 100);
  EXPECT_GT(plain_rows, 100);
}

INSTANTIATE_TEST_SUITE_P(Levels, BlockSoftmaxIsa,
                         ::testing::Values(CpuIsa::kPortable, CpuIsa::kAvx512),
                         [](const auto& info) { return std::string(cpu_isa_name(info.param)); });

}  // namespace
}  // namespace flashserve::attention
