// The random Hadamard rotation (attention/hadamard.h): the fast transform equals the Walsh-Hadamard
// matrix written out in float64, R is orthogonal (R^T R = I) and unrotate undoes rotate, a
// coordinate spike spreads evenly over all n, and attention over rotated q and k equals attention
// over the originals within the bound the rotation's float32 rounding implies.
#include "attention/hadamard.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <iostream>
#include <random>
#include <vector>

#include "attention/reference/naive.h"
#include "flashserve/attention.h"

namespace flashserve::attention {
namespace {

uint64_t logged_seed() {
  const uint64_t seed = std::random_device{}();
  std::cout << "seed " << seed << "\n";
  return seed;
}

std::vector<double> normal_vector(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  std::vector<double> x(static_cast<size_t>(n));
  for (double& v : x) v = normal(rng);
  return x;
}

TEST(Hadamard, FastTransformEqualsTheMatrix) {
  std::mt19937_64 rng(logged_seed());
  for (int64_t n = 1; n <= 256; n *= 2) {
    const std::vector<double> x = normal_vector(n, rng);
    std::vector<double> y = x;
    fwht(y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      double want = 0;  // H_ij = (-1)^popcount(i & j) / sqrt(n)
      for (int64_t j = 0; j < n; ++j)
        want += (std::popcount(static_cast<uint64_t>(i & j)) % 2 ? -x[j] : x[j]);
      want /= std::sqrt(static_cast<double>(n));
      EXPECT_NEAR(y[i], want, 1e-12 * std::sqrt(static_cast<double>(n))) << "n " << n << " i " << i;
    }
  }
  float bad[3] = {1, 2, 3};
  EXPECT_THROW(fwht(bad, 3), Error);
}

TEST(Hadamard, RotationIsOrthogonal) {
  const uint64_t seed = logged_seed();
  for (int64_t n : {64, 128, 256}) {
    const RandomHadamard r(n, seed);
    std::vector<double> cols(static_cast<size_t>(n * n), 0.0);  // column j = R e_j
    for (int64_t j = 0; j < n; ++j) {
      double* c = &cols[j * n];
      c[j] = 1.0;
      r.rotate(c);
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int64_t k = 0; k < n; ++k) dot += cols[i * n + k] * cols[j * n + k];
        ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-13) << "n " << n << " (" << i << ", " << j << ")";
      }
    // float32: unrotate(rotate(x)) = x, each step adding log2(n) + 1 roundings per element of
    // magnitude at most |x|_2 (every partial sum of the butterflies is bounded by it).
    std::mt19937_64 rng(seed);
    const std::vector<double> xd = normal_vector(n, rng);
    std::vector<float> x(xd.begin(), xd.end()), y = x;
    double norm = 0;
    for (float v : x) norm += static_cast<double>(v) * v;
    norm = std::sqrt(norm);
    r.rotate(y.data());
    r.unrotate(y.data());
    const double bound = 2 * (std::log2(static_cast<double>(n)) + 1) * 0x1p-24 * norm;
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i], bound) << "n " << n << " i " << i;
  }
}

// An outlier at one coordinate becomes n coordinates of magnitude outlier / sqrt(n): what makes a
// per-tensor e4m3 scale fit the rest of the tensor again.
TEST(Hadamard, SpreadsASpikeEvenly) {
  const uint64_t seed = logged_seed();
  for (int64_t n : {64, 128, 256}) {
    const RandomHadamard r(n, seed);
    for (int64_t i : {int64_t{0}, n / 3, n - 1}) {
      std::vector<double> x(static_cast<size_t>(n), 0.0);
      x[i] = 100.0;
      r.rotate(x.data());
      for (double v : x) EXPECT_NEAR(std::abs(v), 100.0 / std::sqrt(static_cast<double>(n)), 1e-12);
    }
  }
}

// softmax(s + e) differs from softmax(s) by a factor within exp(+-2 max|e|) per weight, so
// rotating q and k (which changes every score by the float32 rounding of the rotation only) moves
// each output by at most expm1(2 scale max|q'.k' - q.k|) max|v|.
TEST(Hadamard, AttentionIsInvariantUnderTheRotation) {
  const uint64_t seed = logged_seed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (int64_t d : {64, 128, 256}) {
    const int64_t n_q = 33, n_k = 77, heads = 2;
    std::vector<float> q(n_q * heads * d), k(n_k * heads * d), v(n_k * heads * d);
    for (auto* t : {&q, &k, &v})
      for (float& x : *t) x = normal(rng);
    q[5] = 80.0f;  // outliers, as in the accuracy study
    k[d + 3] = -60.0f;
    std::vector<float> qr = q, kr = k;
    const RandomHadamard r(d, seed + d);
    r.rotate_rows(qr.data(), n_q * heads);
    r.rotate_rows(kr.data(), n_k * heads);
    std::vector<float> out(n_q * heads * d);
    auto run = [&](std::vector<float>& qq, std::vector<float>& kk) {
      AttentionParams p;
      p.q = make_view(qq.data(), DType::kFloat32, {1, n_q, heads, d});
      p.k = make_view(kk.data(), DType::kFloat32, {1, n_k, heads, d});
      p.v = make_view(v.data(), DType::kFloat32, {1, n_k, heads, d});
      p.out = make_view(out.data(), DType::kFloat32, {1, n_q, heads, d});
      p.causal = true;
      return reference::naive_forward(p);
    };
    const auto plain = run(q, k), rotated = run(qr, kr);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    double score_err = 0, vmax = 0;
    for (float x : v) vmax = std::max(vmax, std::abs(static_cast<double>(x)));
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < n_q; ++t)
        for (int64_t j = 0; j < n_k; ++j) {
          double a = 0, b = 0;
          for (int64_t i = 0; i < d; ++i) {
            a += static_cast<double>(q[(t * heads + h) * d + i]) * k[(j * heads + h) * d + i];
            b += static_cast<double>(qr[(t * heads + h) * d + i]) * kr[(j * heads + h) * d + i];
          }
          score_err = std::max(score_err, scale * std::abs(a - b));
        }
    const double bound = std::expm1(2 * score_err) * vmax + 1e-12;
    double worst = 0;
    for (size_t i = 0; i < plain.out.size(); ++i)
      worst = std::max(worst, std::abs(plain.out[i] - rotated.out[i]));
    EXPECT_LE(worst, bound) << "d " << d << " seed " << seed;
    std::cout << "d " << d << ": max |out change| " << worst << " <= " << bound << "\n";
  }
}

}  // namespace
}  // namespace flashserve::attention
