// The block products of the CPU path (S^T = K Q^T and O += P V per key block), float32, with a
// register-blocked AVX-512 kernel picked at run time where the CPU has it and a portable loop
// elsewhere. Why our own kernel rather than cblas_sgemm: docs/cpu-path.md (Debian's OpenBLAS
// 0.3.21 runs its SSE3 "Prescott" kernels on CPUs newer than it knows, and packs both operands on
// every call, which at these block sizes costs as much as the product).
#pragma once

#include <cstdint>

namespace flashserve::attention {

// C[i][n] = (accumulate ? C[i][n] : 0) + sum_k A(i, k) * B[k][n]  for i < M, n < N, k < K, where
// A(i, k) = a[i * a_row + k * a_col] (any strides: A's elements are broadcast one at a time, so
// one kernel reads key rows straight from the K tensor and the probabilities column-wise), B has
// contiguous rows of stride ldb, C rows of stride ldc. Only the M x N elements of C are touched;
// with accumulate = false C's prior contents (NaN included) are never read. Deterministic: each
// C element sums over k in order, whatever the ISA.
void block_gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_row, int64_t a_col,
                const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate);

enum class CpuIsa { kPortable, kAvx512 };
// The kernel block_gemm runs: kAvx512 when the CPU and OS support AVX-512F, unless forced.
CpuIsa cpu_isa();
// Tests run both kernels on one machine; forcing kAvx512 where the CPU lacks it is ignored.
void force_cpu_isa(CpuIsa isa);
const char* cpu_isa_name(CpuIsa isa);

}  // namespace flashserve::attention
