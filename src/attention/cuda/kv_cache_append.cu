// The KV-cache append on a CUDA device (include/flashserve/kv_cache.h): one thread block per new
// token (its k and v rows, every KV head) and per q token (rotated into q_out), and a few blocks
// for the new lengths. Memory-bound and small next to the attention that follows; what matters is
// that it is one launch, CUDA-graph safe, and never writes or reads out of bounds whatever the
// device-side lengths and indices hold (they are trusted, not read back: see the header).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention/cuda_check.h"
#include "attention/kv_cache_append.h"

namespace flashserve::attention {
namespace {

struct Rows {  // a [batch or entry, row, head, d] tensor: data and the three outer strides
  const void* data = nullptr;
  int64_t s0 = 0, s1 = 0, s2 = 0;
};

struct AppendArgs {
  Rows k_new, v_new, k_cache, v_cache, q, q_out, cos, sin;
  const int32_t* seqlens = nullptr;  // null: cache_seqlen for every sequence
  int64_t seqlens_stride = 0;
  int64_t cache_seqlen = 0;
  const int32_t* batch_idx = nullptr;  // contiguous cache: the cache row of each sequence
  int64_t batch_idx_stride = 0;
  const int32_t* table = nullptr;  // paged cache
  int64_t table_s0 = 0, table_s1 = 0;
  int32_t* seqlens_out = nullptr;
  int64_t seqlens_out_stride = 0;
  int64_t batch = 0, s_new = 0, h_kv = 0, d = 0, dv = 0, s_q = 0, h_q = 0;
  int64_t rotary_dim = 0, s_rot = 0, capacity = 0, cache_rows = 0, rows_per_entry = 0;
  bool paged = false, interleaved = true, q_per_token = false;
};

__device__ inline float to_f(float x) {
  return x;
}
__device__ inline float to_f(__half x) {
  return __half2float(x);
}
__device__ inline float to_f(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
// float8_e4m3fn caches hold codes: T = E4m3Code, copied as they are (never converted; rotary is
// refused for them in validation, and the append has no scale to requantise with).
using E4m3Code = uint8_t;
template <typename T>
__device__ inline T from_f(float x);
template <>
__device__ inline float from_f<float>(float x) {
  return x;
}
template <>
__device__ inline __half from_f<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ inline __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ inline int64_t length_of(const AppendArgs& a, int64_t b) {
  return a.seqlens ? int64_t{a.seqlens[b * a.seqlens_stride]} : a.cache_seqlen;
}

// Writes heads x dim elements of `src` (token row) into `dst`, rotated at `pos` when rotary is on
// (pos outside [0, s_rot): NaN, so that a bad device-side length shows instead of a silent wrong
// rotation).
template <typename T, typename R>
__device__ void write_rows(const AppendArgs& a, const T* src, const Rows& s, T* dst, const Rows& t,
                           int64_t heads, int64_t dim, bool rotate, int64_t pos) {
  if constexpr (std::is_same_v<T, E4m3Code>) {
    for (int64_t e = threadIdx.x; e < heads * dim; e += blockDim.x) {
      const int64_t h = e / dim, c = e % dim;
      dst[h * t.s2 + c] = src[h * s.s2 + c];
    }
  } else {
    const bool in_table = pos >= 0 && pos < a.s_rot;
    for (int64_t e = threadIdx.x; e < heads * dim; e += blockDim.x) {
      const int64_t h = e / dim, c = e % dim;
      const T* x = src + h * s.s2;
      float y = to_f(x[c]);
      if (rotate && c < a.rotary_dim) {
        if (in_table) {
          const RotaryTerm r = rotary_term(c, a.rotary_dim, a.interleaved);
          const float cs = to_f(static_cast<const R*>(a.cos.data)[pos * a.cos.s0 + r.column]);
          const float sn = to_f(static_cast<const R*>(a.sin.data)[pos * a.sin.s0 + r.column]);
          y = y * cs + r.sign * to_f(x[r.partner]) * sn;
        } else {
          y = __int_as_float(0x7fc00000);  // quiet NaN
        }
      }
      dst[h * t.s2 + c] = from_f<T>(y);
    }
  }
}

template <typename T, typename R>
__global__ void kv_cache_append_kernel(const AppendArgs a) {
  const int64_t kv_blocks = a.batch * a.s_new, q_blocks = a.batch * a.s_q;
  const int64_t block = blockIdx.x;
  const bool rotary = a.rotary_dim > 0;
  if (block < kv_blocks) {
    const int64_t b = block / a.s_new, i = block % a.s_new;
    const int64_t pos = length_of(a, b) + i;
    if (pos < 0 || pos >= a.capacity) return;  // overflow: never written (the header says why)
    int64_t entry, row;
    if (a.paged) {
      entry = a.table[b * a.table_s0 + pos / a.rows_per_entry * a.table_s1];
      row = pos % a.rows_per_entry;
    } else {
      entry = a.batch_idx ? a.batch_idx[b * a.batch_idx_stride] : b;
      row = pos;
    }
    if (entry < 0 || entry >= a.cache_rows) return;
    const int64_t src_k = b * a.k_new.s0 + i * a.k_new.s1, src_v = b * a.v_new.s0 + i * a.v_new.s1;
    write_rows<T, R>(a, static_cast<const T*>(a.k_new.data) + src_k, a.k_new,
                     const_cast<T*>(static_cast<const T*>(a.k_cache.data)) + entry * a.k_cache.s0 +
                         row * a.k_cache.s1,
                     a.k_cache, a.h_kv, a.d, rotary, pos);
    write_rows<T, R>(a, static_cast<const T*>(a.v_new.data) + src_v, a.v_new,
                     const_cast<T*>(static_cast<const T*>(a.v_cache.data)) + entry * a.v_cache.s0 +
                         row * a.v_cache.s1,
                     a.v_cache, a.h_kv, a.dv, false, pos);
  } else if (block < kv_blocks + q_blocks) {
    const int64_t b = (block - kv_blocks) / a.s_q, t = (block - kv_blocks) % a.s_q;
    const int64_t pos = length_of(a, b) + (a.q_per_token ? t : 0);
    write_rows<T, R>(
        a, static_cast<const T*>(a.q.data) + b * a.q.s0 + t * a.q.s1, a.q,
        const_cast<T*>(static_cast<const T*>(a.q_out.data)) + b * a.q_out.s0 + t * a.q_out.s1,
        a.q_out, a.h_q, a.d, rotary, pos);
  } else if (a.seqlens_out != nullptr) {
    const int64_t b = (block - kv_blocks - q_blocks) * blockDim.x + threadIdx.x;
    if (b >= a.batch) return;
    // Clamped like the writes: the attention that reads these lengths stays inside the cache.
    const int64_t limit = a.capacity < INT32_MAX ? a.capacity : INT32_MAX;
    int64_t n = length_of(a, b) + a.s_new;
    n = n < 0 ? 0 : n > limit ? limit : n;
    a.seqlens_out[b * a.seqlens_out_stride] = static_cast<int32_t>(n);
  }
}

Rows rows(const TensorView& t) {
  if (!t.defined()) return {};
  return {t.data, t.stride[0], t.rank > 1 ? t.stride[1] : 0, t.rank > 2 ? t.stride[2] : 0};
}

// FLASHSERVE_CHECK_INDICES: the index tensors copied to the host and checked as on the CPU path.
void check_device_indices(const KvCacheAppendParams& params, const KvAppendProblem& pr,
                          cudaStream_t stream) {
  KvCacheAppendParams host = params;
  std::vector<std::vector<int32_t>> copies;
  copy_indices_to_host({&host.cache_seqlens, &host.cache_batch_idx, &host.block_table}, copies,
                       stream);
  check_host_indices(host, pr);
}

template <typename T, typename R>
void launch(const AppendArgs& a, int64_t blocks, int threads, cudaStream_t stream) {
  kv_cache_append_kernel<T, R><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(a);
}

}  // namespace

void cuda_kv_cache_append(const KvCacheAppendParams& p, const KvAppendProblem& pr) {
  if (pr.dtype == DType::kFloat64)
    throw Error(ErrorKind::kUnsupported, "k_cache", "float64 is not supported on CUDA");
  DeviceGuard guard(pr.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (check_indices_requested()) check_device_indices(p, pr, stream);

  AppendArgs a;
  a.k_new = rows(p.k_new);
  a.v_new = rows(p.v_new);
  a.k_cache = rows(p.k_cache);
  a.v_cache = rows(p.v_cache);
  a.q = rows(p.q);
  a.q_out = rows(p.q_out);
  a.cos = rows(p.rotary_cos);
  a.sin = rows(p.rotary_sin);
  if (p.cache_seqlens.defined()) {
    a.seqlens = p.cache_seqlens.ptr<const int32_t>();
    a.seqlens_stride = p.cache_seqlens.stride[0];
  }
  a.cache_seqlen = p.cache_seqlen;
  if (p.cache_batch_idx.defined()) {
    a.batch_idx = p.cache_batch_idx.ptr<const int32_t>();
    a.batch_idx_stride = p.cache_batch_idx.stride[0];
  }
  if (p.block_table.defined()) {
    a.table = p.block_table.ptr<const int32_t>();
    a.table_s0 = p.block_table.stride[0];
    a.table_s1 = p.block_table.stride[1];
  }
  if (p.seqlens_out.defined()) {
    a.seqlens_out = p.seqlens_out.ptr<int32_t>();
    a.seqlens_out_stride = p.seqlens_out.stride[0];
  }
  a.batch = pr.batch;
  a.s_new = pr.s_new;
  a.h_kv = pr.h_kv;
  a.d = pr.head_dim;
  a.dv = pr.head_dim_v;
  a.s_q = pr.s_q;
  a.h_q = pr.h_q;
  a.rotary_dim = pr.rotary_dim;
  a.s_rot = pr.s_rot;
  a.capacity = pr.capacity;
  a.cache_rows = pr.cache_rows;
  a.rows_per_entry = pr.rows_per_entry;
  a.paged = pr.paged;
  a.interleaved = p.rotary_interleaved;
  a.q_per_token = p.q_positions_per_token;

  constexpr int kThreads = 128;
  const int64_t blocks = pr.batch * pr.s_new + pr.batch * pr.s_q +
                         (p.seqlens_out.defined() ? (pr.batch + kThreads - 1) / kThreads : 0);
  if (blocks == 0) return;
  if (blocks > std::numeric_limits<int32_t>::max())
    throw Error(ErrorKind::kUnsupported, "k", "too many tokens for one launch");
  const DType rot = p.rotary_cos.defined() ? p.rotary_cos.dtype : DType::kFloat32;
  const bool rot_f32 = rot == DType::kFloat32;
  switch (pr.dtype) {
    case DType::kFloat32:
      launch<float, float>(a, blocks, kThreads, stream);
      break;
    case DType::kFloat16:
      rot_f32 ? launch<__half, float>(a, blocks, kThreads, stream)
              : launch<__half, __half>(a, blocks, kThreads, stream);
      break;
    case DType::kFloat8E4M3:  // byte copies (validation refused rotary)
      launch<E4m3Code, float>(a, blocks, kThreads, stream);
      break;
    default:
      rot_f32 ? launch<__nv_bfloat16, float>(a, blocks, kThreads, stream)
              : launch<__nv_bfloat16, __nv_bfloat16>(a, blocks, kThreads, stream);
      break;
  }
  check_cuda(cudaGetLastError(), "kv_cache_append launch");
}

}  // namespace flashserve::attention
