"""ctypes binding of libflashserve_c.so (include/flashserve/c_api.h).

The library is found, in this order, at
  1. $FLASHSERVE_LIBRARY (a path to the .so; an error if it does not exist),
  2. next to the package: flashserve/libflashserve_c.so or the folder above the package,
  3. build/*/src/libflashserve_c.so of the source checkout the package sits in (the most recently
     built one when there are several; sanitizer builds are skipped).
It is loaded on first use, so `import flashserve` never fails for want of it.
"""

import ctypes
import glob
import os
import threading

LIBRARY_NAME = "libflashserve_c.so"
ABI_VERSION = 4  # FS_ABI_VERSION of the header these structs mirror
MAX_RANK = 4

# fs_dtype, fs_device_type and fs_status codes.
FLOAT32, FLOAT16, BFLOAT16, INT32, FLOAT64, FLOAT8_E4M3 = 0, 1, 2, 3, 4, 5
DTYPE_NAMES = {FLOAT32: "float32", FLOAT16: "float16", BFLOAT16: "bfloat16", INT32: "int32",
               FLOAT64: "float64", FLOAT8_E4M3: "float8_e4m3fn"}
CPU, CUDA = 0, 1
OK, INVALID_ARGUMENT, UNSUPPORTED, CUDA_ERROR, INTERNAL = 0, 1, 2, 3, 4


class Tensor(ctypes.Structure):
    """fs_tensor."""
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("device_type", ctypes.c_int32),
        ("device_index", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_RANK),
        ("strides", ctypes.c_int64 * MAX_RANK),
    ]


class AttentionParams(ctypes.Structure):
    """fs_attention_params."""
    _fields_ = [
        ("q", Tensor), ("k", Tensor), ("v", Tensor), ("out", Tensor), ("lse", Tensor),
        ("cu_seqlens_q", Tensor), ("cu_seqlens_k", Tensor), ("seqused_k", Tensor),
        ("block_table", Tensor),
        ("max_seqlen_q", ctypes.c_int64),
        ("max_seqlen_k", ctypes.c_int64),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
    ]


class AttentionBackwardParams(ctypes.Structure):
    """fs_attention_backward_params."""
    _fields_ = [
        ("attn", AttentionParams),
        ("dout", Tensor), ("dlse", Tensor), ("dq", Tensor), ("dk", Tensor), ("dv", Tensor),
        ("deterministic", ctypes.c_int32),
    ]


class AttentionParamsV3(ctypes.Structure):
    """fs_attention_params_v3: fs_attention_params (its fields reachable directly, params.q) and
    the score modifiers. What the package passes to the library."""
    _anonymous_ = ("base",)
    _fields_ = [
        ("base", AttentionParams),
        ("softcap", ctypes.c_float),
        ("alibi_slopes", Tensor),
    ]


class AttentionParamsV4(ctypes.Structure):
    """fs_attention_params_v4: fs_attention_params_v3 (its fields reachable directly) and the
    descale factors of e4m3 inputs."""
    _anonymous_ = ("base",)
    _fields_ = [
        ("base", AttentionParamsV3),
        ("q_descale", Tensor), ("k_descale", Tensor), ("v_descale", Tensor),
    ]


class AttentionBackwardParamsV3(ctypes.Structure):
    """fs_attention_backward_params_v3."""
    _fields_ = [
        ("attn", AttentionParamsV3),
        ("dout", Tensor), ("dlse", Tensor), ("dq", Tensor), ("dk", Tensor), ("dv", Tensor),
        ("deterministic", ctypes.c_int32),
    ]


class KvCacheAppendParams(ctypes.Structure):
    """fs_kvcache_append_params."""
    _fields_ = [
        ("k_cache", Tensor), ("v_cache", Tensor), ("k_new", Tensor), ("v_new", Tensor),
        ("cache_seqlens", Tensor),
        ("cache_seqlen", ctypes.c_int64),
        ("cache_batch_idx", Tensor), ("block_table", Tensor),
        ("rotary_cos", Tensor), ("rotary_sin", Tensor),
        ("rotary_interleaved", ctypes.c_int32),
        ("q_positions_per_token", ctypes.c_int32),
        ("q", Tensor), ("q_out", Tensor), ("seqlens_out", Tensor),
        ("stream", ctypes.c_void_p),
    ]


_SIGNATURES = {
    "fs_version": (ctypes.c_char_p, []),
    "fs_abi_version": (ctypes.c_int, []),
    "fs_sizeof_tensor": (ctypes.c_size_t, []),
    "fs_sizeof_attention_params": (ctypes.c_size_t, []),
    "fs_attention_params_init": (None, [ctypes.POINTER(AttentionParams)]),
    "fs_built_with_cuda": (ctypes.c_int, []),
    "fs_cuda_available": (ctypes.c_int, []),
    "fs_attention_validate": (ctypes.c_int, [ctypes.POINTER(AttentionParams)]),
    "fs_attention_forward": (ctypes.c_int, [ctypes.POINTER(AttentionParams)]),
    "fs_attention_workspace_size": (ctypes.c_size_t, [ctypes.POINTER(AttentionParams)]),
    "fs_attention_backward_params_init": (None, [ctypes.POINTER(AttentionBackwardParams)]),
    "fs_sizeof_attention_backward_params": (ctypes.c_size_t, []),
    "fs_attention_backward_validate": (ctypes.c_int, [ctypes.POINTER(AttentionBackwardParams)]),
    "fs_attention_backward": (ctypes.c_int, [ctypes.POINTER(AttentionBackwardParams)]),
    "fs_attention_backward_workspace_size": (ctypes.c_size_t,
                                             [ctypes.POINTER(AttentionBackwardParams)]),
    "fs_attention_params_v3_init": (None, [ctypes.POINTER(AttentionParamsV3)]),
    "fs_sizeof_attention_params_v3": (ctypes.c_size_t, []),
    "fs_attention_validate_v3": (ctypes.c_int, [ctypes.POINTER(AttentionParamsV3)]),
    "fs_attention_forward_v3": (ctypes.c_int, [ctypes.POINTER(AttentionParamsV3)]),
    "fs_attention_workspace_size_v3": (ctypes.c_size_t, [ctypes.POINTER(AttentionParamsV3)]),
    "fs_attention_params_v4_init": (None, [ctypes.POINTER(AttentionParamsV4)]),
    "fs_sizeof_attention_params_v4": (ctypes.c_size_t, []),
    "fs_attention_validate_v4": (ctypes.c_int, [ctypes.POINTER(AttentionParamsV4)]),
    "fs_attention_forward_v4": (ctypes.c_int, [ctypes.POINTER(AttentionParamsV4)]),
    "fs_attention_workspace_size_v4": (ctypes.c_size_t, [ctypes.POINTER(AttentionParamsV4)]),
    "fs_attention_backward_params_v3_init": (None, [ctypes.POINTER(AttentionBackwardParamsV3)]),
    "fs_sizeof_attention_backward_params_v3": (ctypes.c_size_t, []),
    "fs_attention_backward_validate_v3": (ctypes.c_int,
                                          [ctypes.POINTER(AttentionBackwardParamsV3)]),
    "fs_attention_backward_v3": (ctypes.c_int, [ctypes.POINTER(AttentionBackwardParamsV3)]),
    "fs_attention_backward_workspace_size_v3": (ctypes.c_size_t,
                                                [ctypes.POINTER(AttentionBackwardParamsV3)]),
    "fs_kvcache_append_params_init": (None, [ctypes.POINTER(KvCacheAppendParams)]),
    "fs_sizeof_kvcache_append_params": (ctypes.c_size_t, []),
    "fs_kvcache_append_validate": (ctypes.c_int, [ctypes.POINTER(KvCacheAppendParams)]),
    "fs_kvcache_append": (ctypes.c_int, [ctypes.POINTER(KvCacheAppendParams)]),
    "fs_cuda_stream_synchronize": (ctypes.c_int, [ctypes.c_void_p]),
    "fs_last_error": (ctypes.c_char_p, []),
    "fs_last_status": (ctypes.c_int, []),
}

_lock = threading.Lock()
_lib = None
_path = None


def candidate_paths():
    """Where the library is looked for, in order (FLASHSERVE_LIBRARY is handled separately)."""
    package_dir = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join(package_dir, LIBRARY_NAME),
             os.path.join(os.path.dirname(package_dir), LIBRARY_NAME)]
    repo = os.path.dirname(os.path.dirname(package_dir))
    built = []
    for build_dir in glob.glob(os.path.join(repo, "build", "*")):
        if _sanitized(build_dir):
            continue
        built += glob.glob(os.path.join(build_dir, "src", LIBRARY_NAME))
        built += glob.glob(os.path.join(build_dir, LIBRARY_NAME))
    built.sort(key=os.path.getmtime, reverse=True)
    return paths + built


def _sanitized(build_dir):
    """A FLASHSERVE_SANITIZE build: its library cannot be loaded into a plain interpreter (the ASan
    runtime must come first), so it is used only when FLASHSERVE_LIBRARY names it."""
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as cache:
            return any(line.startswith("FLASHSERVE_SANITIZE:BOOL=ON") for line in cache)
    except OSError:
        return False


def find_library():
    env = os.environ.get("FLASHSERVE_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise ImportError(f"FLASHSERVE_LIBRARY={env!r} does not name an existing file")
        return env
    for path in candidate_paths():
        if os.path.isfile(path):
            return path
    raise ImportError(
        f"flashserve: cannot find {LIBRARY_NAME}; set FLASHSERVE_LIBRARY to its path, put it next "
        f"to the package, or build it (cmake --build <build dir> --target flashserve_c). "
        "Looked in: "
        + ", ".join(candidate_paths()[:2] + ["build/*/src/ of the checkout"]))


def lib():
    """The loaded library, with argument and result types declared (loaded once)."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = find_library()
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                raise ImportError(f"flashserve: cannot load {path}: {e}") from e
            for name, (restype, argtypes) in _SIGNATURES.items():
                try:
                    fn = getattr(handle, name)
                except AttributeError as e:
                    raise ImportError(f"flashserve: {path} lacks {name}; rebuild it") from e
                fn.restype, fn.argtypes = restype, argtypes
            if handle.fs_abi_version() != ABI_VERSION:
                raise ImportError(f"flashserve: {path} has ABI version {handle.fs_abi_version()}, "
                                  f"this package expects {ABI_VERSION}; rebuild the library")
            if (handle.fs_sizeof_tensor() != ctypes.sizeof(Tensor) or
                    handle.fs_sizeof_attention_params() != ctypes.sizeof(AttentionParams) or
                    handle.fs_sizeof_attention_backward_params() !=
                    ctypes.sizeof(AttentionBackwardParams) or
                    handle.fs_sizeof_kvcache_append_params() !=
                    ctypes.sizeof(KvCacheAppendParams) or
                    handle.fs_sizeof_attention_params_v3() != ctypes.sizeof(AttentionParamsV3) or
                    handle.fs_sizeof_attention_params_v4() != ctypes.sizeof(AttentionParamsV4) or
                    handle.fs_sizeof_attention_backward_params_v3() !=
                    ctypes.sizeof(AttentionBackwardParamsV3)):
                raise ImportError(f"flashserve: the struct layout of {path} differs from the "
                                  "package's (different ABI or compiler); rebuild the library")
            _path = path
            _lib = handle
    return _lib


def library_path():
    """Path of the library in use (loads it)."""
    lib()
    return _path


def last_error():
    return lib().fs_last_error().decode("utf-8", "replace")


def raise_last():
    """Raises what the last failed call on this thread failed with (for the functions that return
    no status: fs_attention_workspace_size's SIZE_MAX)."""
    status = lib().fs_last_status()
    raise_for(status if status != OK else INTERNAL)


def raise_for(status):
    """Turns a nonzero fs_status into the matching Python exception with the library's message."""
    if status == OK:
        return
    message = last_error() or f"flashserve: error code {status}"
    if status == INVALID_ARGUMENT:
        raise ValueError(message)
    if status == UNSUPPORTED:
        raise NotImplementedError(message)
    if status == CUDA_ERROR:
        raise RuntimeError(f"CUDA error: {message}")
    raise RuntimeError(f"flashserve internal error: {message}")


def default_append_params():
    """fs_kvcache_append_params as fs_kvcache_append_params_init leaves it."""
    params = KvCacheAppendParams()
    lib().fs_kvcache_append_params_init(ctypes.byref(params))
    return params


def default_backward_params():
    """fs_attention_backward_params_v3 as fs_attention_backward_params_v3_init leaves it."""
    params = AttentionBackwardParamsV3()
    lib().fs_attention_backward_params_v3_init(ctypes.byref(params))
    return params


def default_params():
    """fs_attention_params_v3 as fs_attention_params_v3_init leaves it."""
    params = AttentionParamsV3()
    lib().fs_attention_params_v3_init(ctypes.byref(params))
    return params


def default_params_v4():
    """fs_attention_params_v4 as fs_attention_params_v4_init leaves it (descale factors absent)."""
    params = AttentionParamsV4()
    lib().fs_attention_params_v4_init(ctypes.byref(params))
    return params
