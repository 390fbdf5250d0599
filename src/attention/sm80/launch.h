// Host entry points of the sm80 forward kernels, one per head dim (each in its own .cu file so the
// instantiations compile in parallel).
#pragma once

#include <cuda_runtime.h>

#include "flashserve/tensor.h"
#include "fwd_params.h"
#include "score_mod.h"

namespace flashserve::attention::sm80 {

struct FwdLaunch {
  DType dtype;         // kBFloat16 or kFloat16
  bool has_mask;       // causal or a window side: the masked instantiation
  bool decode;         // <= 1 query per sequence and no left window: the GQA-packed decode tiles
  bool paged;          // block_table given: the paged-KV instantiation
  int batch;           // grid z is batch * params.num_splits (sequences from params.seq_begin)
  int max_q_len;       // grid x = ceil(max_q_len / block_m)
  int max_kv_len;      // longest key sequence (sizes the masked grid's sections)
  int smem_per_block;  // the device's opt-in shared memory per block
  int smem_per_sm;
  int sms;
  int64_t l2_bytes;
  // Score modifiers (score_mod.h): the modifier kernels, which the plan runs on decode or masked
  // tiles only; score_mod's units are those of params.scale (fwd_params_of.h score_mod_params).
  bool has_score_mod = false;
  ScoreModParams score_mod{};
  // Padded kernels (run_fwd_padded): the call's head dims, multiples of 8 up to the kernel's.
  int head_dim = 0, head_dim_v = 0;
  // The fp8 KV cache's kernels (run_fwd_kv_fp8): the descales of K and V per (sequence, KV
  // head), null for 1.
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int64_t k_descale_batch_stride = 0, k_descale_head_stride = 0;
  int64_t v_descale_batch_stride = 0, v_descale_head_stride = 0;
  // The fp8 KV cache's decode tiles convert the codes at operand load (kv_fp8_reg.h) instead of
  // widening them in shared memory (FLASHSERVE_KV_FP8_REGISTER; the plan's kv_fp8_register).
  bool kv_fp8_register = false;
  // Decode tiles split params.num_splits (2-16) ways that merge the splits in a thread-block
  // cluster (cluster_combine.h; the plan's cluster_combine): no partials, no run_combine.
  bool cluster_combine = false;
  // Masked grids: attention/kernel/tile_order.h (off only to measure it).
  bool heaviest_first = true;
  // Programmatic dependent launch (common/pdl.cuh; AttentionRunOptions::programmatic_launch, on
  // sm_90 and later only): the kernel may start while the stream's previous kernel finishes.
  bool pdl = false;
  cudaStream_t stream;
};

// Merges the num_splits partial results of params (fp32 O and LSE per split, `head_dim` columns
// each: the kernel's) into out and lse, for the rows of params' sequences seq_begin .. seq_end - 1
// that it takes. head_dim_v < head_dim (a padded kernel's partials): out's columns from
// head_dim_v on are neither read nor written. row_splits: the most partials a row has (0:
// num_splits; a length-aware decode launch's long rows have more), which sizes the warps a row.
// pdl: as FwdLaunch's.
void run_combine(const FwdParams& params, DType dtype, int head_dim, cudaStream_t stream,
                 int head_dim_v = 0, int row_splits = 0, bool pdl = false);

// The item map of a length-aware decode launch (params.split_map, split_map.cu), before its split
// kernel: one CTA. pdl: as FwdLaunch's.
void run_split_map(const FwdParams& params, cudaStream_t stream, bool pdl = false);

// Throws flashserve::Error (kUnsupported when the device's shared memory is too small, kCuda when
// the launch fails).
template <int kHeadDim>
void run_fwd(const FwdParams& params, const FwdLaunch& launch);

// The padded kernels of kHeadDim (fwd_kernel_padded) for a call whose head dims launch.head_dim
// and launch.head_dim_v are not both kHeadDim: decode tiles, or masked prefill tiles whatever the
// mask (as the modifier kernels; no modifiers). In their own translation units
// (fwd_hdim*_padded.cu).
template <int kHeadDim>
void run_fwd_padded(const FwdParams& params, const FwdLaunch& launch);

// K and V float8_e4m3fn codes of a paged fp8 KV cache, q and out bfloat16
// (fwd_kernel_kv_fp8): decode tiles, or masked prefill tiles whatever the mask; the descales in
// launch. In their own translation units (fwd_hdim*_kv_fp8.cu).
template <int kHeadDim>
void run_fwd_kv_fp8(const FwdParams& params, const FwdLaunch& launch);

}  // namespace flashserve::attention::sm80
