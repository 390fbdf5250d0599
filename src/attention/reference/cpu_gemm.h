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

// bfloat16 products with float32 accumulation (AVX512-BF16's vdpbf16ps: two products per lane
// and instruction, twice the float32 FMA rate, and half the bytes). Operands come in pairs along
// k (what the instruction multiplies together):
//   C[i][n] = (accumulate ? C[i][n] : 0) + sum_{k < K2} A(i, k) . B(k, n)
// where A(i, k) is the pair of bf16 at a + i * a_row + k * a_col and B(k, n) the pair at
// b + k * ldb + 2 * n (strides in bf16 elements). Only where cpu_isa() is kAvx512Bf16.
void block_gemm_bf16(int64_t M, int64_t N, int64_t K2, const uint16_t* a, int64_t a_row,
                     int64_t a_col, const uint16_t* b, int64_t ldb, float* c, int64_t ldc,
                     bool accumulate);

// Packs rows r0 and r1 (n bf16 each; r1 null: zeros) into n pairs {r0[n], r1[n]} at dst: the B
// operand of block_gemm_bf16 from two value rows.
void pack_bf16_pairs(const uint16_t* r0, const uint16_t* r1, int64_t n, uint16_t* dst);
// Rounds rows s0 and s1 (n floats each; s1 null: zeros) to bf16 (nearest even) as n pairs at dst:
// the probabilities of two keys as the A operand of block_gemm_bf16.
void pack_float_pairs(const float* s0, const float* s1, int64_t n, uint16_t* dst);

// Capability levels, each including the previous one.
enum class CpuIsa { kPortable, kAvx512, kAvx512Bf16 };
// The kernels in use: the highest level the CPU and OS support, unless forced lower.
CpuIsa cpu_isa();
// Tests run every level on one machine; a level above what the CPU has is capped to it.
void force_cpu_isa(CpuIsa isa);
const char* cpu_isa_name(CpuIsa isa);

}  // namespace flashserve::attention
