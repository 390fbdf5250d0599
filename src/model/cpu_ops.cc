#include "model/cpu_ops.h"

#if FLASHSERVE_WITH_BLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <cmath>
#include <mutex>

#include "common/thread_pool.h"
#include "flashserve/error.h"
#include "model/cpu_linear.h"

namespace flashserve::model::cpu {

void for_rows(int64_t rows, int64_t cost_per_row,
              const std::function<void(int64_t begin, int64_t end)>& fn) {
  // Below ~64k operations a wake-up of the pool costs more than it saves.
  const int64_t per_chunk = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, cost_per_row));
  const int64_t chunks = (rows + per_chunk - 1) / per_chunk;
  if (chunks <= 1) {
    if (rows > 0) fn(0, rows);
    return;
  }
  ThreadPool::global().parallel_for(
      chunks, [&](int64_t c, int) { fn(c * per_chunk, std::min(rows, (c + 1) * per_chunk)); });
}

// The GEMM runs on our thread pool: each worker computes a block of output columns (rows of W)
// with a single-threaded kernel, ours (model/cpu_linear.h) where the CPU has AVX-512 or W is
// bf16, else OpenBLAS's sgemm. OpenBLAS is held to one thread: left to its own pthreads, its idle
// threads spin between calls and starve the pool's workers (and the engine's) on a machine with
// other work (`flashserve run` on two loaded cores took 34 s instead of 3 s).
void linear(const float* x, Weight w, float* y, int64_t m, int64_t n, int64_t k, bool accumulate) {
  if (m == 0 || n == 0) return;
  [[maybe_unused]] const bool ours = w.bf16 || linear_nt_is_vectorised();
#if FLASHSERVE_WITH_BLAS
  static std::once_flag single_threaded;
  std::call_once(single_threaded, [] { openblas_set_num_threads(1); });
#endif
  const auto gemm = [&](int64_t n0, int64_t n1) {
    if (w.bf16) return linear_nt(m, n1 - n0, k, x, k, w.bf16 + n0 * k, k, y + n0, n, accumulate);
#if FLASHSERVE_WITH_BLAS
    if (!ours)
      return cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                         static_cast<int>(n1 - n0), static_cast<int>(k), 1.0f, x,
                         static_cast<int>(k), w.f32 + n0 * k, static_cast<int>(k),
                         accumulate ? 1.0f : 0.0f, y + n0, static_cast<int>(n));
#endif
    linear_nt(m, n1 - n0, k, x, k, w.f32 + n0 * k, k, y + n0, n, accumulate);
  };
  // Blocks of whole 16-column groups, each worth a wake-up of the pool: ~1 M units of work, a
  // FLOP being one and an element of W four (a decode step's GEMM is bound by reading W).
  ThreadPool& pool = ThreadPool::global();
  const int64_t groups = (n + 15) / 16;
  const int64_t by_work = (2 * m * n * k + 4 * n * k) >> 20;
  const int64_t parts = std::clamp<int64_t>(std::min<int64_t>(groups, by_work), 1, pool.size());
  if (parts == 1) return gemm(0, n);
  pool.parallel_for(parts, [&](int64_t p, int) {
    gemm(std::min(n, groups * p / parts * 16), std::min(n, groups * (p + 1) / parts * 16));
  });
}

void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t width,
              double eps) {
  for_rows(rows, width, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * width;
      float* o = out + r * width;
      double ss = 0;
      for (int64_t i = 0; i < width; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(width) + eps));
      for (int64_t i = 0; i < width; ++i) o[i] = xr[i] * inv * weight[i];
    }
  });
}

void silu_mul(const float* gu, float* out, int64_t rows, int64_t width) {
  for_rows(rows, width * 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gu + r * 2 * width;
      const float* u = g + width;
      float* o = out + r * width;
      for (int64_t i = 0; i < width; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
  });
}

}  // namespace flashserve::model::cpu
