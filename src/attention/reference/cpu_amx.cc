// cpu_amx.h. Tiles: C in tmm0-3 (a 32 x 32 block of C as 2 x 2 tiles), A in tmm4-5, B in tmm6-7;
// every tile 16 rows x 64 bytes. The tile configuration is loaded inside block_gemm_amx itself:
// with it in a separate function GCC 12 dropped the stores that fill the configuration (the
// builtin is not seen to read its argument) and the first tileloadd raised SIGILL.
#include "attention/reference/cpu_amx.h"

#include <algorithm>
#include <cstring>

#include "common/half.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define FS_AMX 1
#else
#define FS_AMX 0
#endif

namespace flashserve::attention {
namespace {

#if FS_AMX
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

bool probe() {
  __builtin_cpu_init();
  // CPUID leaf 7 (clang 14's __builtin_cpu_supports knows no AMX names): subleaf 0 EDX bits 22
  // (AMX-BF16) and 24 (AMX-TILE), EBX bit 31 (AVX512VL); subleaf 1 EAX bit 5 (AVX512-BF16).
  unsigned a0, b0, c0, d0, a1, b1, c1, d1;
  if (!__get_cpuid_count(7, 0, &a0, &b0, &c0, &d0) || !__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1))
    return false;
  if (!(d0 & (1u << 22)) || !(d0 & (1u << 24)) || !(b0 & (1u << 31)) || !(a1 & (1u << 5)))
    return false;
  if (!__builtin_cpu_supports("avx512f")) return false;
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG and XTILEDATA enabled by the OS
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

}  // namespace

bool amx_available() {
#if FS_AMX
  static const bool ok = probe();
  return ok;
#else
  return false;
#endif
}

#if FS_AMX
__attribute__((target("amx-tile,amx-bf16"))) void block_gemm_amx(int64_t M, int64_t N, int64_t K,
                                                                 const uint16_t* a, int64_t lda,
                                                                 const uint16_t* b, int64_t ldb,
                                                                 float* c, int64_t ldc,
                                                                 bool accumulate) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
  const int64_t sc = ldc * 4, sa = lda * 2, sb = ldb * 2;  // strides in bytes
  for (int64_t i = 0; i < M; i += 32)
    for (int64_t n = 0; n < N; n += 32) {
      float* c00 = c + i * ldc + n;
      float* c10 = c00 + 16 * ldc;
      if (accumulate) {
        _tile_loadd(0, c00, sc);
        _tile_loadd(1, c00 + 16, sc);
        _tile_loadd(2, c10, sc);
        _tile_loadd(3, c10 + 16, sc);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int64_t k = 0; k < K; k += 32) {
        _tile_loadd(4, a + i * lda + k, sa);
        _tile_loadd(5, a + (i + 16) * lda + k, sa);
        _tile_loadd(6, b + (k / 2) * ldb + 2 * n, sb);
        _tile_loadd(7, b + (k / 2) * ldb + 2 * (n + 16), sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c00, sc);
      _tile_stored(1, c00 + 16, sc);
      _tile_stored(2, c10, sc);
      _tile_stored(3, c10 + 16, sc);
    }
  _tile_release();
}
#else
void block_gemm_amx(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t,
                    float*, int64_t, bool) {}
#endif

#if FS_AMX
// 16 x 16 blocks transposed in registers (unpack, then shuffles of 32-bit elements and of 128-bit
// lanes), rounded to bf16 by vcvtneps2bf16 (every AMX CPU has AVX512-BF16). The scalar loop took
// as long as the AMX products, a gather per 16 keys longer still (perf). Reads s rows j < nb and
// columns i0 .. i0 + 15 for i0 < rows (so lds >= round_up(rows, 16)); writes p rows up to
// round_up(rows, 16).
__attribute__((target("avx512f,avx512bf16"))) void transpose_avx512(const float* s, int64_t lds,
                                                                    int64_t nb, int64_t rows,
                                                                    uint16_t* p, int64_t ldp,
                                                                    int64_t nb_pad) {
  for (int64_t i0 = 0; i0 < rows; i0 += 16)
    for (int64_t j0 = 0; j0 < nb_pad; j0 += 16) {
      __m512 r[16], t[16], u[16];
      for (int k = 0; k < 16; ++k)
        r[k] = j0 + k < nb ? _mm512_loadu_ps(s + (j0 + k) * lds + i0) : _mm512_setzero_ps();
      for (int k = 0; k < 8; ++k) {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
      }
      // u[4k + m], lane L: element 4L + m of rows 4k .. 4k + 3.
      for (int k = 0; k < 4; ++k) {
        u[4 * k + 0] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
        u[4 * k + 1] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
        u[4 * k + 2] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
        u[4 * k + 3] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
      }
      // Column 4L + m of the block = lane L of u[m], u[4 + m], u[8 + m], u[12 + m].
      for (int m = 0; m < 4; ++m) {
        const __m512 x0 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x44);
        const __m512 x1 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xEE);
        const __m512 y0 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x44);
        const __m512 y1 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xEE);
        const __m512 col[4] = {
            _mm512_shuffle_f32x4(x0, y0, 0x88), _mm512_shuffle_f32x4(x0, y0, 0xDD),
            _mm512_shuffle_f32x4(x1, y1, 0x88), _mm512_shuffle_f32x4(x1, y1, 0xDD)};
        for (int L = 0; L < 4; ++L)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + (i0 + 4 * L + m) * ldp + j0),
                              (__m256i)_mm512_cvtneps_pbh(col[L]));
      }
    }
}
#endif

void transpose_to_bf16(const float* s, int64_t lds, int64_t nb, int64_t rows, uint16_t* p,
                       int64_t ldp, int64_t nb_pad) {
#if FS_AMX
  if (nb_pad % 16 == 0 && lds % 16 == 0 && amx_available())
    return transpose_avx512(s, lds, nb, rows, p, ldp, nb_pad);
#endif
  // In 16 x 16 blocks so both sides stay in a few cache lines.
  for (int64_t j0 = 0; j0 < nb; j0 += 16)
    for (int64_t i0 = 0; i0 < rows; i0 += 16) {
      const int64_t je = std::min(nb, j0 + 16), ie = std::min(rows, i0 + 16);
      for (int64_t i = i0; i < ie; ++i)
        for (int64_t j = j0; j < je; ++j) p[i * ldp + j] = to_bf16(s[j * lds + i]).bits;
    }
  for (int64_t i = 0; i < rows; ++i) std::fill(p + i * ldp + nb, p + i * ldp + nb_pad, 0);
}

}  // namespace flashserve::attention
