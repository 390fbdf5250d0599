"""FlashAttention's Python API (argument names, layouts, defaults) over libflashserve_c.

    from flashserve import flash_attn_func, flash_attn_varlen_func

is a drop-in replacement of the flash_attn imports for inference (forward only).
"""

import ctypes
import math
import operator

from . import _capi, _tensor


def _check_features(dropout_p, softcap, alibi_slopes, return_attn_probs):
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p: dropout is not supported (flashserve is "
                                  f"inference-only, forward pass); got {dropout_p}, pass 0.0")
    if softcap != 0.0:
        raise NotImplementedError(f"softcap: logit soft-capping is not supported; got {softcap}")
    if alibi_slopes is not None:
        raise NotImplementedError("alibi_slopes: ALiBi is not supported")
    if return_attn_probs:
        raise NotImplementedError("return_attn_probs: flashserve never materialises the attention "
                                  "probabilities; use return_lse=True for the log-sum-exp")


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
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}") from None
    lo, hi = bounds
    if not lo <= value <= hi:
        raise ValueError(f"{name}: {value} is outside [{lo}, {hi}]")
    return value


def _window(window_size, causal):
    try:
        left, right = window_size
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
    scale = float(softmax_scale)
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


def _run(params, q, framework, device, describe, described):
    """Sizes and allocates the CUDA workspace, then calls the library (errors raised as Python
    exceptions naming the C argument). Returns the workspace, which the caller keeps alive until the
    stream is synchronized."""
    lib = _capi.lib()
    workspace = None
    if device[0] == "cuda":
        size = lib.fs_attention_workspace_size(ctypes.byref(params))
        if size == ctypes.c_size_t(-1).value:
            # The size query returns no status: validation names a bad argument; past it, only the
            # CUDA runtime (device count, attributes) or host memory can have failed.
            message = _capi.last_error()
            _capi.raise_for(lib.fs_attention_validate(ctypes.byref(params)))
            raise RuntimeError(message)
        if size:
            workspace = _tensor.empty(q, framework, device, (size,), "uint8")
            dw = describe(workspace, "workspace", raw=True)
            described.append(dw)
            params.workspace = dw.struct.data
            params.workspace_bytes = size
    _capi.raise_for(lib.fs_attention_forward(ctypes.byref(params)))
    return workspace


def _forward(q, k, v, *, varlen, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
             max_seqlen_k=0, softmax_scale=None, causal=False, window_size=(-1, -1),
             return_lse=False, block_table=None, seqused_k=None, num_splits=1):
    framework = _tensor.framework_of(q)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _tensor.check_autograd(x, name)
    q, k, v = (_tensor.last_dim_contiguous(x, _tensor.framework_of(x)) for x in (q, k, v))
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
    out = _tensor.empty(q, framework, device, dq.shape[:-1] + (head_dim_v,))
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
                 describe(seqused_k, "seqused_k"), describe(block_table, "block_table")]
    params = _capi.default_params()
    for d in described:
        setattr(params, d.name, d.struct)
    params.max_seqlen_q = _int(max_seqlen_q, "max_seqlen_q", _INT64)
    params.max_seqlen_k = _int(max_seqlen_k, "max_seqlen_k", _INT64)
    params.softmax_scale = _scale(softmax_scale)
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
    return (out, lse) if return_lse else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), return_lse=False, *, softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_attn_probs=False, num_splits=1):
    """Exact attention over dense batches.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), nheads a
    multiple of nheads_k (GQA/MQA). causal and window_size=(left, right) are aligned bottom-right:
    query i sees key j iff i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right
    (a negative side is unbounded; causal sets right = 0). A query that sees no key gets a zero row.
    Returns out (batch, seqlen_q, nheads, headdim_v) in q's framework, dtype and device, or
    (out, lse) with return_lse, lse float32 (batch, nheads, seqlen_q), natural log, -inf for a row
    that sees no key. deterministic is accepted and has no effect (the forward is deterministic).
    """
    _check_features(dropout_p, softcap, alibi_slopes, return_attn_probs)
    return _forward(q, k, v, varlen=False, softmax_scale=softmax_scale, causal=causal,
                    window_size=window_size, return_lse=return_lse, num_splits=num_splits)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           return_lse=False, block_table=None, seqused_k=None, *, softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False,
                           num_splits=1):
    """Exact attention over packed variable-length sequences.

    q: (total_q, nheads, headdim) with int32 cu_seqlens_q (batch + 1,); k, v: (total_k, nheads_k,
    headdim) with int32 cu_seqlens_k, or a paged cache (num_blocks, page_block_size, nheads_k,
    headdim) with int32 block_table (batch, max_blocks_per_seq) and the key lengths in seqused_k
    (batch,) or, as in FlashAttention-2, as differences of cu_seqlens_k. seqused_k without
    block_table limits sequence b to its first seqused_k[b] keys. max_seqlen_q/k: upper bounds of
    the lengths (Python ints). Masking as in flash_attn_func, per sequence.
    Returns out (total_q, nheads, headdim_v), or (out, lse) with lse float32 (nheads, total_q).
    """
    _check_features(dropout_p, softcap, alibi_slopes, return_attn_probs)
    return _forward(q, k, v, varlen=True, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                    max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                    softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                    return_lse=return_lse, block_table=block_table, seqused_k=seqused_k,
                    num_splits=num_splits)
