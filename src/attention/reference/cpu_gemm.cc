// block_gemm: see cpu_gemm.h. The AVX-512 kernel keeps an MR x (16 * NV) tile of C in registers
// (8 x 32: 16 accumulators, twice what two FMA ports of latency 4 need in flight) and walks k:
// per step NV loads of B's row and MR broadcasts of A, MR * NV FMAs. Strips of 32 columns run
// outermost so a strip of B (K x 32 floats: 16 KiB for K = 128, 32 KiB for a 256-key block) stays
// in L1 while every row block of A streams past it. Column tails use masked loads and stores, so
// B and C are never read or written past N (B may be a view into the caller's tensor).
#include "attention/reference/cpu_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/half.h"

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
#define FS_TAIL(R)                                                               \
  case R:                                                                        \
    micro_avx512<R, NV>(K, ai, a_row, a_col, b, ldb, ci, ldc, tail, accumulate); \
    break;
    FS_TAIL(1)
    FS_TAIL(2)
    FS_TAIL(3)
    FS_TAIL(4) FS_TAIL(5) FS_TAIL(6) FS_TAIL(7)
#undef FS_TAIL
        default : break;
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

// The bf16 kernel: the float32 one's shape with pairs. A step of k multiplies a broadcast pair
// of A by 16 pairs of B per register (vdpbf16ps), so a 8 x 32 tile of C takes 16 instructions
// per pair of k.
template <int MR, int NV>
__attribute__((target("avx512f,avx512bf16"))) inline void micro_bf16(
    int64_t K2, const uint16_t* a, int64_t a_row, int64_t a_col, const uint16_t* b, int64_t ldb,
    float* c, int64_t ldc, __mmask16 tail, bool accumulate) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? tail : __mmask16(0xFFFF);
      acc[r][v] = accumulate ? _mm512_maskz_loadu_ps(m, c + r * ldc + 16 * v) : _mm512_setzero_ps();
    }
  for (int64_t k = 0; k < K2; ++k) {
    __m512i bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
      bv[v] =
          _mm512_maskz_loadu_epi32(v == NV - 1 ? tail : __mmask16(0xFFFF), b + k * ldb + 32 * v);
    const uint16_t* ak = a + k * a_col;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, ak + r * a_row, 4);
      const __m512i x = _mm512_set1_epi32(pair);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v)
        acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)x, (__m512bh)bv[v]);
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
__attribute__((target("avx512f,avx512bf16"))) void rows_bf16(int64_t M, int64_t K2,
                                                             const uint16_t* a, int64_t a_row,
                                                             int64_t a_col, const uint16_t* b,
                                                             int64_t ldb, float* c, int64_t ldc,
                                                             __mmask16 tail, bool accumulate) {
  int64_t i = 0;
  for (; i + kMR <= M; i += kMR)
    micro_bf16<kMR, NV>(K2, a + i * a_row, a_row, a_col, b, ldb, c + i * ldc, ldc, tail,
                        accumulate);
  const uint16_t* ai = a + i * a_row;
  float* ci = c + i * ldc;
  switch (M - i) {
#define FS_TAIL(R)                                                              \
  case R:                                                                       \
    micro_bf16<R, NV>(K2, ai, a_row, a_col, b, ldb, ci, ldc, tail, accumulate); \
    break;
    FS_TAIL(1)
    FS_TAIL(2)
    FS_TAIL(3)
    FS_TAIL(4) FS_TAIL(5) FS_TAIL(6) FS_TAIL(7)
#undef FS_TAIL
        default : break;
  }
}

// Word indices for vpermt2w / vpermw that turn rows into pairs.
struct PairIndex {
  alignas(64) uint16_t lo[32], hi[32], halves[32];
  constexpr PairIndex() : lo(), hi(), halves() {
    for (int i = 0; i < 16; ++i) {
      lo[2 * i] = static_cast<uint16_t>(i), lo[2 * i + 1] = static_cast<uint16_t>(32 + i);
      hi[2 * i] = static_cast<uint16_t>(16 + i), hi[2 * i + 1] = static_cast<uint16_t>(48 + i);
      halves[2 * i] = static_cast<uint16_t>(i), halves[2 * i + 1] = static_cast<uint16_t>(16 + i);
    }
  }
};
constexpr PairIndex kPairIndex;

// Word 2i of the result is word i (+16 for high) of x, word 2i + 1 the same word of y.
__attribute__((target("avx512f,avx512bw"))) inline __m512i interleave_words(__m512i x, __m512i y,
                                                                            bool high) {
  return _mm512_permutex2var_epi16(x, _mm512_load_si512(high ? kPairIndex.hi : kPairIndex.lo), y);
}

__attribute__((target("avx512f,avx512bw"))) void pack_pairs_avx512(const uint16_t* r0,
                                                                   const uint16_t* r1, int64_t n,
                                                                   uint16_t* dst) {
  for (int64_t i = 0; i < n; i += 32) {
    const int64_t w = std::min<int64_t>(32, n - i);
    const __mmask32 m = w == 32 ? ~__mmask32(0) : (__mmask32(1) << w) - 1;
    const __m512i x = _mm512_maskz_loadu_epi16(m, r0 + i);
    const __m512i y = r1 ? _mm512_maskz_loadu_epi16(m, r1 + i) : _mm512_setzero_si512();
    const __mmask16 lo = w >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << w) - 1);
    _mm512_mask_storeu_epi32(dst + 2 * i, lo, interleave_words(x, y, false));
    if (w > 16)
      _mm512_mask_storeu_epi32(dst + 2 * i + 32, static_cast<__mmask16>((1u << (w - 16)) - 1),
                               interleave_words(x, y, true));
  }
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) void pack_float_pairs_avx512(const float* s0,
                                                                                    const float* s1,
                                                                                    int64_t n,
                                                                                    uint16_t* dst) {
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t w = std::min<int64_t>(16, n - i);
    const __mmask16 m = static_cast<__mmask16>((1u << w) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(m, s0 + i);
    const __m512 y = s1 ? _mm512_maskz_loadu_ps(m, s1 + i) : _mm512_setzero_ps();
    // Words 0-15: x rounded, 16-31: y rounded; interleaved into 16 pairs {x[i], y[i]}.
    const __m512i xy = (__m512i)_mm512_cvtne2ps_pbh(y, x);
    _mm512_mask_storeu_epi32(dst + 2 * i, m,
                             _mm512_permutexvar_epi16(_mm512_load_si512(kPairIndex.halves), xy));
  }
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}
bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return cpu_has_avx512() && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
}
#else
bool cpu_has_avx512() {
  return false;
}
bool cpu_has_avx512_bf16() {
  return false;
}
#endif

CpuIsa detect() {
  return cpu_has_avx512_bf16() ? CpuIsa::kAvx512Bf16
         : cpu_has_avx512()    ? CpuIsa::kAvx512
                               : CpuIsa::kPortable;
}
const CpuIsa g_best = detect();
std::atomic<CpuIsa> g_isa{g_best};

}  // namespace

CpuIsa cpu_isa() {
  return g_isa.load(std::memory_order_relaxed);
}

void force_cpu_isa(CpuIsa isa) {
  g_isa.store(std::min(isa, g_best), std::memory_order_relaxed);
}

const char* cpu_isa_name(CpuIsa isa) {
  return isa == CpuIsa::kAvx512Bf16 ? "avx512-bf16"
         : isa == CpuIsa::kAvx512   ? "avx512"
                                    : "portable";
}

void block_gemm_bf16(int64_t M, int64_t N, int64_t K2, const uint16_t* a, int64_t a_row,
                     int64_t a_col, const uint16_t* b, int64_t ldb, float* c, int64_t ldc,
                     bool accumulate) {
  if (M <= 0 || N <= 0) return;
#if FLASHSERVE_HAVE_AVX512_KERNEL
  for (int64_t n0 = 0; n0 < N; n0 += 32) {
    const int64_t w = std::min<int64_t>(32, N - n0);
    const int nv = w > 16 ? 2 : 1;
    const __mmask16 tail = static_cast<__mmask16>((1u << (w - 16 * (nv - 1))) - 1);
    if (nv == 2)
      rows_bf16<2>(M, K2, a, a_row, a_col, b + 2 * n0, ldb, c + n0, ldc, tail, accumulate);
    else
      rows_bf16<1>(M, K2, a, a_row, a_col, b + 2 * n0, ldb, c + n0, ldc, tail, accumulate);
  }
#else
  (void)K2, (void)a, (void)a_row, (void)a_col, (void)b, (void)ldb, (void)c, (void)ldc,
      (void)accumulate;
#endif
}

void pack_bf16_pairs(const uint16_t* r0, const uint16_t* r1, int64_t n, uint16_t* dst) {
#if FLASHSERVE_HAVE_AVX512_KERNEL
  if (cpu_isa() == CpuIsa::kAvx512Bf16) return pack_pairs_avx512(r0, r1, n, dst);
#endif
  for (int64_t i = 0; i < n; ++i) dst[2 * i] = r0[i], dst[2 * i + 1] = r1 ? r1[i] : 0;
}

void pack_float_pairs(const float* s0, const float* s1, int64_t n, uint16_t* dst) {
#if FLASHSERVE_HAVE_AVX512_KERNEL
  if (cpu_isa() == CpuIsa::kAvx512Bf16) return pack_float_pairs_avx512(s0, s1, n, dst);
#endif
  for (int64_t i = 0; i < n; ++i) {
    dst[2 * i] = to_bf16(s0[i]).bits;
    dst[2 * i + 1] = s1 ? to_bf16(s1[i]).bits : 0;
  }
}

void block_gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_row, int64_t a_col,
                const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
#if FLASHSERVE_HAVE_AVX512_KERNEL
  if (cpu_isa() >= CpuIsa::kAvx512)
    return gemm_avx512(M, N, K, a, a_row, a_col, b, ldb, c, ldc, accumulate);
#endif
  gemm_portable(M, N, K, a, a_row, a_col, b, ldb, c, ldc, accumulate);
}

}  // namespace flashserve::attention
