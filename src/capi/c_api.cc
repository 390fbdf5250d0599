// The extern "C" entry points of libflashserve_c.so: translate the plain C structs into
// flashserve::AttentionParams, call the C++ API, and turn every exception into a status code plus
// a per-thread message, so that nothing is ever thrown across the C boundary.
#include "flashserve/c_api.h"

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <utility>

#include "flashserve/attention.h"
#include "flashserve/attention_backward.h"
#include "flashserve/error.h"
#include "flashserve/kv_cache.h"
#include "flashserve/tensor.h"
#include "flashserve/version.h"

#if defined(FLASHSERVE_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace flashserve {
namespace {

static_assert(FS_MAX_RANK == kMaxRank);
static_assert(FS_FLOAT32 == static_cast<int>(DType::kFloat32));
static_assert(FS_FLOAT16 == static_cast<int>(DType::kFloat16));
static_assert(FS_BFLOAT16 == static_cast<int>(DType::kBFloat16));
static_assert(FS_INT32 == static_cast<int>(DType::kInt32));
static_assert(FS_FLOAT64 == static_cast<int>(DType::kFloat64));
static_assert(FS_FLOAT8_E4M3 == static_cast<int>(DType::kFloat8E4M3));
static_assert(FS_CPU == static_cast<int>(DeviceType::kCPU));
static_assert(FS_CUDA == static_cast<int>(DeviceType::kCUDA));
static_assert(FS_ERROR_INVALID_ARGUMENT == static_cast<int>(ErrorKind::kInvalidArgument));
static_assert(FS_ERROR_UNSUPPORTED == static_cast<int>(ErrorKind::kUnsupported));
static_assert(FS_ERROR_CUDA == static_cast<int>(ErrorKind::kCuda));
static_assert(FS_ERROR_INTERNAL == static_cast<int>(ErrorKind::kInternal));

// A fixed buffer rather than a std::string: recording an error must not allocate, so that even
// std::bad_alloc can be reported without a second exception escaping.
thread_local char g_last_error[2048] = "";

void set_error(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(g_last_error, sizeof g_last_error, format, args);
  va_end(args);
}

thread_local int g_last_status = FS_OK;

// Runs f, mapping whatever it throws to a status code and the thread's message.
template <typename F>
int guarded_call(F&& f) noexcept {
  g_last_error[0] = '\0';
  try {
    f();
    return FS_OK;
  } catch (const Error& e) {
    set_error("%s", e.what());
    return static_cast<int>(e.kind());
  } catch (const std::bad_alloc&) {
    set_error("out of host memory");
    return FS_ERROR_INTERNAL;
  } catch (const std::exception& e) {
    set_error("internal error: %s", e.what());
    return FS_ERROR_INTERNAL;
  } catch (...) {
    set_error("internal error: unknown exception");
    return FS_ERROR_INTERNAL;
  }
}

template <typename F>
int guarded(F&& f) noexcept {
  g_last_status = guarded_call(std::forward<F>(f));
  return g_last_status;
}

[[noreturn]] void invalid(const char* name, const char* format, ...) {
  char what[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(what, sizeof what, format, args);
  va_end(args);
  throw Error(ErrorKind::kInvalidArgument, name, what);
}

int32_t owning_cuda_device(const void* data, const char* name) {
#if defined(FLASHSERVE_WITH_CUDA)
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, data);
  if (status != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it so later calls do not see it
    throw Error(
        ErrorKind::kCuda, name,
        std::string("cannot find the device of the data pointer: ") + cudaGetErrorString(status));
  }
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    invalid(name, "device type is CUDA, but the data pointer is not CUDA device memory");
  return attributes.device;
#else
  (void)data;
  (void)name;
  return 0;  // dispatch reports that this build has no CUDA
#endif
}

TensorView to_view(const fs_tensor& t, const char* name) {
  TensorView view;
  if (t.rank == 0 && t.data == nullptr) return view;  // absent
  if (t.rank < 0 || t.rank > kMaxRank)
    invalid(name, "rank %d is not supported (0..%d)", t.rank, kMaxRank);
  if (t.dtype < FS_FLOAT32 || t.dtype > FS_FLOAT8_E4M3)
    invalid(name, "unknown dtype code %d", t.dtype);
  if (t.device_type != FS_CPU && t.device_type != FS_CUDA)
    invalid(name, "unknown device type code %d", t.device_type);
  view.data = t.data;
  view.dtype = static_cast<DType>(t.dtype);
  view.device.type = static_cast<DeviceType>(t.device_type);
  view.device.index = t.device_index;
  if (view.device.type == DeviceType::kCPU) {
    view.device.index = 0;
  } else if (t.device_index < 0) {
    if (t.device_index != -1) invalid(name, "device index %d is not valid", t.device_index);
    view.device.index = t.data ? owning_cuda_device(t.data, name) : 0;
  }
  view.rank = t.rank;
  for (int i = 0; i < t.rank; ++i) {
    view.shape[i] = t.shape[i];
    view.stride[i] = t.strides[i];
  }
  return view;
}

AttentionParams to_params(const fs_attention_params* p) {
  if (p == nullptr) throw Error(ErrorKind::kInvalidArgument, "params", "null pointer");
  AttentionParams params;
  params.q = to_view(p->q, "q");
  params.k = to_view(p->k, "k");
  params.v = to_view(p->v, "v");
  params.out = to_view(p->out, "out");
  params.lse = to_view(p->lse, "lse");
  params.cu_seqlens_q = to_view(p->cu_seqlens_q, "cu_seqlens_q");
  params.cu_seqlens_k = to_view(p->cu_seqlens_k, "cu_seqlens_k");
  params.seqused_k = to_view(p->seqused_k, "seqused_k");
  params.block_table = to_view(p->block_table, "block_table");
  params.max_seqlen_q = p->max_seqlen_q;
  params.max_seqlen_k = p->max_seqlen_k;
  params.softmax_scale = p->softmax_scale;
  params.causal = p->causal != 0;
  params.window_left = p->window_left;
  params.window_right = p->window_right;
  params.num_splits = p->num_splits;
  params.stream = p->stream;
  params.workspace = p->workspace;
  params.workspace_bytes = p->workspace_bytes;
  return params;
}

AttentionParams to_params(const fs_attention_params_v3* p) {
  if (p == nullptr) throw Error(ErrorKind::kInvalidArgument, "params", "null pointer");
  AttentionParams params = to_params(&p->base);
  params.softcap = p->softcap;
  params.alibi_slopes = to_view(p->alibi_slopes, "alibi_slopes");
  return params;
}

AttentionParams to_params(const fs_attention_params_v4* p) {
  if (p == nullptr) throw Error(ErrorKind::kInvalidArgument, "params", "null pointer");
  AttentionParams params = to_params(&p->base);
  params.q_descale = to_view(p->q_descale, "q_descale");
  params.k_descale = to_view(p->k_descale, "k_descale");
  params.v_descale = to_view(p->v_descale, "v_descale");
  return params;
}

// For fs_attention_backward_params (ABI 2) and fs_attention_backward_params_v3 alike.
template <typename P>
AttentionBackwardParams to_backward_params(const P* p) {
  if (p == nullptr) throw Error(ErrorKind::kInvalidArgument, "params", "null pointer");
  AttentionBackwardParams params;
  params.attn = to_params(&p->attn);
  params.dout = to_view(p->dout, "dout");
  params.dlse = to_view(p->dlse, "dlse");
  params.dq = to_view(p->dq, "dq");
  params.dk = to_view(p->dk, "dk");
  params.dv = to_view(p->dv, "dv");
  params.deterministic = p->deterministic != 0;
  return params;
}

KvCacheAppendParams to_append_params(const fs_kvcache_append_params* p) {
  if (p == nullptr) throw Error(ErrorKind::kInvalidArgument, "params", "null pointer");
  KvCacheAppendParams params;
  params.k_cache = to_view(p->k_cache, "k_cache");
  params.v_cache = to_view(p->v_cache, "v_cache");
  params.k_new = to_view(p->k_new, "k");
  params.v_new = to_view(p->v_new, "v");
  params.cache_seqlens = to_view(p->cache_seqlens, "cache_seqlens");
  params.cache_seqlen = p->cache_seqlen;
  params.cache_batch_idx = to_view(p->cache_batch_idx, "cache_batch_idx");
  params.block_table = to_view(p->block_table, "block_table");
  params.rotary_cos = to_view(p->rotary_cos, "rotary_cos");
  params.rotary_sin = to_view(p->rotary_sin, "rotary_sin");
  params.rotary_interleaved = p->rotary_interleaved != 0;
  params.q_positions_per_token = p->q_positions_per_token != 0;
  params.q = to_view(p->q, "q");
  params.q_out = to_view(p->q_out, "q_out");
  params.seqlens_out = to_view(p->seqlens_out, "seqlens_out");
  params.stream = p->stream;
  return params;
}

}  // namespace
}  // namespace flashserve

namespace flashserve {
namespace {

// The bodies of the entry points, once for the ABI-2 and the ABI-3 structs.
template <typename P>
int validate_call(const P* params) {
  return guarded([&] { validate(to_params(params)); });
}
template <typename P>
int forward_call(const P* params) {
  return guarded([&] { attention_forward(to_params(params)); });
}
template <typename P>
size_t workspace_size_call(const P* params) {
  size_t bytes = 0;
  const int status = guarded([&] { bytes = attention_workspace_size(to_params(params)); });
  return status == FS_OK ? bytes : SIZE_MAX;
}
template <typename P>
int backward_validate_call(const P* params) {
  return guarded([&] { validate(to_backward_params(params)); });
}
template <typename P>
int backward_call(const P* params) {
  return guarded([&] { attention_backward(to_backward_params(params)); });
}
template <typename P>
size_t backward_workspace_size_call(const P* params) {
  size_t bytes = 0;
  const int status =
      guarded([&] { bytes = attention_backward_workspace_size(to_backward_params(params)); });
  return status == FS_OK ? bytes : SIZE_MAX;
}

}  // namespace
}  // namespace flashserve

extern "C" {

// project(VERSION) of the top-level CMakeLists.txt, through the generated flashserve/version.h.
FS_API const char* fs_version(void) {
  return FLASHSERVE_VERSION;
}
FS_API int fs_abi_version(void) {
  return FS_ABI_VERSION;
}
FS_API size_t fs_sizeof_tensor(void) {
  return sizeof(fs_tensor);
}
FS_API size_t fs_sizeof_attention_params(void) {
  return sizeof(fs_attention_params);
}

FS_API void fs_attention_params_init(fs_attention_params* params) {
  if (params == nullptr) return;
  *params = fs_attention_params{};
  const flashserve::AttentionParams defaults;
  params->window_left = defaults.window_left;
  params->window_right = defaults.window_right;
  params->num_splits = defaults.num_splits;
  params->softmax_scale = defaults.softmax_scale;
}

FS_API int fs_built_with_cuda(void) {
#if defined(FLASHSERVE_WITH_CUDA)
  return 1;
#else
  return 0;
#endif
}

FS_API int fs_cuda_available(void) {
#if defined(FLASHSERVE_WITH_CUDA)
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for this query
    return 0;
  }
  return count > 0 ? 1 : 0;
#else
  return 0;
#endif
}

FS_API int fs_attention_validate(const fs_attention_params* params) {
  return flashserve::validate_call(params);
}
FS_API int fs_attention_forward(const fs_attention_params* params) {
  return flashserve::forward_call(params);
}
FS_API size_t fs_attention_workspace_size(const fs_attention_params* params) {
  return flashserve::workspace_size_call(params);
}

FS_API void fs_attention_params_v3_init(fs_attention_params_v3* params) {
  if (params == nullptr) return;
  *params = fs_attention_params_v3{};
  fs_attention_params_init(&params->base);
  params->softcap = flashserve::AttentionParams{}.softcap;
}
FS_API size_t fs_sizeof_attention_params_v3(void) {
  return sizeof(fs_attention_params_v3);
}
FS_API int fs_attention_validate_v3(const fs_attention_params_v3* params) {
  return flashserve::validate_call(params);
}
FS_API int fs_attention_forward_v3(const fs_attention_params_v3* params) {
  return flashserve::forward_call(params);
}
FS_API size_t fs_attention_workspace_size_v3(const fs_attention_params_v3* params) {
  return flashserve::workspace_size_call(params);
}

FS_API void fs_attention_params_v4_init(fs_attention_params_v4* params) {
  if (params == nullptr) return;
  *params = fs_attention_params_v4{};
  fs_attention_params_v3_init(&params->base);
}
FS_API size_t fs_sizeof_attention_params_v4(void) {
  return sizeof(fs_attention_params_v4);
}
FS_API int fs_attention_validate_v4(const fs_attention_params_v4* params) {
  return flashserve::validate_call(params);
}
FS_API int fs_attention_forward_v4(const fs_attention_params_v4* params) {
  return flashserve::forward_call(params);
}
FS_API size_t fs_attention_workspace_size_v4(const fs_attention_params_v4* params) {
  return flashserve::workspace_size_call(params);
}

FS_API void fs_attention_backward_params_init(fs_attention_backward_params* params) {
  if (params == nullptr) return;
  *params = fs_attention_backward_params{};
  fs_attention_params_init(&params->attn);
  params->deterministic = flashserve::AttentionBackwardParams{}.deterministic ? 1 : 0;
}

FS_API size_t fs_sizeof_attention_backward_params(void) {
  return sizeof(fs_attention_backward_params);
}

FS_API int fs_attention_backward_validate(const fs_attention_backward_params* params) {
  return flashserve::backward_validate_call(params);
}
FS_API int fs_attention_backward(const fs_attention_backward_params* params) {
  return flashserve::backward_call(params);
}
FS_API size_t fs_attention_backward_workspace_size(const fs_attention_backward_params* params) {
  return flashserve::backward_workspace_size_call(params);
}

FS_API void fs_attention_backward_params_v3_init(fs_attention_backward_params_v3* params) {
  if (params == nullptr) return;
  *params = fs_attention_backward_params_v3{};
  fs_attention_params_v3_init(&params->attn);
  params->deterministic = flashserve::AttentionBackwardParams{}.deterministic ? 1 : 0;
}
FS_API size_t fs_sizeof_attention_backward_params_v3(void) {
  return sizeof(fs_attention_backward_params_v3);
}
FS_API int fs_attention_backward_validate_v3(const fs_attention_backward_params_v3* params) {
  return flashserve::backward_validate_call(params);
}
FS_API int fs_attention_backward_v3(const fs_attention_backward_params_v3* params) {
  return flashserve::backward_call(params);
}
FS_API size_t
fs_attention_backward_workspace_size_v3(const fs_attention_backward_params_v3* params) {
  return flashserve::backward_workspace_size_call(params);
}

FS_API void fs_kvcache_append_params_init(fs_kvcache_append_params* params) {
  if (params == nullptr) return;
  *params = fs_kvcache_append_params{};
  const flashserve::KvCacheAppendParams defaults;
  params->rotary_interleaved = defaults.rotary_interleaved ? 1 : 0;
}

FS_API size_t fs_sizeof_kvcache_append_params(void) {
  return sizeof(fs_kvcache_append_params);
}

FS_API int fs_kvcache_append_validate(const fs_kvcache_append_params* params) {
  return flashserve::guarded([&] { flashserve::validate(flashserve::to_append_params(params)); });
}

FS_API int fs_kvcache_append(const fs_kvcache_append_params* params) {
  return flashserve::guarded(
      [&] { flashserve::kv_cache_append(flashserve::to_append_params(params)); });
}

FS_API int fs_cuda_stream_synchronize(void* stream) {
  return flashserve::guarded([&] {
#if defined(FLASHSERVE_WITH_CUDA)
    const cudaError_t status = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
    if (status != cudaSuccess)
      throw flashserve::Error(
          flashserve::ErrorKind::kCuda, "stream",
          std::string("cudaStreamSynchronize failed: ") + cudaGetErrorString(status));
#else
    (void)stream;
    throw flashserve::Error(flashserve::ErrorKind::kUnsupported, "stream",
                            "this flashserve was built without CUDA");
#endif
  });
}

FS_API const char* fs_last_error(void) {
  return flashserve::g_last_error;
}

FS_API int fs_last_status(void) {
  return flashserve::g_last_status;
}

}  // extern "C"
