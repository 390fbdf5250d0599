// The CPU runner's GEMM against a float64 loop: every shape class the split over the thread pool
// meets (too small to split, fewer 16-column groups than workers, a ragged last group, one row,
// beta accumulating into y), on pools of several sizes, with y poisoned where beta is 0.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/thread_pool.h"
#include "model/cpu_ops.h"

#if FLASHSERVE_WITH_BLAS

namespace flashserve::model::cpu {
namespace {

struct PoolSize {
  explicit PoolSize(int workers) { ThreadPool::set_global_workers(workers); }
  ~PoolSize() { ThreadPool::set_global_workers(0); }
};

TEST(CpuLinear, MatchesAFloat64LoopOnEveryShapeAndPool) {
  std::mt19937 rng(20261201);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Shape {
    int64_t m, n, k;
  };
  const Shape shapes[] = {{1, 1, 1},      {3, 5, 7},      {1, 4096, 256}, {2, 33, 1024},
                          {64, 300, 128}, {17, 1000, 96}, {128, 48, 512}, {5, 17, 2048}};
  for (int workers : {1, 2, 3, 7}) {
    PoolSize pool(workers);
    for (const Shape& s : shapes)
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(testing::Message() << workers << " workers, m " << s.m << " n " << s.n << " k "
                                        << s.k << " beta " << beta);
        std::vector<float> x(s.m * s.k), w(s.n * s.k), y(s.m * s.n), y0(s.m * s.n);
        for (float& v : x) v = normal(rng);
        for (float& v : w) v = normal(rng);
        for (float& v : y0) v = normal(rng);
        y = y0;
        if (beta == 0.0f) std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
        linear(x.data(), w.data(), y.data(), s.m, s.n, s.k, beta);
        for (int64_t i = 0; i < s.m; ++i)
          for (int64_t j = 0; j < s.n; ++j) {
            double want = beta * static_cast<double>(y0[i * s.n + j]);
            for (int64_t l = 0; l < s.k; ++l)
              want += static_cast<double>(x[i * s.k + l]) * w[j * s.k + l];
            // float32 accumulation over k terms of unit variance: error ~ k * 2^-24 * sqrt(k).
            const double tol = 1e-5 * std::sqrt(static_cast<double>(s.k)) * (1 + std::abs(want));
            ASSERT_NEAR(y[i * s.n + j], want, tol) << "at " << i << ", " << j;
          }
      }
  }
}

}  // namespace
}  // namespace flashserve::model::cpu

#endif  // FLASHSERVE_WITH_BLAS
