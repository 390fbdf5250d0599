// AMX-BF16 block products for bf16 attention on the CPU (opt-in: cpu_use_amx /
// FLASHSERVE_CPU_AMX=1, see docs/cpu-path.md). tdpbf16ps multiplies 16 x 32 bf16 tiles into 16 x 16
// float32 tiles, about 4x the AVX-512 float32 kernel's rate on one core of the build machine.
#pragma once

#include <cstdint>

namespace flashserve::attention {

// The CPU has AMX-BF16, the OS saves the tile state, and this process was granted it (asked for
// once, with arch_prctl(ARCH_REQ_XCOMP_PERM)).
bool amx_available();

// C[i][n] = (accumulate ? C[i][n] : 0) + sum_k A[i][k] B(k, n) for i < M, n < N, k < K, with A
// bf16 rows of stride lda and B(k, n) the pair element k % 2 of the bf16 pair at
// b + (k / 2) * ldb + 2 * n (the layout of pack_bf16_pairs). M, N, K must be multiples of 32.
void block_gemm_amx(int64_t M, int64_t N, int64_t K, const uint16_t* a, int64_t lda,
                    const uint16_t* b, int64_t ldb, float* c, int64_t ldc, bool accumulate);

// p[i][j] = bf16(s[j][i]) (nearest even) for i < rows, j < nb, and 0 for nb <= j < nb_pad: the
// key-major probabilities as the row-major A operand of the P V product.
void transpose_to_bf16(const float* s, int64_t lds, int64_t nb, int64_t rows, uint16_t* p,
                       int64_t ldp, int64_t nb_pad);

}  // namespace flashserve::attention
