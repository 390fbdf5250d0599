// The online-softmax step of the CPU path for one block of scores, laid out key-major: S[j][i] is
// the score of key j for tile row i (S^T = K Q^T, see cpu_forward.h). With the rows contiguous,
// every loop here runs across rows with the keys in order, so it vectorises without reassociating
// a sum: the same sums on every ISA (the AVX-512 clone contracts the exp2 polynomial into FMAs,
// so probabilities may differ from the portable ones in the last place). It keeps the
// RunningSoftmax semantics
// (online_softmax.h) row by row: scores in log2 units, m the running max, l the running sum of
// exp2(s - m), corr the factor that rescales what row i accumulated before this block.
#pragma once

#include <cstdint>

#include "flashserve/tensor.h"

namespace flashserve::attention {

struct ScoreBlock {
  float* s;                  // [nb][ld] scores in, probabilities exp2(s - m) out (0 where masked)
  int64_t ld;                // row stride of s (>= rows)
  int64_t nb;                // keys in the block: key j0 + j for j < nb
  int64_t rows;              // tile rows
  int64_t j0;                // first key of the block
  const int64_t* first_key;  // [rows] row i sees keys first_key[i] <= key < end_key[i]
  const int64_t* end_key;
  bool all_visible;    // every row sees every key of the block: the mask pass is skipped
  float scale = 1.0f;  // multiplies the scores first (the bf16 products are of unscaled q)
  // The score modifiers (score_mod.h) in log2 units, after the scale and before the mask:
  float softcap = 0.0f;          // > 0: s = softcap * tanh(s / softcap) (softcap * log2(e))
  const float* slope = nullptr;  // [rows] ALiBi slope * log2(e) of each row's head; null: none
  const float* pos = nullptr;    // [rows] each row's query position p: s -= slope |p - key|
};

// Applies the scale and the score modifiers of b to the block's scores in place (the forward's
// block_softmax and the backward's probabilities share it).
void modify_scores(float* s, int64_t ld, int64_t nb, int64_t rows, int64_t j0, float scale,
                   float softcap, const float* slope, const float* pos);

// Scales and masks s, folds it into m, l (per row), writes corr[i] and turns s into probabilities.
// NaN and infinity as RunningSoftmax::add: a NaN or +inf score among the visible ones makes l NaN;
// masked keys and -inf scores weigh 0; m stays -inf while a row has seen nothing.
void block_softmax(const ScoreBlock& b, float* m, float* l, float* corr, float* scratch);

// Converts n elements of a float32 / float16 / bfloat16 / float8_e4m3fn row to float times mul
// (vectorised: F16C, shifts and table gathers on AVX-512; the scalar conversions of common/half.h
// and common/float8.h elsewhere). For e4m3, mul carries the descale factor.
void convert_row(const void* src, DType dtype, int64_t n, float mul, float* dst);

}  // namespace flashserve::attention
