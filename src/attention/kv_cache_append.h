// What validation of a KV-cache append learns (the resolved sizes), shared by the CPU path and the
// CUDA kernel (src/attention/cuda/kv_cache_append.cu). Semantics: include/flashserve/kv_cache.h.
#pragma once

#include <cstdint>

#include "flashserve/kv_cache.h"
#include "mask.h"  // FS_HOST_DEVICE

namespace flashserve::attention {

struct KvAppendProblem {
  int64_t batch = 0;
  int64_t s_new = 0, h_kv = 0, head_dim = 0, head_dim_v = 0;
  int64_t s_q = 0, h_q = 0;  // of q (0 without q)
  bool paged = false;
  int64_t cache_rows = 0;             // b_cache (contiguous) or num_pages (paged)
  int64_t rows_per_entry = 0;         // s_cache (contiguous) or page_size (paged)
  int64_t pages_per_seq = 1;          // 1 for a contiguous cache: the entry is the sequence's row
  int64_t capacity = 0;               // keys one sequence can hold
  int64_t rotary_dim = 0, s_rot = 0;  // rotary_dim 0: no rotary
  DType dtype = DType::kFloat32;      // of the cache, k/v_new, q
  Device device;
};

KvAppendProblem describe(const KvCacheAppendParams& params);

// Checks every entry of the length and index tensors, which must be in host memory (describe does
// this for a CPU call; FLASHSERVE_CHECK_INDICES for a CUDA one, on host copies).
void check_host_indices(const KvCacheAppendParams& params, const KvAppendProblem& problem);

// Rotary embedding of element c < rotary_dim of a row x: x'[c] = x[c] cos[j] + sign x[partner]
// sin[j]. Interleaved (GPT-J) pairs are (2j, 2j + 1); otherwise (GPT-NeoX) (j, j + rotary_dim / 2).
// The first element of a pair takes -sin, the second +sin.
struct RotaryTerm {
  int64_t partner, column;
  float sign;
};
FS_HOST_DEVICE RotaryTerm rotary_term(int64_t c, int64_t rotary_dim, bool interleaved) {
  if (interleaved) return {c ^ 1, c >> 1, (c & 1) ? 1.0f : -1.0f};
  const int64_t half = rotary_dim >> 1;
  return c < half ? RotaryTerm{c + half, c, -1.0f} : RotaryTerm{c - half, c - half, 1.0f};
}

#if defined(FLASHSERVE_WITH_CUDA)
// The append on a CUDA device (validated params); enqueued on params.stream.
void cuda_kv_cache_append(const KvCacheAppendParams& params, const KvAppendProblem& problem);
#endif

}  // namespace flashserve::attention
