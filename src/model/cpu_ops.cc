#include "model/cpu_ops.h"

#if FLASHSERVE_WITH_BLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <cmath>

#include "common/thread_pool.h"
#include "flashserve/error.h"

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

void linear(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k, float beta) {
  if (m == 0 || n == 0) return;
#if FLASHSERVE_WITH_BLAS
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, x, static_cast<int>(k), w, static_cast<int>(k), beta, y,
              static_cast<int>(n));
#else
  (void)x, (void)w, (void)y, (void)k, (void)beta;
  throw Error(ErrorKind::kUnsupported, "cpu", "built without OpenBLAS");
#endif
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
