// block_softmax and convert_row: see block_softmax.h. Each has one body, compiled twice: for
// AVX-512 (16 lanes, F16C conversions) and for the baseline ISA, picked by cpu_isa() like the
// block products, so forcing the portable path in a test forces all of it.
#include "attention/reference/block_softmax.h"

#include <cmath>
#include <limits>

#include "attention/reference/cpu_gemm.h"
#include "attention/reference/online_softmax.h"
#include "attention/score_mod.h"
#include "common/float8.h"
#include "common/half.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FS_AVX512 1
#else
#define FS_AVX512 0
#endif

namespace flashserve::attention {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// modify_scores (block_softmax.h): scale, then softcap, then ALiBi's bias, each a loop across
// rows (tanh_float is branch-free so that the cap's loop vectorises too).
__attribute__((always_inline)) inline void modify_body(float* s0, int64_t ld, int64_t nb,
                                                       int64_t rows, int64_t j0, float scale,
                                                       float softcap, const float* __restrict slope,
                                                       const float* __restrict pos) {
  if (softcap > 0.0f) {
    const float in = scale / softcap;
    for (int64_t j = 0; j < nb; ++j) {
      float* __restrict s = s0 + j * ld;
      for (int64_t i = 0; i < rows; ++i) s[i] = softcap * tanh_float(s[i] * in);
    }
  } else if (scale != 1.0f) {
    for (int64_t j = 0; j < nb; ++j) {
      float* __restrict s = s0 + j * ld;
      for (int64_t i = 0; i < rows; ++i) s[i] *= scale;
    }
  }
  if (slope != nullptr)
    for (int64_t j = 0; j < nb; ++j) {
      float* __restrict s = s0 + j * ld;
      const float key = static_cast<float>(j0 + j);
      for (int64_t i = 0; i < rows; ++i) s[i] -= slope[i] * std::fabs(pos[i] - key);
    }
}

__attribute__((always_inline)) inline void softmax_body(const ScoreBlock& b, float* __restrict m,
                                                        float* __restrict l, float* __restrict corr,
                                                        float* __restrict mu) {
  const int64_t rows = b.rows;
  float scale = b.scale;
  if (b.softcap > 0.0f || b.slope != nullptr) {  // a pass of its own: the plain path pays nothing
    modify_scores(b.s, b.ld, b.nb, rows, b.j0, scale, b.softcap, b.slope, b.pos);
    scale = 1.0f;
  }
  if (!b.all_visible)
    for (int64_t j = 0; j < b.nb; ++j) {
      float* __restrict s = b.s + j * b.ld;
      const int64_t key = b.j0 + j;
      for (int64_t i = 0; i < rows; ++i)
        s[i] = (key >= b.first_key[i] && key < b.end_key[i]) ? s[i] * scale : kNegInf;
    }
  else if (scale != 1.0f)
    for (int64_t j = 0; j < b.nb; ++j) {
      float* __restrict s = b.s + j * b.ld;
      for (int64_t i = 0; i < rows; ++i) s[i] *= scale;
    }
  // The block's max per row; NaN compares false, so it is skipped here and poisons l below.
  for (int64_t i = 0; i < rows; ++i) mu[i] = kNegInf;
  for (int64_t j = 0; j < b.nb; ++j) {
    const float* __restrict s = b.s + j * b.ld;
    for (int64_t i = 0; i < rows; ++i) mu[i] = s[i] > mu[i] ? s[i] : mu[i];
  }
  for (int64_t i = 0; i < rows; ++i) {
    float c = 1.0f;
    if (mu[i] > m[i]) {
      c = std::exp2(m[i] - mu[i]);  // 0 when m was -inf
      l[i] *= c;
      m[i] = mu[i];
    }
    corr[i] = c;
    // A row that has seen nothing yet (m = -inf) subtracts 0: its -inf scores give 0 and a NaN
    // score NaN (exp2(-inf - -inf) would be NaN for every masked key).
    mu[i] = m[i] == kNegInf ? 0.0f : m[i];
  }
  for (int64_t j = 0; j < b.nb; ++j) {
    float* __restrict s = b.s + j * b.ld;
    for (int64_t i = 0; i < rows; ++i) {
      const float p = exp2_nonpositive(s[i] - mu[i]);
      s[i] = p;
      l[i] += p;
    }
  }
}

inline float as_float(float x) {
  return x;
}
inline float as_float(bf16_t x) {
  return to_float(x);
}
inline float as_float(fp16_t x) {
  return to_float(x);
}
inline float as_float(fp8_e4m3_t x) {
  return to_float(x);  // a table load; the descale is `mul`
}

template <typename T>
__attribute__((always_inline)) inline void convert_scalar(const T* __restrict src, int64_t n,
                                                          float mul, float* __restrict dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = as_float(src[i]) * mul;
}

void block_softmax_portable(const ScoreBlock& b, float* m, float* l, float* corr, float* mu) {
  softmax_body(b, m, l, corr, mu);
}

void modify_portable(float* s, int64_t ld, int64_t nb, int64_t rows, int64_t j0, float scale,
                     float softcap, const float* slope, const float* pos) {
  modify_body(s, ld, nb, rows, j0, scale, softcap, slope, pos);
}

#if FS_AVX512
__attribute__((target("avx512f"))) void block_softmax_avx512(const ScoreBlock& b, float* m,
                                                             float* l, float* corr, float* mu) {
  softmax_body(b, m, l, corr, mu);
}

__attribute__((target("avx512f"))) void modify_avx512(float* s, int64_t ld, int64_t nb,
                                                      int64_t rows, int64_t j0, float scale,
                                                      float softcap, const float* slope,
                                                      const float* pos) {
  modify_body(s, ld, nb, rows, j0, scale, softcap, slope, pos);
}

__attribute__((target("avx512f"))) void convert_avx512(const void* src, DType dtype, int64_t n,
                                                       float mul, float* dst) {
  const __m512 vm = _mm512_set1_ps(mul);
  int64_t i = 0;
  switch (dtype) {
    case DType::kFloat16: {
      const uint16_t* p = static_cast<const uint16_t*>(src);
      for (; i + 16 <= n; i += 16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
        _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_cvtph_ps(h), vm));
      }
      convert_scalar(static_cast<const fp16_t*>(src) + i, n - i, mul, dst + i);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t* p = static_cast<const uint16_t*>(src);
      for (; i + 16 <= n; i += 16) {  // bf16 is the top half of a float
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
        const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
        _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_castsi512_ps(w), vm));
      }
      convert_scalar(static_cast<const bf16_t*>(src) + i, n - i, mul, dst + i);
      break;
    }
    case DType::kFloat8E4M3: {
      const uint8_t* p = static_cast<const uint8_t*>(src);
      for (; i + 16 <= n; i += 16) {  // 16 codes widened to indices into the decode table
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
        const __m512 x = _mm512_i32gather_ps(_mm512_cvtepu8_epi32(c), kE4m3Table.data(), 4);
        _mm512_storeu_ps(dst + i, _mm512_mul_ps(x, vm));
      }
      convert_scalar(static_cast<const fp8_e4m3_t*>(src) + i, n - i, mul, dst + i);
      break;
    }
    default: {
      const float* p = static_cast<const float*>(src);
      for (; i < n; ++i) dst[i] = p[i] * mul;
      break;
    }
  }
}
#endif

}  // namespace

void block_softmax(const ScoreBlock& b, float* m, float* l, float* corr, float* scratch) {
#if FS_AVX512
  if (cpu_isa() >= CpuIsa::kAvx512) return block_softmax_avx512(b, m, l, corr, scratch);
#endif
  block_softmax_portable(b, m, l, corr, scratch);
}

void modify_scores(float* s, int64_t ld, int64_t nb, int64_t rows, int64_t j0, float scale,
                   float softcap, const float* slope, const float* pos) {
#if FS_AVX512
  if (cpu_isa() >= CpuIsa::kAvx512)
    return modify_avx512(s, ld, nb, rows, j0, scale, softcap, slope, pos);
#endif
  modify_portable(s, ld, nb, rows, j0, scale, softcap, slope, pos);
}

void convert_row(const void* src, DType dtype, int64_t n, float mul, float* dst) {
#if FS_AVX512
  if (cpu_isa() >= CpuIsa::kAvx512) return convert_avx512(src, dtype, n, mul, dst);
#endif
  switch (dtype) {
    case DType::kFloat16:
      return convert_scalar(static_cast<const fp16_t*>(src), n, mul, dst);
    case DType::kBFloat16:
      return convert_scalar(static_cast<const bf16_t*>(src), n, mul, dst);
    case DType::kFloat8E4M3:
      return convert_scalar(static_cast<const fp8_e4m3_t*>(src), n, mul, dst);
    default:
      return convert_scalar(static_cast<const float*>(src), n, mul, dst);
  }
}

}  // namespace flashserve::attention
