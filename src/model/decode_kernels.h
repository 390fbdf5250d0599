// Which kernels the CUDA runner takes for the weight products of small steps (at most
// cuda::kGemvMaxRows tokens: decode at small batch, where reading the weights once is the cost),
// and whether its kernels use programmatic dependent launch (common/pdl.cuh). Read once per runner
// from FLASHSERVE_GEMV and FLASHSERVE_PDL (0 or 1; anything else is refused by name). Weights
// prefetched into L2 by the short kernels (cp.async.bulk.prefetch.L2) were tried and removed:
// slower (session 32, docs/model-gpu.md).
#pragma once

#include <cstdint>

namespace flashserve::model {

// The most rows a product may have to go to the GEMV (cuda/gemv.h, whose kGemvMaxRows it is).
inline constexpr int64_t kGemvMaxProductRows = 4;
// Products of at most this many rows go to the GEMV instead of cuBLASLt (0: none): one, a batch-1
// decode's. bench_model --fuse-ab, mistral-7b shape, 1k keys, graphs: batch 1 -7.2% (H100,
// session 32: 5.83 against 6.28 ms) and -3.8% (H200, session 21); at 2 rows and more the GEMV
// is slower (2: +6.5%, 4: +57%, H100), as it reads the weights once per row.
// FLASHSERVE_GEMV=0 sends none, =1 every product it takes (kGemvMaxProductRows).
inline constexpr int64_t kGemvRowsByDefault = 1;
// Programmatic dependent launch for the runner's own kernels on sm_90 and later (the norm, RoPE,
// the GEMVs): each waits for its producer only where it reads its output.
inline constexpr bool kPdlByDefault = true;
// The attention's sm80 kernels (every decode's) launched so too where pdl is on
// (AttentionRunOptions::programmatic_launch): between RoPE, which releases its dependents early,
// and the o product. Off: bench_model --fuse-ab measured +0.0% at batch 1 and -0.5% at batch 32
// (H100, session 35: bench/results/decode-reuse-pdl-h100-2026-12-05-session35.md).
inline constexpr bool kPdlAttentionByDefault = false;
// Where pdl is on, the GEMV's lanes load their first pass of weights (kUnroll 16-byte loads, a
// quarter of a 4096-wide row) before they wait for the kernel before, and silu is launched
// programmatically too: the blocks of a product scheduled while the short kernel before it (a
// norm, silu, or attention with pdl_attention) still runs have HBM busy instead of idle.
// Off: predicted -1 to -3% of a batch-1 step, bench_model --fuse-ab measured +0.3% at batch 1
// (+0.2% with the attention's PDL) and +0.2% at batch 32 (H100, session 36:
// bench/results/decode-early-weights-h100-2026-12-06-session36.md).
inline constexpr bool kEarlyWeightsByDefault = false;
struct DecodeKernelOptions {
  int64_t gemv_rows = kGemvRowsByDefault;
  bool pdl = kPdlByDefault;  // where the device has it (sm_90 and later)
  bool pdl_attention = kPdlAttentionByDefault;
  bool early_weights = kEarlyWeightsByDefault;  // where pdl
};

// FLASHSERVE_GEMV, FLASHSERVE_PDL, FLASHSERVE_PDL_ATTENTION and FLASHSERVE_EARLY_WEIGHTS (0 or 1;
// anything else is refused).
DecodeKernelOptions decode_kernel_options_from_env(const char* gemv, const char* pdl,
                                                   const char* pdl_attention,
                                                   const char* early_weights);

// Kernel boundaries removed from steps of at most cuda::kGemvMaxRows tokens by the fused GEMV
// (cuda/fused_gemv.h), which then computes those steps' products instead of cuBLASLt: issue 21,
// a batch-1 decode at 1.45x its weight-read floor, ~0.9 ms of it outside the products.
// Read once per runner from FLASHSERVE_FUSE_NORM and FLASHSERVE_FUSE_SILU (0 or 1). Off:
// measured slower (batch 1 on the H100, session 32: silu +3.4%, norm +3.3%, both +9.2% against
// the default; batch 2-4 +24-90%; docs/model-gpu.md).
inline constexpr bool kFuseNormByDefault = false;
inline constexpr bool kFuseSiluByDefault = false;

// The steps the fused GEMV takes: at most this many tokens (cuda::kGemvMaxRows), and the norm
// prologue a hidden size of at most kFusedNormMaxColumns (cuda::kFusedNormMaxHidden).
inline constexpr int64_t kFusedMaxTokens = kGemvMaxProductRows;
inline constexpr int64_t kFusedNormMaxColumns = 8192;

struct DecodeFusion {
  // The RMSNorms in the prologue of the QKV and gate/up products and the residual adds in the
  // epilogue of the o and down products: no norm kernel inside a layer (hidden <= 8192).
  bool norm = kFuseNormByDefault;
  // silu(gate) * up in the epilogue of the gate/up product: no silu kernel.
  bool silu = kFuseSiluByDefault;
  bool any() const { return norm || silu; }
  // What applies to a step of `tokens` tokens at `hidden`: nothing above kFusedMaxTokens, and
  // no norm fusion above kFusedNormMaxColumns (the runner's unfused kernels take those).
  DecodeFusion for_step(int64_t tokens, int64_t hidden) const {
    DecodeFusion f;
    f.norm = norm && tokens <= kFusedMaxTokens && hidden <= kFusedNormMaxColumns;
    f.silu = silu && tokens <= kFusedMaxTokens;
    return f;
  }
};

DecodeFusion decode_fusion_from_env(const char* norm, const char* silu);

}  // namespace flashserve::model
