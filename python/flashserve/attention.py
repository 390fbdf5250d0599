"""FlashAttention's Python API (argument names, layouts, defaults) over libflashserve_c.

    from flashserve import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

is a drop-in replacement of the flash_attn imports for inference (forward only).

PyTorch tensors take the path of flashserve/_torch.py once PyTorch is imported (custom operators
that torch.compile and CUDA graphs see through, and a host path that skips DLPack); every other
framework, and PyTorch before it is registered, takes the generic path of this file.
"""

import ctypes
import math
import operator
import sys

from . import _capi, _tensor

# flashserve._torch once registered (register_torch()), else None. Read on every call: a global
# lookup and an isinstance, both of which torch.compile traces as constants.
_torch_path = None


def register_torch():
    """Registers flashserve's PyTorch custom operators (torch must already be imported or
    importable) and routes PyTorch tensors through them. Called by `import flashserve` when torch is
    already imported, and by the first call with a PyTorch tensor otherwise; idempotent."""
    global _torch_path
    if _torch_path is None:
        from . import _torch
        _torch.register()
        _torch_path = _torch
    return _torch_path


_torch_failed = False


def try_register_torch():
    """register_torch(), or a warning (once) and None when this PyTorch cannot take the custom
    operators: its tensors then take the generic path."""
    global _torch_failed
    if _torch_failed:
        return None
    try:
        return register_torch()
    except Exception as e:
        _torch_failed = True
        import warnings
        warnings.warn(f"flashserve: PyTorch custom operators not registered ({e!r}); PyTorch "
                      "tensors take the generic path", RuntimeWarning)
        return None


def _torch_route(q):
    """The PyTorch path when q is a PyTorch tensor (registering it on first sight), else None."""
    path = _torch_path
    if path is not None:
        return path if isinstance(q, path.Tensor) else None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(q, torch.Tensor):
        return try_register_torch()
    return None


def _check_dropout(dropout_p):
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p: dropout is not supported (flashserve has no "
                                  f"dropout, in the forward nor the backward); got {dropout_p}, "
                                  f"pass 0.0")


def _real(value, name, what):
    """float(value) for a real number; a TypeError naming `name` for anything else (strings and
    bools included: float("1") and float(True) would pass)."""
    if isinstance(value, (str, bytes, bool)) or value is None:
        raise TypeError(f"{name}: expected {what}, got {type(value).__name__}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected {what}, got {type(value).__name__}") from None


def _softcap(softcap):
    """flash_attn's softcap as the C field: a real number (0: off). The library refuses a
    negative, non-finite or subnormal one by name; here only what is no number at all, and what
    the float32 field would turn into "off"."""
    value = _real(softcap, "softcap", "a real number (0.0: off)")
    if value != 0.0 and math.isfinite(value) and ctypes.c_float(value).value == 0.0:
        raise ValueError(f"softcap: {value} is below float32's range; pass 0.0 for no capping")
    return value


def _results(q, path, out, lse, return_lse, return_attn_probs):
    """What flash_attn returns: out; (out, softmax_lse, S_dmask) with return_attn_probs, where
    S_dmask is the empty tensor (shape (0,), q's dtype) that FlashAttention-2 returns without
    dropout (flashserve has no dropout and never materialises the probabilities); (out, lse) with
    flashserve's keyword return_lse. `path`: the PyTorch path when q took it, else None."""
    if return_attn_probs:
        s_dmask = (path.empty(q, (0,)) if path is not None else
                   _tensor.empty(q, _tensor.framework_of(q), _tensor.device_of(q), (0,)))
        return out, lse, s_dmask
    return (out, lse) if return_lse else out


def _output_flags(return_lse, return_attn_probs):
    return_lse = _flag(return_lse, "return_lse")
    return_attn_probs = _flag(return_attn_probs, "return_attn_probs")
    if return_lse and return_attn_probs:
        raise ValueError("return_lse: pass return_attn_probs=True (flash_attn's (out, "
                         "softmax_lse, S_dmask)) or return_lse=True (out, lse), not both")
    return return_lse, return_attn_probs


_INT32 = (-2**31, 2**31 - 1)
_INT64 = (-2**63, 2**63 - 1)


def _int(value, name, bounds):
    """A Python int from an int, a NumPy integer or a one-element tensor (None: 0, unknown),
    checked against the bounds of the C field it goes into: ctypes would wrap it silently
    (num_splits=2**32 + 3 would run as 3)."""
    if value is None:
        return 0
    if hasattr(value, "item") and not isinstance(value, int):
        value = value.item()
    if isinstance(value, bool):
        # bool is an int subclass to Python (True would run as 1): never a meaningful count.
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}") from None
    lo, hi = bounds
    if not lo <= value <= hi:
        raise ValueError(f"{name}: {value} is outside [{lo}, {hi}]")
    return value


def _flag(value, name):
    """A bool (or NumPy bool, or the integers 0 and 1). Truthiness would read causal="False" as
    True: a different mask, silently."""
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_" or (not isinstance(value, float) and hasattr(value, "item")
                                           and getattr(value, "shape", None) == ()):
        value = value.item()
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name}: expected a bool, got {type(value).__name__} {value!r}")


def _window(window_size, causal):
    try:
        left, right = window_size
        if isinstance(left, bool) or isinstance(right, bool):
            raise TypeError
        left, right = operator.index(left), operator.index(right)
    except (TypeError, ValueError):
        raise ValueError(f"window_size: expected a pair of integers (left, right), "
                         f"got {window_size!r}") from None
    # FlashAttention's conventions: any negative side is unbounded, and causal means right = 0.
    # Sides past int32 see every key anyway.
    left = -1 if left < 0 or left > 2**31 - 1 else left
    right = -1 if right < 0 or right > 2**31 - 1 else right
    if causal:
        right = 0
    return left, right


_FLOAT32_MIN_NORMAL = 2.0**-126


def _scale(softmax_scale):
    """None is the one way to ask for the default 1/sqrt(headdim) (the C API's 0). Any other value
    must survive the conversion to the C API's float32 as itself: a scale that rounds to 0 would
    silently become the default, and a subnormal one is flushed to 0 by the GPU kernels."""
    if softmax_scale is None:
        return 0.0
    scale = _real(softmax_scale, "softmax_scale", "a real number or None")
    if scale == 0.0:
        # The C API reads 0 as "default"; a true zero scale (uniform attention) is not offered.
        raise ValueError("softmax_scale: 0 is not supported; pass None for 1/sqrt(headdim)")
    if not math.isfinite(scale):
        raise ValueError(f"softmax_scale: must be finite, got {scale}")
    if abs(scale) < _FLOAT32_MIN_NORMAL or not math.isfinite(ctypes.c_float(scale).value):
        raise ValueError(f"softmax_scale: {scale} is outside float32's normal range "
                         f"[{_FLOAT32_MIN_NORMAL:.6g}, 3.40282e+38] in magnitude; pass None for "
                         f"1/sqrt(headdim)")
    return scale


def _check_rank(x, name, rank, layout):
    if x.rank != rank:
        raise ValueError(f"{name}: expected rank {rank} {layout}, got rank {x.rank} with shape "
                         f"{tuple(x.shape)}")


def _workspace_size(params):
    """The workspace the call needs (0 on the CPU). The query validates params and, on CUDA, runs
    the dispatch's own checks (dtype, head dim, device): what the call would refuse, it refuses.
    params: fs_attention_params_v3, or _v4 (the descale factors)."""
    lib = _capi.lib()
    query = (lib.fs_attention_workspace_size_v4 if isinstance(params, _capi.AttentionParamsV4)
             else lib.fs_attention_workspace_size_v3)
    size = query(ctypes.byref(params))
    if size == ctypes.c_size_t(-1).value:
        _capi.raise_last()  # the size query returns no status; fs_last_status has it
    return size


def _run(params, q, framework, device, describe, described, size=None):
    """Sizes (unless `size` is known) and allocates the CUDA workspace, then calls the library
    (errors raised as Python exceptions naming the C argument). Returns the workspace, which the
    caller keeps alive until the stream is synchronized."""
    lib = _capi.lib()
    workspace = None
    if device[0] == "cuda":
        if size is None:
            size = _workspace_size(params)
        if size:
            workspace = _tensor.empty(q, framework, device, (size,), "uint8")
            dw = describe(workspace, "workspace", raw=True)
            described.append(dw)
            params.workspace = dw.struct.data
            params.workspace_bytes = size
    forward = (lib.fs_attention_forward_v4 if isinstance(params, _capi.AttentionParamsV4)
               else lib.fs_attention_forward_v3)
    _capi.raise_for(forward(ctypes.byref(params)))
    return workspace


def _descaled(q_descale, k_descale, v_descale):
    """The descale arguments given, by name (None where absent)."""
    return tuple((name, x) for name, x in (("q_descale", q_descale), ("k_descale", k_descale),
                                           ("v_descale", v_descale)) if x is not None)


def check_fp8_grad(named):
    """A float8_e4m3fn call (or one with descale factors) has no backward, as in
    FlashAttention-3: an argument PyTorch tracks a gradient for is refused by name."""
    for name, x in named:
        if x is not None:
            _tensor.check_autograd(x, name, "the float8_e4m3fn forward has no backward "
                                   "(FlashAttention-3's fp8 path is forward only)")


def _forward(q, k, v, *, varlen, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
             max_seqlen_k=0, softmax_scale=None, causal=False, window_size=(-1, -1),
             return_lse=False, block_table=None, seqused_k=None, num_splits=0, softcap=0.0,
             alibi_slopes=None, q_descale=None, k_descale=None, v_descale=None):
    """(out, lse or None)."""
    framework = _tensor.framework_of(q)
    descales = _descaled(q_descale, k_descale, v_descale)
    if descales:
        check_fp8_grad(descales)
    for name, x in (("q", q), ("k", k), ("v", v)):
        # PyTorch tensors that require grad take _torch.py's operators; here only when those could
        # not be registered (or, for float8_e4m3fn, never: check_fp8_grad's message).
        if descales or _is_fp8(x):
            check_fp8_grad(((name, x),))
        _tensor.check_autograd(x, name, "flashserve's autograd needs PyTorch's custom operators "
                               "(torch.library.custom_op, PyTorch >= 2.4), not registered here")
    q, k, v = (_tensor.last_dim_contiguous(x, _tensor.framework_of(x)) for x in (q, k, v))
    # Descale factors of any strides but a contiguous last dimension (the library's rule for every
    # tensor): vLLM's per-tensor scale expanded to (batch, nheads_k) has stride 0 there.
    descales = tuple((name, _tensor.last_dim_contiguous(x, _tensor.framework_of(x)))
                     for name, x in descales)
    device = _tensor.device_of(q)
    stream = _tensor.current_stream(q, framework, device)

    def describe(x, name, raw=False):
        return _tensor.describe(x, name, stream=stream, raw=raw)

    dq, dk, dv = describe(q, "q"), describe(k, "k"), describe(v, "v")
    if varlen:
        _check_rank(dq, "q", 3, "(total_q, nheads, headdim)")
    else:
        _check_rank(dq, "q", 4, "(batch, seqlen_q, nheads, headdim)")
        _check_rank(dk, "k", 4, "(batch, seqlen_k, nheads_k, headdim)")
        _check_rank(dv, "v", 4, "(batch, seqlen_k, nheads_k, headdim)")
    head_dim_v = dv.shape[-1] if dv.rank else dq.shape[-1]
    # A float8_e4m3fn q gives a bfloat16 out (FlashAttention-3's rule).
    out_dtype = "bfloat16" if dq.dtype == _capi.FLOAT8_E4M3 else None
    out = _tensor.empty(q, framework, device, dq.shape[:-1] + (head_dim_v,), out_dtype)
    lse = None
    if return_lse:
        lse_shape = (dq.shape[1], dq.shape[0]) if varlen else (dq.shape[0], dq.shape[2],
                                                               dq.shape[1])
        lse = _tensor.empty(q, framework, device, lse_shape, "float32")

    lengths_from_cu_seqlens_k = False
    if block_table is not None and seqused_k is None:
        if cu_seqlens_k is None:
            raise ValueError("seqused_k: the key lengths are required with block_table (pass "
                             "seqused_k, or cu_seqlens_k as in FlashAttention-2)")
        # FlashAttention-2's paged convention: cu_seqlens_k holds the cumulative key lengths.
        # Checked here, in the user's terms: the library only ever sees the differences.
        dcu = describe(cu_seqlens_k, "cu_seqlens_k")
        if dcu.rank != 1 or dcu.shape[0] < 1:
            raise ValueError(f"cu_seqlens_k: expected a 1-D tensor of batch + 1 entries, got "
                             f"shape {tuple(dcu.shape)}")
        del dcu
        seqused_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        cu_seqlens_k = None
        lengths_from_cu_seqlens_k = True
    elif block_table is not None and cu_seqlens_k is not None:
        raise ValueError("cu_seqlens_k: with block_table pass either cu_seqlens_k "
                         "(FlashAttention-2 convention) or seqused_k, not both")

    described = [dq, dk, dv, describe(out, "out"), describe(lse, "lse"),
                 describe(cu_seqlens_q, "cu_seqlens_q"), describe(cu_seqlens_k, "cu_seqlens_k"),
                 describe(seqused_k, "seqused_k"), describe(block_table, "block_table"),
                 describe(alibi_slopes, "alibi_slopes")]
    described += [describe(x, name) for name, x in descales]
    # The v4 struct (descale factors) only where there are any, so that a library call of the
    # 16-bit path is the one it was.
    fp8 = bool(descales) or any(d.dtype == _capi.FLOAT8_E4M3 for d in (dq, dk, dv))
    params = _capi.default_params_v4() if fp8 else _capi.default_params()
    for d in described:
        setattr(params, d.name, d.struct)
    params.max_seqlen_q = _int(max_seqlen_q, "max_seqlen_q", _INT64)
    params.max_seqlen_k = _int(max_seqlen_k, "max_seqlen_k", _INT64)
    params.softmax_scale = _scale(softmax_scale)
    params.softcap = _softcap(softcap)
    params.causal = 1 if causal else 0
    params.window_left, params.window_right = _window(window_size, causal)
    params.num_splits = _int(num_splits, "num_splits", _INT32)
    params.stream = stream or None

    try:
        workspace = _run(params, q, framework, device, describe, described)
    except ValueError as e:
        if lengths_from_cu_seqlens_k and str(e).startswith("seqused_k:"):
            # The user passed cu_seqlens_k (FlashAttention-2's paged convention), never seqused_k.
            raise ValueError("cu_seqlens_k: (the key lengths cu_seqlens_k[b + 1] - "
                             "cu_seqlens_k[b] of the FlashAttention-2 paged convention) "
                             + str(e)[len("seqused_k:"):].lstrip()) from None
        raise
    if _tensor.needs_sync(framework, device):
        _capi.raise_for(_capi.lib().fs_cuda_stream_synchronize(params.stream))
    del described, workspace  # the borrowed DLPack capsules are released only now
    return out, lse


def _is_fp8(x):
    """Whether x is a float8_e4m3fn tensor, by its dtype's name (PyTorch, ml_dtypes, JAX)."""
    dtype = getattr(x, "dtype", None)
    return str(dtype).replace("torch.", "") == "float8_e4m3fn" if dtype is not None else False


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, return_lse=False, num_splits=0, q_descale=None,
                    k_descale=None, v_descale=None):
    """Exact attention over dense batches (flash_attn 2.8's flash_attn_func: its parameters in
    its order; return_lse and num_splits are flashserve's, keyword-only).

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), nheads a
    multiple of nheads_k (GQA/MQA). causal and window_size=(left, right) are aligned bottom-right:
    query i sees key j iff i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right
    (a negative side is unbounded; causal sets right = 0). A query that sees no key gets a zero row.
    softcap > 0: scores s = softcap * tanh(s / softcap) (Gemma-2), before the mask. alibi_slopes:
    float32 (nheads,) or (batch, nheads), a bias -slope * |i + seqlen_k - seqlen_q - j| added to
    the scores after the cap. Both run on the CPU path, forward and backward, and in the CUDA
    forward (the sm80 kernels, also on Hopper); CUDA autograd through them is refused
    (NotImplementedError naming the argument). dropout_p must be 0.0.
    Returns out (batch, seqlen_q, nheads, headdim_v) in q's framework, dtype and device; with
    return_attn_probs, (out, softmax_lse, S_dmask) as flash_attn returns them without dropout:
    softmax_lse float32 (batch, nheads, seqlen_q), natural log, -inf for a row that sees no key,
    and S_dmask an empty tensor (shape (0,), q's dtype): flashserve never materialises the
    probabilities. return_lse=True returns (out, softmax_lse). PyTorch tensors that require grad
    are differentiable (q, k, v; and the lse); deterministic=True asks for bit-identical gradients
    run to run (the CPU backward always gives them; the forward is deterministic).
    num_splits: split-KV ways; 0 (the default, as in FlashAttention's forward) lets the library
    choose, 1 never splits, n > 1 splits exactly n ways.
    FP8 (FlashAttention-3's, keyword-only here; flashserve.hopper takes them in FA3's order): q, k
    and v float8_e4m3fn give a bfloat16 out; q_descale, k_descale, v_descale: optional float32
    (batch, nheads_k) on q's device, the factor each tensor's codes are multiplied by (None: 1;
    q_descale of KV head j applies to its group of query heads). Forward only: an fp8 call with
    an argument that requires grad is refused (NotImplementedError naming it). See docs/python.md.
    """
    _check_dropout(dropout_p)
    causal = _flag(causal, "causal")
    return_lse, return_attn_probs = _output_flags(return_lse, return_attn_probs)
    want_lse = return_lse or return_attn_probs
    path = _torch_route(q)
    if path is not None:
        out, lse = path.flash_attn_func(q, k, v, softmax_scale, causal, window_size, want_lse,
                                        num_splits, deterministic, softcap, alibi_slopes,
                                        q_descale=q_descale, k_descale=k_descale,
                                        v_descale=v_descale)
        return _results(q, path, out, lse, return_lse, return_attn_probs)
    _flag(deterministic, "deterministic")
    out, lse = _forward(q, k, v, varlen=False, softmax_scale=softmax_scale, causal=causal,
                        window_size=window_size, return_lse=want_lse, num_splits=num_splits,
                        softcap=softcap, alibi_slopes=alibi_slopes, q_descale=q_descale,
                        k_descale=k_descale, v_descale=v_descale)
    return _results(q, None, out, lse, return_lse, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, seqused_k=None,
                           return_lse=False, num_splits=0, q_descale=None, k_descale=None,
                           v_descale=None):
    """Exact attention over packed variable-length sequences (flash_attn 2.8's
    flash_attn_varlen_func, parameters in its order; seqused_k, return_lse and num_splits are
    flashserve's, keyword-only).

    q: (total_q, nheads, headdim) with int32 cu_seqlens_q (batch + 1,); k, v: (total_k, nheads_k,
    headdim) with int32 cu_seqlens_k, or a paged cache (num_blocks, page_block_size, nheads_k,
    headdim) with int32 block_table (batch, max_blocks_per_seq) and the key lengths as differences
    of cu_seqlens_k (FlashAttention-2's convention) or in seqused_k (batch,). seqused_k without
    block_table limits sequence b to its first seqused_k[b] keys. max_seqlen_q/k: upper bounds of
    the lengths (Python ints). Masking, softcap and alibi_slopes as in flash_attn_func, per
    sequence. Returns out (total_q, nheads, headdim_v); with return_attn_probs (out, softmax_lse,
    S_dmask), softmax_lse float32 (nheads, total_q), S_dmask empty as in flash_attn_func; with
    return_lse (out, softmax_lse). num_splits as in flash_attn_func (default 0: automatic).
    q_descale, k_descale, v_descale: FP8 as in flash_attn_func, (batch, nheads_k) with batch =
    len(cu_seqlens_q) - 1.
    """
    _check_dropout(dropout_p)
    causal = _flag(causal, "causal")
    return_lse, return_attn_probs = _output_flags(return_lse, return_attn_probs)
    want_lse = return_lse or return_attn_probs
    path = _torch_route(q)
    if path is not None:
        out, lse = path.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
            causal, window_size, want_lse, block_table, seqused_k, num_splits, deterministic,
            softcap, alibi_slopes, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
        return _results(q, path, out, lse, return_lse, return_attn_probs)
    _flag(deterministic, "deterministic")
    out, lse = _forward(q, k, v, varlen=True, cu_seqlens_q=cu_seqlens_q,
                        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                        max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
                        window_size=window_size, return_lse=want_lse, block_table=block_table,
                        seqused_k=seqused_k, num_splits=num_splits, softcap=softcap,
                        alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale,
                        v_descale=v_descale)
    return _results(q, None, out, lse, return_lse, return_attn_probs)


# ---------------------------------------------------------------- packed variants

def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *, return_lse=False,
                              num_splits=0):
    """flash_attn_func on qkv (batch, seqlen, 3, nheads, headdim): q, k, v = qkv[:, :, i] (views,
    no copy)."""
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale,
                           causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs, return_lse=return_lse, num_splits=num_splits)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *, return_lse=False,
                             num_splits=0):
    """flash_attn_func with kv (batch, seqlen_k, 2, nheads_k, headdim): k, v = kv[:, :, i]."""
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                           return_lse=return_lse, num_splits=num_splits)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, return_lse=False, num_splits=0):
    """flash_attn_varlen_func on qkv (total, 3, nheads, headdim) with one cu_seqlens."""
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens,
                                  max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, return_lse=return_lse, num_splits=num_splits)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False,
                                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                    deterministic=False, return_attn_probs=False, *,
                                    return_lse=False, num_splits=0):
    """flash_attn_varlen_func with kv (total_k, 2, nheads_k, headdim)."""
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                                  window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, return_lse=return_lse, num_splits=num_splits)


# ---------------------------------------------------------------- KV cache

def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False, *,
                            q_descale=None, k_descale=None, v_descale=None):
    """Attention of q over a KV cache, after appending new keys and values to it in place
    (FlashAttention's flash_attn_with_kvcache; arguments in its order; the descales are
    FlashAttention-3's, keyword-only here).

    q: (batch, seqlen_q, nheads, headdim). k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k,
    headdim), or paged (num_blocks, page_block_size, nheads_k, headdim) with block_table int32
    (batch, max_blocks_per_seq). k, v: optional new tokens (batch, seqlen_new, nheads_k, headdim),
    written into the cache at positions cache_seqlens[b], cache_seqlens[b] + 1, ... (the cache is
    modified in place). cache_seqlens: int32 (batch,) or an int, the tokens already cached (None:
    the whole cache). cache_batch_idx: int32 (batch,), the cache row of each sequence (contiguous
    cache; default b). rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2), float32 or q's dtype:
    the new k is rotated at its positions before it is written; q is rotated at cache_seqlens + i
    with causal or a window, and at cache_seqlens for every token otherwise (FlashAttention's
    rule). rotary_interleaved: pairs (2i, 2i + 1) (GPT-J) if True, else (i, i + rotary_dim / 2)
    (GPT-NeoX). The attention then sees cache_seqlens + seqlen_new keys per sequence, masked as in
    flash_attn_func (bottom-right aligned). cache_seqlens + seqlen_new beyond the cache's capacity
    is a ValueError when the lengths are known on the host (an int, a CPU tensor, or
    FLASHSERVE_CHECK_INDICES=1); see docs/python.md for device-resident lengths.
    Returns out (batch, seqlen_q, nheads, headdim), or (out, lse) with return_softmax_lse, lse
    float32 (batch, nheads, seqlen_q). softcap and alibi_slopes as in flash_attn_func (the
    positions of ALiBi are those of the updated cache: query i of sequence b sits at
    cache_seqlens[b] + seqlen_new - seqlen_q + i). cache_leftpad is refused unless None.
    FP8: k_cache and v_cache float8_e4m3fn, with q float8_e4m3fn too (FlashAttention-3's fp8
    call: a bfloat16 out) or 16-bit/float32 (an fp8 KV cache: out of q's dtype); the new k and v
    must then be e4m3 codes already (their bytes are copied into the cache), and rotary is refused.
    q_descale (e4m3 q only), k_descale, v_descale: optional float32 (batch, nheads_k) on q's
    device, the factor each (sequence, KV head)'s codes are multiplied by (None: 1); row b is
    sequence b (not cache row cache_batch_idx[b]); the descales cover the whole cache, the
    appended tokens included. Forward only. See docs/python.md.
    """
    if cache_leftpad is not None:
        raise NotImplementedError("cache_leftpad: left-padded caches are not supported")
    causal = _flag(causal, "causal")
    rotary_interleaved = _flag(rotary_interleaved, "rotary_interleaved")
    return_softmax_lse = _flag(return_softmax_lse, "return_softmax_lse")
    path = _torch_route(q)
    if path is not None:
        return path.flash_attn_with_kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            block_table, softmax_scale, causal, window_size, rotary_interleaved, num_splits,
            return_softmax_lse, softcap, alibi_slopes, q_descale=q_descale,
            k_descale=k_descale, v_descale=v_descale)
    out, lse = _with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                             cache_batch_idx, block_table, softmax_scale, causal, window_size,
                             rotary_interleaved, num_splits, return_softmax_lse, softcap,
                             alibi_slopes, q_descale, k_descale, v_descale)
    return (out, lse) if return_softmax_lse else out


def _index_view(d, rows, cols, name):
    """The fs_tensor of a 1-D int32 index tensor (described) seen as (rows, cols) with cols == 1:
    cache_batch_idx as the block table of a contiguous cache read as pages of a whole sequence."""
    t = _capi.Tensor()
    src = d.struct
    t.data, t.dtype, t.device_type, t.device_index = src.data, src.dtype, src.device_type, \
        src.device_index
    t.rank = 2
    t.shape[0], t.shape[1] = rows, cols
    t.strides[0], t.strides[1] = (d.strides[0] if d.strides else 1), 1
    return t


def _with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                  cache_batch_idx, block_table, softmax_scale, causal, window_size,
                  rotary_interleaved, num_splits, return_lse, softcap=0.0, alibi_slopes=None,
                  q_descale=None, k_descale=None, v_descale=None):
    """(out, lse or None)."""
    framework = _tensor.framework_of(q)
    if framework == "jax" and k is not None:
        raise TypeError("k_cache: JAX arrays are immutable; flash_attn_with_kvcache appends to "
                        "the cache in place (pass k=None, v=None, or use another framework)")
    descales = _descaled(q_descale, k_descale, v_descale)
    check_fp8_grad(descales)
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if x is not None:
            _tensor.check_autograd(x, name, "flash_attn_with_kvcache is not differentiable (it "
                                   "appends to the cache in place)")
    # The caches are written in place: a copy would lose the append, so they are never copied.
    q, k, v, rotary_cos, rotary_sin = (
        None if x is None else _tensor.last_dim_contiguous(x, _tensor.framework_of(x))
        for x in (q, k, v, rotary_cos, rotary_sin))
    # Descale factors of any strides but a contiguous last dimension (as in _forward).
    descales = tuple((name, _tensor.last_dim_contiguous(x, _tensor.framework_of(x)))
                     for name, x in descales)
    device = _tensor.device_of(q)
    stream = _tensor.current_stream(q, framework, device)

    def describe(x, name, raw=False):
        return _tensor.describe(x, name, stream=stream, raw=raw)

    dq, dkc, dvc = describe(q, "q"), describe(k_cache, "k_cache"), describe(v_cache, "v_cache")
    _check_rank(dq, "q", 4, "(batch, seqlen_q, nheads, headdim)")
    paged = block_table is not None
    cache_layout = ("(num_blocks, page_block_size, nheads_k, headdim)" if paged
                    else "(batch_cache, seqlen_cache, nheads_k, headdim)")
    _check_rank(dkc, "k_cache", 4, cache_layout)
    _check_rank(dvc, "v_cache", 4, cache_layout)
    if (k is None) != (v is None):
        raise ValueError("k: k and v must be given together (or neither)")
    batch = dq.shape[0]
    window_left, window_right = _window(window_size, causal)
    rotary = rotary_cos is not None or rotary_sin is not None
    if rotary and dkc.dtype == _capi.FLOAT8_E4M3:
        # Also refused by the library's append (naming rotary_cos); here before q_out is made.
        raise NotImplementedError(
            "rotary_cos: rotary embedding into a float8_e4m3fn cache is not supported: the new k "
            "are e4m3 codes, and rotating them would need a dequantise and a requantise with a "
            "scale the append does not have (rotate k before quantising it, and pass q rotated)")
    if rotary and dq.dtype == _capi.FLOAT8_E4M3:
        raise NotImplementedError(
            "rotary_cos: rotary embedding of a float8_e4m3fn q is not supported: its codes would "
            "need a dequantise and a requantise with a scale the append does not have (pass q "
            "rotated)")

    if k is not None:
        # The append writes the caches in place: memory the array marks read-only (a read-only
        # memory map, np.frombuffer of bytes) would be written anyway, or fault.
        for d in (dkc, dvc):
            if d.read_only:
                raise ValueError(f"{d.name}: is read-only, but k and v are appended to it in "
                                 f"place")

    append = _capi.default_append_params()
    described = [dq, dkc, dvc]
    append.k_cache, append.v_cache = dkc.struct, dvc.struct
    if k is not None:
        dk, dv = describe(k, "k"), describe(v, "v")
        _check_rank(dk, "k", 4, "(batch, seqlen_new, nheads_k, headdim)")
        _check_rank(dv, "v", 4, "(batch, seqlen_new, nheads_k, headdim)")
        described += [dk, dv]
        append.k_new, append.v_new = dk.struct, dv.struct
    if cache_seqlens is not None and not _is_scalar(cache_seqlens):
        dlen = describe(cache_seqlens, "cache_seqlens")
        described.append(dlen)
        append.cache_seqlens = dlen.struct
    else:
        if cache_seqlens is None:  # the whole cache is in use
            capacity = dkc.shape[1] * (_described_cols(describe(block_table, "block_table"))
                                       if paged else 1)
            append.cache_seqlen = capacity
        else:
            append.cache_seqlen = _int(cache_seqlens, "cache_seqlens", _INT64)
    dbatch = describe(cache_batch_idx, "cache_batch_idx")
    dtable = describe(block_table, "block_table")
    described += [dbatch, dtable]
    append.cache_batch_idx, append.block_table = dbatch.struct, dtable.struct
    q_attn = q
    if rotary:
        dcos, dsin = describe(rotary_cos, "rotary_cos"), describe(rotary_sin, "rotary_sin")
        q_attn = _tensor.empty(q, framework, device, dq.shape)
        dqo = describe(q_attn, "q_out")
        described += [dcos, dsin, dqo]
        append.rotary_cos, append.rotary_sin = dcos.struct, dsin.struct
        append.q, append.q_out = dq.struct, dqo.struct
        append.rotary_interleaved = 1 if rotary_interleaved else 0
        append.q_positions_per_token = 1 if (window_left >= 0 or window_right >= 0) else 0
    seqlens = _tensor.empty(q, framework, device, (batch,), "int32")
    dseq = describe(seqlens, "seqlens_out")
    described.append(dseq)
    append.seqlens_out = dseq.struct
    append.stream = stream or None

    # The attention over the updated cache: cache_seqlens + seqlen_new keys per sequence
    # (seqused_k). A contiguous cache with cache_batch_idx is a paged one whose pages are whole
    # sequences.
    dqa = describe(q_attn, "q") if rotary else dq
    # A float8_e4m3fn q gives a bfloat16 out (FlashAttention-3's rule), as in _forward.
    out_dtype = "bfloat16" if dq.dtype == _capi.FLOAT8_E4M3 else None
    out = _tensor.empty(q, framework, device, dq.shape[:-1] + (dvc.shape[-1],), out_dtype)
    dout = describe(out, "out")
    described += [dqa, dout]
    # The v4 struct (descale factors) only for an fp8 call, so that a 16-bit call is the one it
    # was.
    fp8 = bool(descales) or any(d.dtype == _capi.FLOAT8_E4M3 for d in (dq, dkc, dvc))
    params = _capi.default_params_v4() if fp8 else _capi.default_params()
    for name, x in descales:
        d = describe(x, name)
        described.append(d)
        setattr(params, name, d.struct)
    params.q, params.k, params.v, params.out = dqa.struct, dkc.struct, dvc.struct, dout.struct
    params.seqused_k = dseq.struct
    lse = None
    if return_lse:
        lse = _tensor.empty(q, framework, device, (batch, dq.shape[2], dq.shape[1]), "float32")
        dlse = describe(lse, "lse")
        described.append(dlse)
        params.lse = dlse.struct
    if paged:
        params.block_table = dtable.struct
        params.max_seqlen_k = dkc.shape[1] * _described_cols(dtable)
    elif cache_batch_idx is not None:
        if dbatch.rank != 1:
            raise ValueError(f"cache_batch_idx: expected a 1-D tensor of batch entries, got shape "
                             f"{tuple(dbatch.shape)}")
        params.block_table = _index_view(dbatch, dbatch.shape[0], 1, "cache_batch_idx")
        params.max_seqlen_k = dkc.shape[1]
    params.softmax_scale = _scale(softmax_scale)
    params.softcap = _softcap(softcap)
    if alibi_slopes is not None:
        dslopes = describe(alibi_slopes, "alibi_slopes")
        described.append(dslopes)
        params.alibi_slopes = dslopes.struct
    params.causal = 1 if causal else 0
    params.window_left, params.window_right = window_left, window_right
    params.num_splits = _int(num_splits, "num_splits", _INT32)
    params.stream = stream or None

    # Both calls are validated before the cache is written; then the append, then the attention.
    lib = _capi.lib()
    with _append_names():
        _capi.raise_for(lib.fs_kvcache_append_validate(ctypes.byref(append)))
    host_lengths = None
    if device[0] == "cpu":
        # The attention's validation reads the lengths it will see after the append (and checks
        # the block-table entries of every page up to them): the host computes them here, so that
        # a bad page the append does not write is refused before the cache is written.
        host_lengths, params.seqused_k = _lengths_after_append(
            append, dq.struct, batch, dk.shape[1] if k is not None else 0)
    names = _kvcache_names(cache_batch_idx is not None and not paged,
                           dense_cache=not paged and cache_batch_idx is None)
    with names:
        size = _workspace_size(params)  # validates, and what the CUDA kernels refuse, refuses
    params.seqused_k = dseq.struct
    del host_lengths
    _capi.raise_for(lib.fs_kvcache_append(ctypes.byref(append)))
    with names:
        workspace = _run(params, q, framework, device, describe, described, size)
    if _tensor.needs_sync(framework, device):
        _capi.raise_for(_capi.lib().fs_cuda_stream_synchronize(params.stream))
    del described, workspace
    return out, lse


def _lengths_after_append(append, like, batch, s_new):
    """cache_seqlens + s_new per sequence (host-resident lengths, as validated by
    fs_kvcache_append_validate, so the sums fit int32) in a new host buffer, and the fs_tensor of
    it on `like`'s device (the CPU): the seqused_k the attention will see. Returns both; the
    buffer must outlive every use of the fs_tensor."""
    buffer = (ctypes.c_int32 * max(batch, 1))()
    lengths = append.cache_seqlens
    src = ctypes.cast(lengths.data, ctypes.POINTER(ctypes.c_int32)) if lengths.rank else None
    for b in range(batch):
        buffer[b] = (src[b * lengths.strides[0]] if src else append.cache_seqlen) + s_new
    t = _capi.Tensor()
    t.data, t.dtype = ctypes.addressof(buffer), _capi.INT32
    t.device_type, t.device_index = like.device_type, like.device_index
    t.rank = 1
    t.shape[0], t.strides[0] = batch, 1
    return buffer, t


class _kvcache_names:
    """Context: an error of the attention inside flash_attn_with_kvcache names the arguments the
    caller passed (k_cache for the attention's k, cache_batch_idx for the block table it is seen
    as), not the attention's. dense_cache: a contiguous cache without cache_batch_idx, which a
    refusal naming the block table (the CUDA fp8 KV kernels read paged K/V only) is about."""

    _NAMES = {"k": "k_cache", "v": "v_cache", "seqused_k": "cache_seqlens"}

    def __init__(self, batch_idx_as_table, dense_cache=False):
        self.names = dict(self._NAMES)
        if batch_idx_as_table:
            self.names["block_table"] = "cache_batch_idx"
        elif dense_cache:
            self.names["block_table"] = "k_cache"

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if isinstance(error, (ValueError, NotImplementedError)) and error.args:
            name, sep, rest = str(error.args[0]).partition(": ")
            if sep and name in self.names:
                error.args = (f"{self.names[name]}: {rest}",) + error.args[1:]
        return False


class _append_names(_kvcache_names):
    """The append's validation names seqlens_out and q_out, which flashserve allocates with q's
    batch and shape: a mismatch there is one of q's against the other arguments."""

    _NAMES = {"seqlens_out": "q", "q_out": "q"}

    def __init__(self):
        self.names = dict(self._NAMES)


def _is_scalar(x):
    """An int (or NumPy integer): one length for every sequence."""
    if isinstance(x, bool):
        return True  # then refused by _int, with the argument's name
    try:
        operator.index(x)
        return not hasattr(x, "shape") or x.shape == ()
    except TypeError:
        return False


def _described_cols(d):
    if d.rank != 2:
        raise ValueError(f"block_table: expected a 2-D int32 tensor (batch, max_blocks_per_seq), "
                         f"got shape {tuple(d.shape)}")
    return d.shape[1]
