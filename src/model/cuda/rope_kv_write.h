// RoPE fused with the K/V cache write: one pass over the QKV projection's output that adds the
// q/k/v bias (Qwen2), rotates q and k (the rotate-half form of Hugging Face's apply_rotary_pos_emb:
// x[i] pairs with x[i + d/2]), writes q to its own buffer for attention and k, v into their pages
// at slot_mapping[t] (slot = block * block_size + offset; a negative slot skips the write).
// An fp8 cache (k_cache8 / v_cache8 instead of k_cache / v_cache) stores e4m3(x / scale[h]) of the
// float32 value x the bf16 cache would round, with the KV head's scale, saturating at +-448
// (common/float8_cuda.cuh e4m3_from_float): the CPU runner's write_kv_row, bit for bit on the
// same x.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flashserve::model::cuda {

struct RopeKvArgs {
  const __nv_bfloat16* qkv = nullptr;     // [n_tokens, (heads + 2 kv_heads) * head_dim]: q | k | v
  const __nv_bfloat16* bias = nullptr;    // optional [(heads + 2 kv_heads) * head_dim]
  const int32_t* positions = nullptr;     // [n_tokens]
  const int32_t* slot_mapping = nullptr;  // [n_tokens]
  const float* inv_freq = nullptr;        // [head_dim / 2], scaling already applied
  float rope_scale = 1.0f;                // multiplies cos and sin (yarn's attention factor)
  __nv_bfloat16* q_out = nullptr;         // [n_tokens, heads, head_dim]
  __nv_bfloat16* k_cache = nullptr;       // [slots, kv_heads, head_dim]
  __nv_bfloat16* v_cache = nullptr;       // [slots, kv_heads, head_dim]
  // The fp8 cache: e4m3 codes [slots, kv_heads, head_dim] and the scales [kv_heads] of this
  // layer's K and V (device memory). Given instead of k_cache / v_cache.
  uint8_t* k_cache8 = nullptr;
  uint8_t* v_cache8 = nullptr;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  int64_t n_tokens = 0;
  int32_t heads = 0, kv_heads = 0, head_dim = 0;  // head_dim a multiple of 16
};

// pdl: launched with programmatic dependent launch (common/pdl.cuh; sm_90 and later).
void rope_kv_write(const RopeKvArgs& args, cudaStream_t stream, bool pdl = false);

}  // namespace flashserve::model::cuda
