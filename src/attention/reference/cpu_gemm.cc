// block_gemm: see cpu_gemm.h. The AVX-512 kernel keeps an MR x (16 * NV) tile of C in registers
// (8 x 32: 16 accumulators, twice what two FMA ports of latency 4 need in flight) and walks k:
// per step NV loads of B's row and MR broadcasts of A, MR * NV FMAs. Strips of 32 columns run
// outermost so a strip of B (K x 32 floats: 16 KiB for K = 128, 32 KiB for a 256-key block) stays
// in L1 while every row block of A streams past it. Column tails use masked loads and stores, so
// B and C are never read or written past N (B may be a view into the caller's tensor).
#include "attention/reference/cpu_gemm.h"

#include <algorithm>
#include <atomic>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FLASHSERVE_HAVE_AVX512_KERNEL 1
#else
#define FLASHSERVE_HAVE_AVX512_KERNEL 0
#endif

namespace flashserve::attention {
namespace {

void gemm_portable(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_row, int64_t a_col,
                   const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < M; ++i) {
    float* ci = c + i * ldc;
    if (!accumulate) std::fill(ci, ci + N, 0.0f);
    for (int64_t k = 0; k < K; ++k) {
      const float x = a[i * a_row + k * a_col];
      const float* bk = b + k * ldb;
      for (int64_t n = 0; n < N; ++n) ci[n] += x * bk[n];  // vectorises over n
    }
  }
}

#if FLASHSERVE_HAVE_AVX512_KERNEL
constexpr int kMR = 8;

template <int MR, int NV>
__attribute__((target("avx512f"))) inline void micro_avx512(int64_t K, const float* a,
                                                            int64_t a_row, int64_t a_col,
                                                            const float* b, int64_t ldb, float* c,
                                                            int64_t ldc, __mmask16 tail,
                                                            bool accumulate) {
  // Every loop over r and v is unrolled so that acc lives in registers (at -O2 GCC keeps it on
  // the stack otherwise: 2.5x slower).
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? tail : __mmask16(0xFFFF);
      acc[r][v] = accumulate ? _mm512_maskz_loadu_ps(m, c + r * ldc + 16 * v) : _mm512_setzero_ps();
    }
  for (int64_t k = 0; k < K; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
      bv[v] = _mm512_maskz_loadu_ps(v == NV - 1 ? tail : __mmask16(0xFFFF), b + k * ldb + 16 * v);
    const float* ak = a + k * a_col;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 x = _mm512_set1_ps(ak[r * a_row]);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(x, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
      _mm512_mask_storeu_ps(c + r * ldc + 16 * v, v == NV - 1 ? tail : __mmask16(0xFFFF),
                            acc[r][v]);
}

template <int NV>
__attribute__((target("avx512f"))) void rows_avx512(int64_t M, int64_t K, const float* a,
                                                    int64_t a_row, int64_t a_col, const float* b,
                                                    int64_t ldb, float* c, int64_t ldc,
                                                    __mmask16 tail, bool accumulate) {
  int64_t i = 0;
  for (; i + kMR <= M; i += kMR)
    micro_avx512<kMR, NV>(K, a + i * a_row, a_row, a_col, b, ldb, c + i * ldc, ldc, tail,
                          accumulate);
  const float* ai = a + i * a_row;
  float* ci = c + i * ldc;
  switch (M - i) {  // the last rows, fewer than kMR
#define FS_TAIL(R)                                                                  \
  case R:                                                                           \
    micro_avx512<R, NV>(K, ai, a_row, a_col, b, ldb, ci, ldc, tail, accumulate); \
    break;
    FS_TAIL(1) FS_TAIL(2) FS_TAIL(3) FS_TAIL(4) FS_TAIL(5) FS_TAIL(6) FS_TAIL(7)
#undef FS_TAIL
    default:
      break;
  }
}

void gemm_avx512(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_row, int64_t a_col,
                 const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  for (int64_t n0 = 0; n0 < N; n0 += 32) {
    const int64_t w = std::min<int64_t>(32, N - n0);
    const int nv = w > 16 ? 2 : 1;
    const __mmask16 tail = static_cast<__mmask16>((1u << (w - 16 * (nv - 1))) - 1);
    if (nv == 2)
      rows_avx512<2>(M, K, a, a_row, a_col, b + n0, ldb, c + n0, ldc, tail, accumulate);
    else
      rows_avx512<1>(M, K, a, a_row, a_col, b + n0, ldb, c + n0, ldc, tail, accumulate);
  }
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}
#else
bool cpu_has_avx512() { return false; }
#endif

CpuIsa detect() { return cpu_has_avx512() ? CpuIsa::kAvx512 : CpuIsa::kPortable; }
std::atomic<CpuIsa> g_isa{detect()};

}  // namespace

CpuIsa cpu_isa() { return g_isa.load(std::memory_order_relaxed); }

void force_cpu_isa(CpuIsa isa) {
  if (isa == CpuIsa::kAvx512 && !cpu_has_avx512()) return;
  g_isa.store(isa, std::memory_order_relaxed);
}

const char* cpu_isa_name(CpuIsa isa) { return isa == CpuIsa::kAvx512 ? "avx512" : "portable"; }

void block_gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_row, int64_t a_col,
                const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
#if FLASHSERVE_HAVE_AVX512_KERNEL
  if (cpu_isa() == CpuIsa::kAvx512)
    return gemm_avx512(M, N, K, a, a_row, a_col, b, ldb, c, ldc, accumulate);
#endif
  gemm_portable(M, N, K, a, a_row, a_col, b, ldb, c, ldc, accumulate);
}

}  // namespace flashserve::attention
