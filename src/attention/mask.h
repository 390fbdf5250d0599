// The attention mask of the contract, in one place for the CPU path and the CUDA kernels.
// Bottom-right alignment: query t of a sequence with q_len queries and kv_len keys sits at absolute
// position p = kv_len - q_len + t; it sees key j iff p - left <= j <= p + right, where a negative
// side is unbounded. Causal is right = 0.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FS_HOST_DEVICE inline
#endif

namespace flashserve::attention {

struct Mask {
  int64_t left = -1;   // keys before the query's position that stay visible; < 0 unbounded
  int64_t right = -1;  // keys after it; < 0 unbounded, 0 causal

  FS_HOST_DEVICE bool has_left() const { return left >= 0; }
  FS_HOST_DEVICE bool has_right() const { return right >= 0; }

  // [first, last] keys that query t sees, clamped to [0, kv_len - 1]; empty when first > last.
  FS_HOST_DEVICE int64_t first_key(int64_t t, int64_t q_len, int64_t kv_len) const {
    const int64_t p = kv_len - q_len + t;
    const int64_t f = has_left() ? p - left : 0;
    return f < 0 ? 0 : f;
  }
  FS_HOST_DEVICE int64_t last_key(int64_t t, int64_t q_len, int64_t kv_len) const {
    const int64_t p = kv_len - q_len + t;
    const int64_t l = has_right() ? p + right : kv_len - 1;
    return l > kv_len - 1 ? kv_len - 1 : l;
  }
  FS_HOST_DEVICE bool visible(int64_t t, int64_t j, int64_t q_len, int64_t kv_len) const {
    return j >= first_key(t, q_len, kv_len) && j <= last_key(t, q_len, kv_len);
  }
};

}  // namespace flashserve::attention
