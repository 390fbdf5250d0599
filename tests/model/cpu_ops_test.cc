// The CPU runner's GEMM against a float64 loop: the kernel alone (model/cpu_linear.h) with padded
// strides, both its AVX-512 tiles and its portable loop, float32 and bf16 weights, and cpu::linear
// over the thread pool (our kernel, or OpenBLAS where the portable level is forced), on every shape
// class the tiling and the split meet: tiles of 1-4 rows and columns, k not a multiple of 16 or
// past one k block, more rows than one row block, fewer 16-column groups than workers, accumulating
// or not. Outputs are poisoned with NaN where they are not accumulated into, and padding must stay
// untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attention/reference/cpu_gemm.h"
#include "common/half.h"
#include "common/thread_pool.h"
#include "model/cpu_linear.h"
#include "model/cpu_ops.h"

namespace flashserve::model::cpu {
namespace {

using attention::CpuIsa;

#if FLASHSERVE_WITH_BLAS
constexpr bool kBlas = true;
#else
constexpr bool kBlas = false;
#endif

struct Shape {
  int64_t m, n, k;
};
const Shape kShapes[] = {{1, 1, 1},      {3, 5, 7},      {1, 4096, 256}, {2, 33, 1024},
                         {4, 4, 1040},   {64, 300, 128}, {17, 1000, 96}, {300, 21, 2100},
                         {128, 48, 512}, {5, 17, 2048}};

struct Isa {
  explicit Isa(CpuIsa isa) { attention::force_cpu_isa(isa); }
  ~Isa() { attention::force_cpu_isa(CpuIsa::kAvx512Bf16); }  // capped to what the CPU has
};
struct PoolSize {
  explicit PoolSize(int workers) { ThreadPool::set_global_workers(workers); }
  ~PoolSize() { ThreadPool::set_global_workers(0); }
};

// Random operands with row strides past their widths (pad elements), and the float64 product. W's
// values are bf16-representable, so that one case serves float32 weights and bf16 ones (wb).
struct Case {
  Shape s;
  int64_t ldx, ldw, ldy;
  std::vector<float> x, w, y0;
  std::vector<uint16_t> wb;
  Case(Shape shape, int64_t pad, std::mt19937& rng)
      : s(shape), ldx(shape.k + pad), ldw(shape.k + pad), ldy(shape.n + pad) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    x.resize(s.m * ldx), w.resize(s.n * ldw), y0.resize(s.m * ldy);
    for (float& v : x) v = normal(rng);
    for (float& v : w) {
      wb.push_back(to_bf16(normal(rng)).bits);
      v = to_float(bf16_t{wb.back()});
    }
    for (float& v : y0) v = normal(rng);
  }
  Weight weight(bool bf16) const { return bf16 ? Weight(wb.data()) : Weight(w.data()); }
  // y as a call must leave it: pads untouched, every element within float32 rounding of the sum.
  void check(const std::vector<float>& y, bool accumulate) const {
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double want = accumulate ? y0[i * ldy + j] : 0.0;
        for (int64_t l = 0; l < s.k; ++l)
          want += static_cast<double>(x[i * ldx + l]) * w[j * ldw + l];
        // float32 sums of k unit-variance products: error ~ 2^-24 k^1.5 at the very worst.
        const double tol = 1e-5 * std::sqrt(static_cast<double>(s.k)) * (1 + std::abs(want));
        ASSERT_NEAR(y[i * ldy + j], want, tol) << "at " << i << ", " << j;
      }
      for (int64_t j = s.n; j < ldy; ++j)
        ASSERT_TRUE(std::isinf(y[i * ldy + j])) << "pad " << i << ", " << j << " written";
    }
  }
  std::vector<float> poisoned(bool accumulate) const {
    std::vector<float> y = y0;
    for (int64_t i = 0; i < s.m; ++i) {
      if (!accumulate)
        std::fill(y.begin() + i * ldy, y.begin() + i * ldy + s.n,
                  std::numeric_limits<float>::quiet_NaN());
      std::fill(y.begin() + i * ldy + s.n, y.begin() + (i + 1) * ldy,
                std::numeric_limits<float>::infinity());
    }
    return y;
  }
};

TEST(CpuLinear, KernelMatchesAFloat64LoopWithPaddedStrides) {
  std::mt19937 rng(20261201);
  for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx512}) {
    Isa forced(isa);
    SCOPED_TRACE(linear_nt_is_vectorised() ? "avx512" : "portable");
    for (const Shape& s : kShapes)
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(testing::Message() << "m " << s.m << " n " << s.n << " k " << s.k
                                        << (accumulate ? " accumulate" : ""));
        const Case c(s, 3, rng);
        for (bool bf16 : {false, true}) {
          SCOPED_TRACE(bf16 ? "bf16 W" : "float32 W");
          std::vector<float> y = c.poisoned(accumulate);
          if (bf16)
            linear_nt(s.m, s.n, s.k, c.x.data(), c.ldx, c.wb.data(), c.ldw, y.data(), c.ldy,
                      accumulate);
          else
            linear_nt(s.m, s.n, s.k, c.x.data(), c.ldx, c.w.data(), c.ldw, y.data(), c.ldy,
                      accumulate);
          c.check(y, accumulate);
        }
      }
  }
}

TEST(CpuLinear, ThreadedLinearMatchesAFloat64LoopOnEveryPool) {
  if (!linear_nt_is_vectorised() && !kBlas) GTEST_SKIP() << "skipped: no AVX-512 and no OpenBLAS";
  std::mt19937 rng(7);
  for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx512}) {
    if (isa == CpuIsa::kPortable && !kBlas) continue;  // linear() takes OpenBLAS there
    Isa forced(isa);
    for (int workers : {1, 2, 3, 7}) {
      PoolSize pool(workers);
      for (const Shape& s : kShapes)
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(testing::Message()
                       << (linear_nt_is_vectorised() ? "ours" : "OpenBLAS") << ", " << workers
                       << " workers, m " << s.m << " n " << s.n << " k " << s.k
                       << (accumulate ? " accumulate" : ""));
          const Case c(s, 0, rng);
          for (bool bf16 : {false, true}) {
            SCOPED_TRACE(bf16 ? "bf16 W" : "float32 W");
            std::vector<float> y = c.poisoned(accumulate);
            linear(c.x.data(), c.weight(bf16), y.data(), s.m, s.n, s.k, accumulate);
            c.check(y, accumulate);
          }
        }
    }
  }
}

}  // namespace
}  // namespace flashserve::model::cpu
