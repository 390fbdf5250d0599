// linear_nt: see cpu_linear.h. The AVX-512 kernel computes a 4 x 4 tile of y at a time: 16
// accumulators of 16 lanes, each step of 16 k loading 4 rows of x and 4 rows of W (8 loads) for
// 16 FMAs, then one horizontal sum per element. Blocks of kKc values of k keep the tile's 8 rows
// (32 KiB) in L1, and blocks of kMc rows of x keep those in L2 while every 4 rows of W pass.
// bf16 weights are widened as they are loaded (a shift: exact), so a step reads half the bytes.
#include "model/cpu_linear.h"

#include <algorithm>

#include "attention/reference/cpu_gemm.h"
#include "common/half.h"

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

inline float widen(float v) {
  return v;
}
inline float widen(uint16_t bf16_bits) {
  return to_float(bf16_t{bf16_bits});
}

template <typename W>
void linear_portable(int64_t m, int64_t n, int64_t K, const float* x, int64_t ldx, const W* w,
                     int64_t ldw, float* y, int64_t ldy, bool accumulate) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s += x[i * ldx + k] * widen(w[j * ldw + k]);
      y[i * ldy + j] = accumulate ? y[i * ldy + j] + s : s;
    }
}

#if FLASHSERVE_HAVE_AVX512_LINEAR
#define FS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

// 16 weights from k on (masked lanes 0), as float32.
FS_AVX512 __attribute__((always_inline)) inline __m512 load_w(const float* w, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, w);
}
FS_AVX512 __attribute__((always_inline)) inline __m512 load_w(const uint16_t* w, __mmask16 mask) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));  // bf16 is float32's high half
}

// acc[r][c] += x[r, k : k + 16] * w[c, k : k + 16], lane by lane (masked lanes add 0). Every loop
// over r and c is unrolled so that acc lives in registers.
template <int MR, int NR, typename W>
FS_AVX512 __attribute__((always_inline)) inline void step_avx512(__m512 (&acc)[MR][NR],
                                                                 const float* x, int64_t ldx,
                                                                 const W* w, int64_t ldw, int64_t k,
                                                                 __mmask16 mask) {
  __m512 xv[MR];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) xv[r] = _mm512_maskz_loadu_ps(mask, x + r * ldx + k);
#pragma GCC unroll 4
  for (int c = 0; c < NR; ++c) {
    const __m512 wv = load_w(w + c * ldw + k, mask);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
  }
}

// y[r][c] (+)= x[r, :kc] . w[c, :kc] for an MR x NR tile.
template <int MR, int NR, typename W>
FS_AVX512 void tile_avx512(int64_t kc, const float* x, int64_t ldx, const W* w, int64_t ldw,
                           float* y, int64_t ldy, bool accumulate) {
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

template <typename W>
using TileFn = void (*)(int64_t, const float*, int64_t, const W*, int64_t, float*, int64_t, bool);
template <int MR, typename W>
constexpr TileFn<W> kRow[kTile] = {tile_avx512<MR, 1, W>, tile_avx512<MR, 2, W>,
                                   tile_avx512<MR, 3, W>, tile_avx512<MR, 4, W>};
template <typename W>
constexpr const TileFn<W>* kTiles[kTile] = {kRow<1, W>, kRow<2, W>, kRow<3, W>, kRow<4, W>};

template <typename W>
void linear_avx512(int64_t m, int64_t n, int64_t K, const float* x, int64_t ldx, const W* w,
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
          kTiles<W>[mr - 1][nr - 1](kc, x + i * ldx + k0, ldx, w + j * ldw + k0, ldw,
                                    y + i * ldy + j, ldy, acc);
        }
      }
    }
  }
}

bool cpu_has_avx512_bw_vl() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}
#endif

template <typename W>
void linear_any(int64_t m, int64_t n, int64_t K, const float* x, int64_t ldx, const W* w,
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

}  // namespace

bool linear_nt_is_vectorised() {
#if FLASHSERVE_HAVE_AVX512_LINEAR
  static const bool bw_vl = cpu_has_avx512_bw_vl();
  return bw_vl && attention::cpu_isa() >= attention::CpuIsa::kAvx512;
#else
  return false;
#endif
}

void linear_nt(int64_t m, int64_t n, int64_t K, const float* x, int64_t ldx, const float* w,
               int64_t ldw, float* y, int64_t ldy, bool accumulate) {
  linear_any(m, n, K, x, ldx, w, ldw, y, ldy, accumulate);
}

void linear_nt(int64_t m, int64_t n, int64_t K, const float* x, int64_t ldx, const uint16_t* w,
               int64_t ldw, float* y, int64_t ldy, bool accumulate) {
  linear_any(m, n, K, x, ldx, w, ldw, y, ldy, accumulate);
}

}  // namespace flashserve::model::cpu
