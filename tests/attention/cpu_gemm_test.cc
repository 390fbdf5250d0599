// The CPU path's block products (cpu_gemm.h) against a float64 product, at every ISA level the
// machine has: odd sizes around the register tile (8 rows x 32 columns), strided A in both
// orientations, accumulate on and off, and C poisoned around the M x N block it may write.
#include "attention/reference/cpu_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/half.h"

namespace flashserve::attention {
namespace {

class IsaLevel : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    force_cpu_isa(GetParam());
    if (cpu_isa() != GetParam()) GTEST_SKIP() << "this CPU lacks " << cpu_isa_name(GetParam());
  }
  void TearDown() override { force_cpu_isa(CpuIsa::kAvx512Bf16); }  // back to the best
};

TEST_P(IsaLevel, Float32MatchesFloat64) {
  std::mt19937 rng(testing::UnitTest::GetInstance()->random_seed() + 7);
  std::normal_distribution<float> nd;
  for (int64_t M : {1, 7, 8, 9, 130})
    for (int64_t N : {1, 15, 16, 17, 33, 64, 100})
      for (int64_t K : {0, 1, 63, 256})
        for (bool transposed_a : {false, true})
          for (bool accumulate : {false, true}) {
            // A(i, k) = a[i * a_row + k * a_col], row-major or column-major with padding.
            const int64_t a_row = transposed_a ? 1 : K + 3, a_col = transposed_a ? M + 2 : 1;
            const int64_t ldb = N + 5, ldc = N + 4;
            std::vector<float> a((M + 2) * (K + 3) + 8), b(std::max<int64_t>(K, 1) * ldb);
            std::vector<float> c((M + 1) * ldc);
            for (float& x : a) x = nd(rng);
            for (float& x : b) x = nd(rng);
            for (int64_t i = 0; i < static_cast<int64_t>(c.size()); ++i)
              c[i] = (i / ldc < M && i % ldc < N) ? (accumulate ? nd(rng) : NAN) : -777.0f;
            const std::vector<float> c0 = c;
            block_gemm(M, N, K, a.data(), a_row, a_col, b.data(), ldb, c.data(), ldc, accumulate);
            for (int64_t i = 0; i < M + 1; ++i)
              for (int64_t n = 0; n < ldc; ++n) {
                const float got = c[i * ldc + n];
                if (i >= M || n >= N) {
                  ASSERT_EQ(got, -777.0f) << "wrote outside C at " << i << "," << n;
                  continue;
                }
                double want = accumulate ? c0[i * ldc + n] : 0.0, mag = std::fabs(want);
                for (int64_t k = 0; k < K; ++k) {
                  const double p = double(a[i * a_row + k * a_col]) * b[k * ldb + n];
                  want += p;
                  mag += std::fabs(p);
                }
                ASSERT_NEAR(got, want, 1e-5 * (mag + 1)) << M << "x" << N << "x" << K;
              }
          }
}

TEST_P(IsaLevel, Bf16PairsMatchFloat64) {
  if (GetParam() != CpuIsa::kAvx512Bf16) GTEST_SKIP() << "bf16 products: AVX512-BF16 only";
  std::mt19937 rng(testing::UnitTest::GetInstance()->random_seed() + 11);
  std::normal_distribution<float> nd;
  for (int64_t M : {1, 8, 13, 128})
    for (int64_t N : {1, 16, 17, 40, 128})
      for (int64_t K : {1, 2, 63, 64, 257})  // K odd: the last pair's second element is 0
        for (bool accumulate : {false, true}) {
          // A as rows of K values; B from K rows of N values packed into pairs.
          const int64_t K2 = (K + 1) / 2, lda = 2 * K2;
          std::vector<uint16_t> a(M * lda, 0), brows(K * N), b(K2 * 2 * N);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t k = 0; k < K; ++k) a[i * lda + k] = to_bf16(nd(rng)).bits;
          for (uint16_t& x : brows) x = to_bf16(nd(rng)).bits;
          for (int64_t k2 = 0; k2 < K2; ++k2)
            pack_bf16_pairs(&brows[2 * k2 * N], 2 * k2 + 1 < K ? &brows[(2 * k2 + 1) * N] : nullptr,
                            N, &b[k2 * 2 * N]);
          std::vector<float> c(M * N);
          for (float& x : c) x = accumulate ? nd(rng) : NAN;
          const std::vector<float> c0 = c;
          block_gemm_bf16(M, N, K2, a.data(), lda, 2, b.data(), 2 * N, c.data(), N, accumulate);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t n = 0; n < N; ++n) {
              double want = accumulate ? c0[i * N + n] : 0.0, mag = std::fabs(want);
              for (int64_t k = 0; k < K; ++k) {
                const double p =
                    double(to_float(bf16_t{a[i * lda + k]})) * to_float(bf16_t{brows[k * N + n]});
                want += p;
                mag += std::fabs(p);
              }
              ASSERT_NEAR(c[i * N + n], want, 1e-5 * (mag + 1)) << M << "x" << N << "x" << K;
            }
        }
}

TEST_P(IsaLevel, FloatPairsRoundToNearestEven) {
  std::mt19937 rng(testing::UnitTest::GetInstance()->random_seed() + 13);
  std::normal_distribution<float> nd;
  for (int64_t n : {1, 15, 16, 17, 100}) {
    std::vector<float> s0(n), s1(n);
    for (int64_t i = 0; i < n; ++i) s0[i] = nd(rng), s1[i] = nd(rng) * 1e-3f;
    s0[0] = NAN;
    std::vector<uint16_t> d(2 * n + 2, 0xABCD);
    pack_float_pairs(s0.data(), s1.data(), n, d.data());
    for (int64_t i = 0; i < n; ++i) {
      if (i == 0)
        EXPECT_TRUE(std::isnan(to_float(bf16_t{d[0]})));
      else
        EXPECT_EQ(d[2 * i], to_bf16(s0[i]).bits) << i;
      EXPECT_EQ(d[2 * i + 1], to_bf16(s1[i]).bits) << i;
    }
    EXPECT_EQ(d[2 * n], 0xABCD);  // nothing past n pairs
    pack_float_pairs(s0.data(), nullptr, n, d.data());
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(d[2 * i + 1], 0) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, IsaLevel,
                         ::testing::Values(CpuIsa::kPortable, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16),
                         [](const auto& info) {
                           std::string s = cpu_isa_name(info.param);
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace flashserve::attention
