// Appending a step's new keys and values to a KV cache in place, with optional rotary embedding
// (FlashAttention's flash_attn_with_kvcache, before its attention). One pass: each new k row is
// rotated at its position and written into the cache, each v row copied, q rotated into its own
// buffer, and the new lengths (cache_seqlens + s_new) written for the attention that follows.
//
// Layouts (strides are free except that the last dimension must be contiguous):
//   cache   k_cache, v_cache [b_cache, s_cache, h_kv, d]: sequence b is row cache_batch_idx[b]
//           (b without cache_batch_idx), capacity s_cache;
//           or paged [num_pages, page_size, h_kv, d] with block_table [batch, pages_per_seq]:
//           key j of sequence b is row j % page_size of page block_table[b][j / page_size],
//           capacity pages_per_seq * page_size.
//   new     k_new, v_new [batch, s_new, h_kv, d] (optional, both or neither): token i of sequence
//           b goes to position cache_seqlens[b] + i.
//   rotary  rotary_cos, rotary_sin [s_rot, rotary_dim / 2] (optional, both or neither), float32
//           or the cache's dtype; rotary_dim even and <= d. Dimensions past rotary_dim are copied.
//           interleaved: pairs (2i, 2i + 1) (GPT-J); otherwise (i, i + rotary_dim / 2) (GPT-NeoX).
//           x'[a] = x[a] cos - x[b] sin, x'[b] = x[b] cos + x[a] sin for each pair (a, b).
//   q       q [batch, s_q, h_q, d] rotated into q_out (same shape), only with rotary: token i at
//           position cache_seqlens[b] + i when q_positions_per_token (causal or windowed
//           attention), else every token at cache_seqlens[b] (FlashAttention's rule).
//   seqlens_out  optional int32 [batch]: cache_seqlens[b] + s_new, the key lengths the attention
//           that follows reads (its seqused_k).
//
// Dtypes: float32, float16 or bfloat16 caches, with k_new, v_new, q and q_out of the cache's dtype
// (rotary tables float32 or the cache's dtype); or float8_e4m3fn caches (an fp8 KV cache, as FA3
// and vLLM hold it), whose new k and v must be e4m3 codes already: their bytes are copied as they
// are (no conversion: the descale factors the attention reads cover the whole cache, the new
// tokens included), and rotary is refused (kUnsupported naming rotary_cos: rotating codes would
// need a dequantise and a requantise with a scale the append does not have).
//
// Lengths: cache_seqlens int32 [batch], or absent with cache_seqlen the length of every sequence.
// On the host every entry is checked: 0 <= cache_seqlens[b], cache_seqlens[b] + s_new <= capacity,
// the rotary positions below s_rot, cache_batch_idx and the block_table pages written inside their
// pools, and no cache slot written twice (with new tokens, cache_batch_idx entries are distinct;
// two block_table entries may share a page, but not a written row of it); an Error names the
// argument and the sequence. The caches may be views of one tensor (k_cache = kv[:, :, 0],
// v_cache = kv[:, :, 1]) as long as no element belongs to both: outputs are checked against
// every other argument element by element. On a CUDA device the index tensors are
// trusted, as attention's are (FLASHSERVE_CHECK_INDICES=1 copies them to the host and checks them
// the same way first), but the kernel never writes or reads out of bounds: a token whose position
// is outside the capacity, or whose page is outside the pool, is not written, seqlens_out is
// clamped to [0, capacity], and a q row whose rotary position is outside [0, s_rot) becomes NaN.
#pragma once

#include <cstdint>

#include "flashserve/error.h"
#include "flashserve/tensor.h"

namespace flashserve {

struct KvCacheAppendParams {
  TensorView k_cache, v_cache;        // written in place
  TensorView k_new, v_new;            // optional [batch, s_new, h_kv, d]
  TensorView cache_seqlens;           // optional int32 [batch]
  int64_t cache_seqlen = 0;           // every sequence's length when cache_seqlens is absent
  TensorView cache_batch_idx;         // optional int32 [batch]; not with block_table
  TensorView block_table;             // optional int32 [batch, pages_per_seq]: paged cache
  TensorView rotary_cos, rotary_sin;  // optional [s_rot, rotary_dim / 2]
  bool rotary_interleaved = true;
  TensorView q, q_out;  // with rotary: q rotated into q_out
  bool q_positions_per_token = false;
  TensorView seqlens_out;  // optional int32 [batch]
  void* stream = nullptr;  // cudaStream_t for CUDA tensors
};

// Throws flashserve::Error naming the first argument that breaks the layout above (host-resident
// lengths and indices are checked entry by entry).
void validate(const KvCacheAppendParams& params);

// Validates, then appends (and rotates) on the device that holds the cache. CUDA work is enqueued
// on params.stream (CUDA-graph safe: no allocation, no host synchronization unless
// FLASHSERVE_CHECK_INDICES is set).
void kv_cache_append(const KvCacheAppendParams& params);

}  // namespace flashserve
