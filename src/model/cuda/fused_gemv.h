// The decode GEMV (gemv.h) with the small kernels beside it folded in, so that a batch-1 decode
// layer has fewer kernel boundaries (each costs the previous kernel's drain and the next one's
// launch and ramp, a few microseconds; docs/model-gpu.md "Next for decode"):
//   * a norm prologue: x is the residual stream and every block first computes its RMSNorm
//     (add_rmsnorm's roundings and sum order, rmsnorm.h) into shared memory: the norm kernel
//     before the QKV and gate/up products goes away;
//   * a residual epilogue: y += bf16(x w^T), in place (the o and down products add their output
//     to the residual stream themselves, so that the next norm has nothing to add);
//   * a silu epilogue: w is [2n, k], gate rows then up rows (the runner's fused gate/up), and
//     y = bf16(silu(g) * u) of g = bf16(x gate^T), u = bf16(x up^T), silu_mul.h's formula: the
//     silu kernel goes away.
// Each warp computes one output column (the gate and up rows of it for silu) with gemv.h's loop
// and summation order, so a fused result equals the unfused GEMV path (gemv, add_rmsnorm,
// silu_mul) bit for bit on the same inputs. The runner takes it at most kGemvMaxRows tokens, when
// FLASHSERVE_FUSE_NORM or FLASHSERVE_FUSE_SILU asks (model/decode_kernels.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flashserve::model::cuda {

// The largest k a norm prologue takes: add_rmsnorm's thread layout (4 vectors of 8 per thread)
// must fit the GEMV's 256 threads for its sum of squares to be the same sum.
constexpr int64_t kFusedNormMaxHidden = 8192;

struct FusedGemvArgs {
  const __nv_bfloat16* x = nullptr;            // [m, k]; the residual stream when norm_weight
  const __nv_bfloat16* norm_weight = nullptr;  // [k]: normalize x first (RMSNorm, eps)
  float eps = 1e-6f;
  const __nv_bfloat16* w = nullptr;     // [n, k]; [2n, k] (gate | up) when silu
  const __nv_bfloat16* bias = nullptr;  // optional [n]; not with silu or add_to_y
  __nv_bfloat16* y = nullptr;           // [m, n]
  bool silu = false;                    // y = silu(x gate^T) * (x up^T)
  bool add_to_y = false;                // y += x w^T (the residual add)
  int64_t m = 0, n = 0, k = 0;          // m <= kGemvMaxRows; k a multiple of 8
};

// Throws Error(kUnsupported) for shapes it does not take (m > kGemvMaxRows, k not a multiple of
// 8, a norm over more than kFusedNormMaxHidden, silu or add_to_y with a bias or each other).
// pdl: launched with programmatic dependent launch (common/pdl.cuh; sm_90 and later).
void fused_gemv(const FusedGemvArgs& args, cudaStream_t stream, bool pdl = false);

}  // namespace flashserve::model::cuda
