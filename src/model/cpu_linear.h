// The CPU runner's GEMM kernel, y = x W^T with W in Hugging Face's [out, in] layout, as dot
// products: both operands are read along k, contiguously, so the weights are used as they are
// loaded (no transposed copy) and a decode step (one row of x) streams W once. Our own kernel
// rather than a BLAS: Debian's OpenBLAS runs its SSE3 "Prescott" kernels on CPUs newer than it
// knows (4 GFLOP/s a core on the build machine's Xeon, docs/cpu-path.md), and its idle threads
// spin. AVX-512 where the CPU has it (attention's cpu_isa(), so tests can force the portable
// loop), a portable loop elsewhere.
#pragma once

#include <cstdint>

namespace flashserve::model::cpu {

// y[i][j] = (accumulate ? y[i][j] : 0) + sum_k x[i * ldx + k] * w[j * ldw + k]  for i < m, j < n,
// k < K. Single-threaded (the caller splits the columns over its threads). Only the m x n
// elements of y are written; without accumulate their prior contents (NaN included) are not read.
// Deterministic: the sum over k runs in one order, whatever the thread count.
void linear_nt(int64_t m, int64_t n, int64_t K, const float* x, int64_t ldx, const float* w,
               int64_t ldw, float* y, int64_t ldy, bool accumulate);
// The same with W in bfloat16 (its bits), widened to float32 as it is read (exactly): half the
// bytes of a float32 W, so a decode step, bound by reading W, takes about half the time.
void linear_nt(int64_t m, int64_t n, int64_t K, const float* x, int64_t ldx, const uint16_t* w,
               int64_t ldw, float* y, int64_t ldy, bool accumulate);

// Whether linear_nt runs its AVX-512 kernel on this CPU (AVX-512 F, BW and VL, and not forced to
// the portable level); else the caller may prefer a BLAS for float32 weights.
bool linear_nt_is_vectorised();

}  // namespace flashserve::model::cpu
