// RoPE fused with the K/V cache write: one pass over the QKV projection's output that adds the
// q/k/v bias (Qwen2), rotates q and k (the rotate-half form of Hugging Face's apply_rotary_pos_emb:
// x[i] pairs with x[i + d/2]), writes q to its own buffer for attention and k, v into their pages
// at slot_mapping[t] (slot = block * block_size + offset; a negative slot skips the write).
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
  int64_t n_tokens = 0;
  int32_t heads = 0, kv_heads = 0, head_dim = 0;  // head_dim a multiple of 16
};

// pdl: launched with programmatic dependent launch (cuda/pdl.cuh; sm_90 and later).
void rope_kv_write(const RopeKvArgs& args, cudaStream_t stream, bool pdl = false);

}  // namespace flashserve::model::cuda
