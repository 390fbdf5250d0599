// The CPU runner's building blocks, float32 row-major: the GEMM (model/cpu_linear.h's kernel, or
// a BLAS where the CPU lacks AVX-512), RMSNorm and SiLU-and-multiply, each threaded on the global
// thread pool.
#pragma once

#include <cstdint>
#include <functional>

namespace flashserve::model::cpu {

// A weight matrix [n, k], row-major: float32, or bfloat16 (its bits) as a bf16 checkpoint holds it.
struct Weight {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  Weight(const float* w) : f32(w) {}      // NOLINT: implicit, a float32 matrix is the common case
  Weight(const uint16_t* w) : bf16(w) {}  // NOLINT
};

// y[m, n] = (accumulate ? y : 0) + x[m, k] W[n, k]^T  (W in Hugging Face's [out, in] layout),
// threaded over column blocks on the global pool.
void linear(const float* x, Weight w, float* y, int64_t m, int64_t n, int64_t k,
            bool accumulate = false);

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for `rows` rows of `width` (in place allowed).
void rms_norm(const float* x, const float* weight, float* out, int64_t rows, int64_t width,
              double eps);

// out[r, i] = silu(gu[r, i]) * gu[r, width + i]: the gate and up halves of one fused GEMM's rows.
void silu_mul(const float* gu, float* out, int64_t rows, int64_t width);

// Runs fn(begin, end) over [0, rows) in chunks on the global pool (inline when small).
void for_rows(int64_t rows, int64_t cost_per_row,
              const std::function<void(int64_t begin, int64_t end)>& fn);

}  // namespace flashserve::model::cpu
