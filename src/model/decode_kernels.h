// Which kernels the CUDA runner takes for the weight products of small steps (at most
// cuda::kGemvMaxRows tokens: decode at small batch, where reading the weights once is the cost),
// and whether its kernels use programmatic dependent launch (cuda/pdl.cuh). Read once per runner
// from FLASHSERVE_GEMV and FLASHSERVE_PDL (0 or 1; anything else is refused by name).
#pragma once

namespace flashserve::model {

// The GEMV (cuda/gemv.h) instead of cuBLASLt for products of at most 4 rows: off, it does not win
// on the whole step (session 17: 5.05 against 4.83 ms at batch 1 with 1k keys).
inline constexpr bool kGemvByDefault = false;
// Programmatic dependent launch for the runner's own kernels on sm_90 and later (the norm, RoPE,
// the GEMVs): each waits for its producer only where it reads its output.
inline constexpr bool kPdlByDefault = true;

struct DecodeKernelOptions {
  bool gemv = kGemvByDefault;
  bool pdl = kPdlByDefault;  // where the device has it (sm_90 and later)
};

DecodeKernelOptions decode_kernel_options_from_env(const char* gemv, const char* pdl);

}  // namespace flashserve::model
