// Which kernels the CUDA runner takes for the weight products of small steps (at most
// cuda::kGemvMaxRows tokens: decode at small batch, where reading the weights once is the cost),
// and whether its kernels use programmatic dependent launch (cuda/pdl.cuh). Read once per runner
// from FLASHSERVE_GEMV, FLASHSERVE_PDL and FLASHSERVE_L2_PREFETCH (0 or 1; anything else is
// refused by name).
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
// Weights prefetched into L2 while a small step's short kernels leave HBM idle (issue 21: a
// batch-1 decode reads its 14 GB of weights at 1.52x the copy-bandwidth floor, ~0.9 ms of the
// step in kernels that read almost nothing). Off: measured slower (session 32, H100, batch 1:
// +15% with cuBLASLt, +1.4% beside the GEMV's -7%; the products after a prefetch gain ~0.13 ms
// a step, the kernels issuing it lose ~1.2 ms, as a grid ends only once its bulk prefetches are
// issued; docs/model-gpu.md). sm_90 and later (cp.async.bulk.prefetch).
inline constexpr bool kL2PrefetchByDefault = false;

struct DecodeKernelOptions {
  int64_t gemv_rows = kGemvRowsByDefault;
  bool pdl = kPdlByDefault;                 // where the device has it (sm_90 and later)
  bool l2_prefetch = kL2PrefetchByDefault;  // likewise
};

// FLASHSERVE_GEMV, FLASHSERVE_PDL and FLASHSERVE_L2_PREFETCH (0 or 1; anything else is refused).
DecodeKernelOptions decode_kernel_options_from_env(const char* gemv, const char* pdl,
                                                   const char* l2_prefetch = nullptr);

// What a small step prefetches into L2, and from which kernel (each kernel's prefetches are
// issued before it waits for its producer and are not waited for: a hint to the memory system,
// which the products then find in L2 instead of HBM):
//   - the RoPE / KV-write kernel: the o product's weights, while attention runs (a decode's
//     attention reads a few MB of K/V; the o weights are 32 MB at the mistral-7b shape);
//   - each RMSNorm kernel: the head of the product after it (QKV, gate/up, the LM head), the
//     bytes HBM would move while the norm runs.
// Steps of at most kL2PrefetchMaxTokens tokens (their attention and norms are short and read
// little; larger steps' attention streams K/V and competes).
inline constexpr int64_t kL2PrefetchMaxTokens = 4;

struct L2PrefetchBytes {
  int64_t o = 0;      // of the o product's weights (from their start)
  int64_t ahead = 0;  // of the product after each norm (from its start)
};

// The bytes for an L2 of `l2_bytes` and o weights of `o_weight_bytes`: o whole up to 3/4 of the
// L2 (the rest holds what attention and the norm touch), the heads a quarter of it (a norm runs a
// few microseconds: at ~4 TB/s that is 10-20 MB).
L2PrefetchBytes l2_prefetch_bytes(int64_t l2_bytes, int64_t o_weight_bytes);

// Kernel boundaries removed from steps of at most cuda::kGemvMaxRows tokens by the fused GEMV
// (cuda/fused_gemv.h), which then computes those steps' products instead of cuBLASLt: issue 21,
// a batch-1 decode at 1.45x its weight-read floor, ~0.9 ms of it outside the products.
// Read once per runner from FLASHSERVE_FUSE_NORM and FLASHSERVE_FUSE_SILU (0 or 1). Off: written
// without a GPU and not measured yet (docs/model-gpu.md has the predictions).
inline constexpr bool kFuseNormByDefault = false;
inline constexpr bool kFuseSiluByDefault = false;

// The steps the fused GEMV takes: at most this many tokens (cuda::kGemvMaxRows), and the norm
// prologue a hidden size of at most kFusedNormMaxColumns (cuda::kFusedNormMaxHidden).
inline constexpr int64_t kFusedMaxTokens = 4;
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
