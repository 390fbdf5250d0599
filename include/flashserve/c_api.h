/* The C ABI of flashserve (libflashserve_c.so): what the Python package loads with ctypes, and what
 * any other language can bind without a C++ compiler. Plain C99; no exception crosses it.
 *
 * Every function that can fail returns 0 on success or an fs_status code (the values of
 * flashserve::ErrorKind), and leaves a message naming the argument at fault in fs_last_error().
 * The message is per thread and is cleared at the start of every call that can fail.
 *
 * Tensors are described, never owned: a data pointer, a dtype code, the device, and the shape and
 * strides (in elements, not bytes) of up to 4 dimensions. An absent optional tensor is all zeros
 * (rank 0 and a null data pointer). Layouts and semantics are those of flashserve/attention.h. */
#ifndef FLASHSERVE_C_API_H_
#define FLASHSERVE_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FS_API __declspec(dllexport)
#else
#define FS_API __attribute__((visibility("default")))
#endif

/* Bumped whenever a struct below or a function signature changes; bindings check it.
 * 3: the score modifiers (softcap, ALiBi) in fs_attention_params_v3 and the *_v3 functions; every
 *    ABI-2 struct and function is unchanged (a program built against ABI 2 keeps working).
 * 4: FS_FLOAT8_E4M3 and fs_attention_params_v4 (the e4m3 descale factors) with the *_v4 forward
 *    functions; every ABI-2 and ABI-3 struct and function is unchanged. */
#define FS_ABI_VERSION 4

typedef enum fs_status {
  FS_OK = 0,
  FS_ERROR_INVALID_ARGUMENT = 1, /* malformed shape, stride, dtype, length, ... */
  FS_ERROR_UNSUPPORTED = 2,      /* well-formed, but nothing implements it (head dim, device) */
  FS_ERROR_CUDA = 3,             /* the CUDA runtime reported an error */
  FS_ERROR_INTERNAL = 4          /* a bug in flashserve, or out of host memory */
} fs_status;

typedef enum fs_dtype {
  FS_FLOAT32 = 0,
  FS_FLOAT16 = 1,
  FS_BFLOAT16 = 2,
  FS_INT32 = 3,
  FS_FLOAT64 = 4,
  FS_FLOAT8_E4M3 = 5 /* float8_e4m3fn: q, k, v of an FP8 call (fs_attention_params_v4); the
                        caches and new k, v of fs_kvcache_append (codes copied, no rotary) */
} fs_dtype;

typedef enum fs_device_type { FS_CPU = 0, FS_CUDA = 1 } fs_device_type;

#define FS_MAX_RANK 4

typedef struct fs_tensor {
  void* data;
  int32_t dtype;        /* an fs_dtype */
  int32_t device_type;  /* an fs_device_type */
  int32_t device_index; /* CUDA ordinal; -1: the device that owns `data` (looked up) */
  int32_t rank;         /* 0..FS_MAX_RANK; 0 with data == NULL: absent */
  int64_t shape[FS_MAX_RANK];
  int64_t strides[FS_MAX_RANK]; /* in elements */
} fs_tensor;

/* Mirrors flashserve::AttentionParams field by field. */
typedef struct fs_attention_params {
  fs_tensor q, k, v, out;
  fs_tensor lse;          /* optional float32 */
  fs_tensor cu_seqlens_q; /* optional int32 [batch + 1] */
  fs_tensor cu_seqlens_k; /* optional int32 [batch + 1]; not with block_table */
  fs_tensor seqused_k;    /* optional int32 [batch]; required with block_table */
  fs_tensor block_table;  /* optional int32 [batch, pages_per_seq] */
  int64_t max_seqlen_q;   /* varlen: upper bound of every q_len (required on CUDA) */
  int64_t max_seqlen_k;   /* varlen/paged: upper bound of every kv_len (required on CUDA) */
  float softmax_scale;    /* 0: 1/sqrt(head_dim); subnormal values are refused */
  int32_t causal;         /* nonzero: causal (bottom-right aligned) */
  int32_t window_left;    /* -1: unbounded */
  int32_t window_right;   /* -1: unbounded (0 when causal) */
  int32_t num_splits;     /* split-KV: 1 none, 0 automatic, n > 1 exactly n */
  void* stream;           /* cudaStream_t for CUDA tensors (NULL: the legacy default stream) */
  void* workspace;        /* device scratch of fs_attention_workspace_size() bytes */
  size_t workspace_bytes;
} fs_attention_params;

/* ABI 3: fs_attention_params (unchanged, as `base`) and the score modifiers of
 * flashserve::AttentionParams (flashserve/attention.h): the scaled score s becomes
 * softcap * tanh(s / softcap), then s - slope * |p - j| (ALiBi), before the mask. On CUDA the
 * forward runs them (sm80 kernels); the CUDA backward and a forced sm90 refuse them
 * (FS_ERROR_UNSUPPORTED naming softcap or alibi_slopes). The ABI-2 functions taking
 * fs_attention_params are these with softcap 0 and no slopes. */
typedef struct fs_attention_params_v3 {
  fs_attention_params base;
  float softcap;          /* > 0: tanh capping; 0: off; negative or subnormal: refused */
  fs_tensor alibi_slopes; /* optional float32 [h_q] or [batch, h_q] */
} fs_attention_params_v3;

/* ABI 4: fs_attention_params_v3 (unchanged, as `base`) and FlashAttention-3's descale factors of
 * FP8 inputs (flashserve/attention.h): q, k and v all FS_FLOAT8_E4M3 with out bfloat16, or k and v
 * alone e4m3 beside a float32/float16/bfloat16 q and out of q's dtype. Each factor is optional
 * float32 [batch, h_kv] (absent: 1) and only allowed beside an e4m3 tensor of its name. The CPU
 * path computes on the dequantised values; the CUDA kernels refuse e4m3 (FS_ERROR_UNSUPPORTED)
 * until the sm90 FP8 kernel exists. The v3 functions take e4m3 tensors too, with every factor 1. */
typedef struct fs_attention_params_v4 {
  fs_attention_params_v3 base;
  fs_tensor q_descale, k_descale, v_descale;
} fs_attention_params_v4;

/* Mirrors flashserve::AttentionBackwardParams (flashserve/attention_backward.h): the gradients
 * dq, dk, dv of the attention that `attn` describes (its forward call: out and lse as the forward
 * wrote them; lse required; its stream and workspace serve this call), given dout and optionally
 * dlse. */
typedef struct fs_attention_backward_params {
  fs_attention_params attn;
  fs_tensor dout;        /* out's shape, q's dtype */
  fs_tensor dlse;        /* optional float32, lse's shape */
  fs_tensor dq, dk, dv;  /* outputs: q's, k's, v's shapes and dtype */
  int32_t deterministic; /* nonzero: bit-identical run to run (the CPU path always is) */
} fs_attention_backward_params;

/* ABI 3: fs_attention_backward_params with the forward's score modifiers (the gradient flows
 * through the softcap's tanh; none flows to the ALiBi slopes). */
typedef struct fs_attention_backward_params_v3 {
  fs_attention_params_v3 attn;
  fs_tensor dout;
  fs_tensor dlse;
  fs_tensor dq, dk, dv;
  int32_t deterministic;
} fs_attention_backward_params_v3;

/* Mirrors flashserve::KvCacheAppendParams (flashserve/kv_cache.h): appends new keys and values to
 * a KV cache in place at cache_seqlens, with optional rotary embedding of the new keys and of q.
 * Caches FS_FLOAT32, FS_FLOAT16, FS_BFLOAT16, or FS_FLOAT8_E4M3 (an fp8 KV cache: k_new and v_new
 * e4m3 codes too, copied byte for byte; rotary refused, FS_ERROR_UNSUPPORTED naming rotary_cos).
 * The struct is unchanged since ABI 2 and FS_ABI_VERSION with it (the dtype travels in each
 * fs_tensor); a library from before e4m3 caches refuses them naming k_cache, which
 * fs_kvcache_append_validate tells a binding without writing anything. */
typedef struct fs_kvcache_append_params {
  fs_tensor k_cache, v_cache; /* [b_cache, s_cache, h_kv, d] or paged [pages, page_size, h_kv, d] */
  fs_tensor k_new, v_new;     /* optional [batch, s_new, h_kv, d] */
  fs_tensor cache_seqlens;    /* optional int32 [batch]; absent: cache_seqlen for every sequence */
  int64_t cache_seqlen;
  fs_tensor cache_batch_idx; /* optional int32 [batch]: cache row of each sequence (not paged) */
  fs_tensor block_table;     /* optional int32 [batch, pages_per_seq]: paged cache */
  fs_tensor rotary_cos, rotary_sin; /* optional [s_rot, rotary_dim / 2], float32 or the dtype */
  int32_t rotary_interleaved;       /* nonzero: pairs (2i, 2i + 1); 0: (i, i + rotary_dim / 2) */
  int32_t q_positions_per_token;    /* nonzero: q token i at cache_seqlens + i; 0: all at it */
  fs_tensor q, q_out;               /* optional [batch, s_q, h_q, d]: q rotated into q_out */
  fs_tensor seqlens_out;            /* optional int32 [batch]: cache_seqlens + s_new */
  void* stream; /* cudaStream_t for CUDA tensors (NULL: the legacy default stream) */
} fs_kvcache_append_params;

/* Fills params with the defaults of flashserve::AttentionParams: every tensor absent, windows -1
 * (unbounded), num_splits 1, everything else 0. Start from this rather than from memset 0, which
 * would mean window_left = window_right = 0 (each query sees only its own position). */
FS_API void fs_attention_params_init(fs_attention_params* params);

/* The version of the library (FLASHSERVE_VERSION of flashserve/version.h as it was built, e.g.
 * "0.1.0"), and FS_ABI_VERSION as it was built. */
FS_API const char* fs_version(void);
FS_API int fs_abi_version(void);
/* sizeof of the two structs as the library sees them (a binding checks its own layout). */
FS_API size_t fs_sizeof_tensor(void);
FS_API size_t fs_sizeof_attention_params(void);

/* 1 if the library was built with CUDA kernels, else 0. */
FS_API int fs_built_with_cuda(void);
/* 1 if built with CUDA and at least one CUDA device is usable now, else 0. Never fails. */
FS_API int fs_cuda_available(void);

/* Checks params against the contract without running anything. */
FS_API int fs_attention_validate(const fs_attention_params* params);
/* Validates, then computes out (and lse) on the device that holds the tensors. CUDA work is
 * enqueued on params->stream and may still be running when this returns. */
FS_API int fs_attention_forward(const fs_attention_params* params);
/* Bytes of device workspace that fs_attention_forward needs for params (0 when none), or SIZE_MAX
 * when params are invalid or the CUDA runtime fails (then fs_last_error() says why). */
FS_API size_t fs_attention_workspace_size(const fs_attention_params* params);

/* Fills params with the defaults of flashserve::AttentionBackwardParams: attn as
 * fs_attention_params_init leaves it, every gradient tensor absent, deterministic 0. */
FS_API void fs_attention_backward_params_init(fs_attention_backward_params* params);
FS_API size_t fs_sizeof_attention_backward_params(void);
/* Checks params against the backward's contract without running anything. */
FS_API int fs_attention_backward_validate(const fs_attention_backward_params* params);
/* Validates, then computes dq, dk and dv on the device that holds the tensors (every element of
 * them is written; see flashserve/attention_backward.h). */
FS_API int fs_attention_backward(const fs_attention_backward_params* params);
/* Bytes of device workspace (in attn.workspace) that fs_attention_backward needs (0 when none),
 * or SIZE_MAX when params are invalid (then fs_last_error() says why). */
FS_API size_t fs_attention_backward_workspace_size(const fs_attention_backward_params* params);

/* The ABI-3 forms of the six functions above: the same behaviour, with the score modifiers.
 * _init fills base as fs_attention_params_init does (attn as fs_attention_backward_params_init),
 * softcap 0, alibi_slopes absent. */
FS_API void fs_attention_params_v3_init(fs_attention_params_v3* params);
FS_API size_t fs_sizeof_attention_params_v3(void);
FS_API int fs_attention_validate_v3(const fs_attention_params_v3* params);
FS_API int fs_attention_forward_v3(const fs_attention_params_v3* params);
FS_API size_t fs_attention_workspace_size_v3(const fs_attention_params_v3* params);
FS_API void fs_attention_backward_params_v3_init(fs_attention_backward_params_v3* params);
FS_API size_t fs_sizeof_attention_backward_params_v3(void);
FS_API int fs_attention_backward_validate_v3(const fs_attention_backward_params_v3* params);
FS_API int fs_attention_backward_v3(const fs_attention_backward_params_v3* params);
FS_API size_t
fs_attention_backward_workspace_size_v3(const fs_attention_backward_params_v3* params);

/* The ABI-4 forms of the forward's functions: the v3 behaviour with the descale factors. _init
 * fills base as fs_attention_params_v3_init does, every factor absent. (No backward takes e4m3.) */
FS_API void fs_attention_params_v4_init(fs_attention_params_v4* params);
FS_API size_t fs_sizeof_attention_params_v4(void);
FS_API int fs_attention_validate_v4(const fs_attention_params_v4* params);
FS_API int fs_attention_forward_v4(const fs_attention_params_v4* params);
FS_API size_t fs_attention_workspace_size_v4(const fs_attention_params_v4* params);

/* Fills params with the defaults of flashserve::KvCacheAppendParams (every tensor absent,
 * rotary_interleaved 1, everything else 0). */
FS_API void fs_kvcache_append_params_init(fs_kvcache_append_params* params);
FS_API size_t fs_sizeof_kvcache_append_params(void);
/* Checks params without running anything (host-resident lengths and indices entry by entry). */
FS_API int fs_kvcache_append_validate(const fs_kvcache_append_params* params);
/* Validates, then appends (and rotates) on the device that holds the cache; CUDA work is enqueued
 * on params->stream. A sequence whose cache_seqlens + s_new exceeds the capacity is an
 * FS_ERROR_INVALID_ARGUMENT when the lengths are in host memory (or FLASHSERVE_CHECK_INDICES is
 * set); device-resident lengths are trusted, and the kernel then drops what does not fit rather
 * than write out of bounds (flashserve/kv_cache.h). */
FS_API int fs_kvcache_append(const fs_kvcache_append_params* params);

/* Waits until all work on a CUDA stream (NULL: the legacy default stream) has finished. */
FS_API int fs_cuda_stream_synchronize(void* stream);

/* The message of the last failed call on this thread; "" when the last call succeeded. */
FS_API const char* fs_last_error(void);
/* The fs_status of the last call on this thread that can fail (FS_OK when it succeeded): what a
 * function without a status return (fs_attention_workspace_size) failed with. */
FS_API int fs_last_status(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHSERVE_C_API_H_ */
