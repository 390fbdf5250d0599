// linear_nt: see cpu_linear.h. The AVX-512 kernel computes a 4 x 4 tile of y at a time: 16
// accumulators of 16 lanes, each step of 16 k loading 4 rows of x and 4 rows of W (8 loads) for
// 16 FMAs, then one horizontal sum per element. Blocks of kKc values of k keep the tile's 8 rows
// (32 KiB) in L1, and blocks of kMc rows of x keep those in L2 while every 4 rows of W pass.
#include "model/cpu_linear.h"

#include <algorithm>

#include "attention/reference/cpu_gemm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FLASHSERVE_HAVE_AVX512_LINEAR 1
#else
#define FLASHSERVE_HAVE_AVX512_LINEAR 0
#endif

namespace flashserve::model::cpu {
namespace {

constexpr int64_t kKc = 1024;  // values of k per pass over a tile
constexpr int64_t kMc = 256;   // rows of x per pass over W
constexpr int kTile = 4;       // rows of x and of W per tile

void linear_portable(int64_t m, int64_t n, int64_t K, const float* x, int64_t ldx, const float* w,
                     int64_t ldw, float* y, int64_t ldy, bool accumulate) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s += x[i * ldx + k] * w[j * ldw + k];
      y[i * ldy + j] = accumulate ? y[i * ldy + j] + s : s;
    }
}

#if FLASHSERVE_HAVE_AVX512_LINEAR
// acc[r][c] += x[r, k : k + 16] * w[c, k : k + 16], lane by lane (masked lanes add 0). Every loop
// over r and c is unrolled so that acc lives in registers.
template <int MR, int NR>
__attribute__((target("avx512f"), always_inline)) inline void step_avx512(
    __m512 (&acc)[MR][NR], const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t k,
    __mmask16 mask) {
  __m512 xv[MR];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) xv[r] = _mm512_maskz_loadu_ps(mask, x + r * ldx + k);
#pragma GCC unroll 4
  for (int c = 0; c < NR; ++c) {
    const __m512 wv = _mm512_maskz_loadu_ps(mask, w + c * ldw + k);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
  }
}

// y[r][c] (+)= x[r, :kc] . w[c, :kc] for an MR x NR tile.
template <int MR, int NR>
__attribute__((target("avx512f"))) void tile_avx512(int64_t kc, const float* x, int64_t ldx,
                                                    const float* w, int64_t ldw, float* y,
                                                    int64_t ldy, bool accumulate) {
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= kc; k += 16) step_avx512<MR, NR>(acc, x, ldx, w, ldw, k, 0xFFFF);
  if (k < kc)
    step_avx512<MR, NR>(acc, x, ldx, w, ldw, k, static_cast<__mmask16>((1u << (kc - k)) - 1));
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < NR; ++c) {
      const float s = _mm512_reduce_add_ps(acc[r][c]);
      float& out = y[r * ldy + c];
      out = accumulate ? out + s : s;
    }
}

using TileFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t,
                        bool);
template <int MR>
constexpr TileFn kRow[kTile] = {tile_avx512<MR, 1>, tile_avx512<MR, 2>, tile_avx512<MR, 3>,
                                tile_avx512<MR, 4>};
constexpr const TileFn* kTiles[kTile] = {kRow<1>, kRow<2>, kRow<3>, kRow<4>};

void linear_avx512(int64_t m, int64_t n, int64_t K, const float* x, int64_t ldx, const float* w,
                   int64_t ldw, float* y, int64_t ldy, bool accumulate) {
  for (int64_t i0 = 0; i0 < m; i0 += kMc) {
    const int64_t i1 = std::min(m, i0 + kMc);
    for (int64_t k0 = 0; k0 < K; k0 += kKc) {
      const int64_t kc = std::min(kKc, K - k0);
      const bool acc = accumulate || k0 > 0;
      for (int64_t j = 0; j < n; j += kTile) {
        const int nr = static_cast<int>(std::min<int64_t>(kTile, n - j));
        for (int64_t i = i0; i < i1; i += kTile) {
          const int mr = static_cast<int>(std::min<int64_t>(kTile, i1 - i));
          kTiles[mr - 1][nr - 1](kc, x + i * ldx + k0, ldx, w + j * ldw + k0, ldw, y + i * ldy + j,
                                 ldy, acc);
        }
      }
    }
  }
}
#endif

}  // namespace

bool linear_nt_is_vectorised() {
#if FLASHSERVE_HAVE_AVX512_LINEAR
  return attention::cpu_isa() >= attention::CpuIsa::kAvx512;
#else
  return false;
#endif
}

void linear_nt(int64_t m, int64_t n, int64_t K, const float* x, int64_t ldx, const float* w,
               int64_t ldw, float* y, int64_t ldy, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  if (K <= 0) {  // an empty sum
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill(y + i * ldy, y + i * ldy + n, 0.0f);
    return;
  }
#if FLASHSERVE_HAVE_AVX512_LINEAR
  if (linear_nt_is_vectorised()) return linear_avx512(m, n, K, x, ldx, w, ldw, y, ldy, accumulate);
#endif
  linear_portable(m, n, K, x, ldx, w, ldw, y, ldy, accumulate);
}

}  // namespace flashserve::model::cpu
