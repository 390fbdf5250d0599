"""The PyTorch path: flashserve's functions as PyTorch custom operators, and a host path for CUDA
tensors that costs a few microseconds.

Imported only by flashserve.attention.register_torch(), i.e. only once PyTorch is imported.

- Custom operators (torch.library.custom_op, with register_fake for shapes and dtypes):
  flashserve::fwd, flashserve::varlen_fwd and flashserve::with_kvcache (which declares that it
  mutates k_cache and v_cache). torch.compile(fullgraph=True) traces through them, and they run
  inside CUDA-graph capture (no host synchronisation, no allocation outside PyTorch's allocator).
- Eager calls with plain torch.Tensor arguments skip the dispatcher and call the implementation
  directly. For CUDA tensors, flash_attn_func (and flash_attn_varlen_func over dense K/V) fills
  one preallocated fs_attention_params per thread with struct.pack_into from
  data_ptr()/shape/stride() (no DLPack capsule, no ctypes field assignments), takes the stream
  from torch's raw current stream, and calls the cached ctypes functions; with gradients, an
  autograd Function (_autograd.py) runs that forward and fast_backward, packed the same way.
  Anything else (CPU tensors, odd strides or dtypes, other calls) takes the generic path of
  attention.py, with the same checks and messages.
"""

import ctypes
import struct
import threading
from typing import Optional, Tuple

import torch

from . import _autograd, _capi, _tensor
from . import attention as _attention

Tensor = torch.Tensor  # attention._torch_route's isinstance check

_DTYPES = {torch.float32: _capi.FLOAT32, torch.float16: _capi.FLOAT16,
           torch.bfloat16: _capi.BFLOAT16}
_FS_TENSOR = struct.Struct("@Piiii4q4q")  # fs_tensor
_SCALARS = struct.Struct("@qqfiiiiPPN")  # max_seqlen_q .. workspace_bytes of fs_attention_params
_ABSENT = bytes(_FS_TENSOR.size)
_SIZE_MAX = ctypes.c_size_t(-1).value


def empty(like, shape, dtype=None):
    """A new tensor on like's device (like's dtype unless given). Tests replace it to poison
    outputs."""
    return torch.empty(shape, dtype=like.dtype if dtype is None else dtype, device=like.device)


def empty_like(t):
    """A new tensor with t's shape, dtype, device and, where t is dense, its strides: a gradient
    laid out as its input, which autograd's AccumulateGrad then takes as the leaf's .grad without
    a copy. A third of empty(t, t.shape)'s host time (~1.8 against ~4.3 us, session 40). Tests
    replace it to poison outputs."""
    return torch.empty_like(t)


# True while torch.compile traces (torch.compiler.is_compiling is known to it and folds to a
# constant there); PyTorch < 2.3 lacks it, and there the operators are always dispatched to.
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: True)


def _raw_stream_fn():
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


_current_stream = _raw_stream_fn()


# ---------------------------------------------------------------- the host fast path

class _Calls:
    """The library's functions, looked up once, and the layout offsets the fast path packs at."""

    def __init__(self):
        lib = _capi.lib()
        self.forward = lib.fs_attention_forward_v3
        self.workspace_size = lib.fs_attention_workspace_size_v3
        P = _capi.AttentionParams  # fs_attention_params_v3's base, at offset 0
        self.offsets = {name: getattr(P, name).offset
                        for name in ("q", "k", "v", "out", "lse", "cu_seqlens_q",
                                     "cu_seqlens_k", "seqused_k", "max_seqlen_q")}
        self.ok = (_FS_TENSOR.size == ctypes.sizeof(_capi.Tensor) and
                   _SCALARS.size == ctypes.sizeof(P) - P.max_seqlen_q.offset and
                   P.stream.offset - P.max_seqlen_q.offset == _SCALARS.size - 24)


_calls = None


class _Block(threading.local):
    """One parameter block of C struct `struct_type` per thread (autograd runs a CUDA backward on
    a thread of its own), over a bytearray that pack_into writes, as the library's `init`
    function leaves it."""

    def __init__(self, struct_type, init):
        self.buffer = bytearray(ctypes.sizeof(struct_type))
        self.params = struct_type.from_buffer(self.buffer)
        getattr(_capi.lib(), init)(ctypes.byref(self.params))
        self.ref = ctypes.byref(self.params)


class _State(_Block):
    """fs_attention_params_v3 per thread (its score modifiers stay off: calls with softcap or
    alibi_slopes take the generic path, which runs them on the same CUDA kernels; its few
    microseconds of host time are no concern beside the modifier kernels' own cost)."""

    def __init__(self):
        super().__init__(_capi.AttentionParamsV3, "fs_attention_params_v3_init")


_state = None


def _pack(buffer, offset, t, code):
    shape, stride = t.shape, t.stride()
    n = len(shape)
    if n == 4:
        _FS_TENSOR.pack_into(buffer, offset, t.data_ptr(), code, _capi.CUDA, t.device.index, 4,
                             *shape, *stride)
    else:
        pad = (0,) * (4 - n)
        _FS_TENSOR.pack_into(buffer, offset, t.data_ptr(), code, _capi.CUDA, t.device.index, n,
                             *shape, *pad, *stride, *pad)


def _get_calls():
    """The library's functions (loading the library on first use, not at registration: `import
    flashserve` must not fail for want of it)."""
    global _calls
    if _calls is None:
        _calls = _Calls()
    return _calls


def _fast_tensors(rank, *tensors):
    """Whether the fast paths can pack these tensors as they are: plain CUDA tensors of `rank`,
    a float dtype the library knows, last dimension contiguous (the generic path names what is
    wrong with any other)."""
    return all(type(t) is Tensor and t.dtype in _DTYPES and t.is_cuda and t.dim() == rank and
               t.stride(-1) == 1 for t in tensors)


def _fast_lengths(*tensors):
    """Whether these optional length tensors (cu_seqlens, seqused_k) can be packed as they are:
    None, or plain int32 CUDA vectors."""
    return all(t is None or (type(t) is Tensor and t.dtype == torch.int32 and t.is_cuda and
                             t.dim() == 1) for t in tensors)


def _fast_ok(q, k, v):
    """Whether the dense fast path takes these tensors: _fast_tensors, and no grad to refuse."""
    return (_fast_tensors(4, q, k, v) and
            not (q.requires_grad or k.requires_grad or v.requires_grad) and _get_calls().ok)


def _varlen_fast_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k):
    """Whether the varlen fast path can pack these tensors (K/V not paged: the caller checks
    block_table): rank 3, both cu_seqlens, int32 lengths."""
    return (_fast_tensors(3, q, k, v) and cu_seqlens_q is not None and
            cu_seqlens_k is not None and _fast_lengths(cu_seqlens_q, cu_seqlens_k, seqused_k) and
            _get_calls().ok)


def _varlen_fast_ok(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k):
    """_varlen_fast_tensors, and no grad to refuse."""
    return (_varlen_fast_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k) and
            not (q.requires_grad or k.requires_grad or v.requires_grad))


def _dense(q, k, v, softmax_scale, causal, window_size, num_splits, return_lse, softcap=0.0,
           alibi_slopes=None, q_descale=None, k_descale=None, v_descale=None):
    """flash_attn_func's implementation: (out, lse or None)."""
    if not (_fast_ok(q, k, v) and softcap == 0.0 and alibi_slopes is None and
            q_descale is None and k_descale is None and v_descale is None):
        # The generic path: DLPack, and every check with its message; the score modifiers and
        # float8_e4m3fn (whose descale factors the v4 parameter block carries) take it too (the
        # fast path's v3 block keeps them off), on to the same kernels.
        return _attention._forward(q, k, v, varlen=False, softmax_scale=softmax_scale,
                                   causal=causal, window_size=window_size, return_lse=return_lse,
                                   num_splits=num_splits, softcap=softcap,
                                   alibi_slopes=alibi_slopes, q_descale=q_descale,
                                   k_descale=k_descale, v_descale=v_descale)
    global _state
    state = _state
    if state is None:
        state = _state = _State()
    b, sq, h, _ = q.shape
    out = empty(q, (b, sq, h, v.shape[3]))
    lse = empty(q, (b, h, sq), torch.float32) if return_lse else None
    _run_forward(state, q, k, v, out, lse, 0, 0, softmax_scale, causal, window_size, num_splits)
    return out, lse


# flash_attn_varlen_func's own fs_attention_params_v3 per thread: it sets cu_seqlens_q/k (and
# seqused_k), which _dense's block never holds.
_varlen_state = None


def _varlen_fast(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                 causal, window_size, num_splits, return_lse, seqused_k=None):
    """flash_attn_varlen_func's host fast path (dense K/V; _varlen_fast_ok holds): (out, lse or
    None), packed as _dense's call with the length tensors beside."""
    global _varlen_state
    state = _varlen_state
    if state is None:
        state = _varlen_state = _State()
    buf, off = state.buffer, _get_calls().offsets
    total_q, h, _ = q.shape
    out = empty(q, (total_q, h, v.shape[2]))
    lse = empty(q, (h, total_q), torch.float32) if return_lse else None
    _pack(buf, off["cu_seqlens_q"], cu_seqlens_q, _capi.INT32)
    _pack(buf, off["cu_seqlens_k"], cu_seqlens_k, _capi.INT32)
    _pack_or_absent(buf, off["seqused_k"], seqused_k)
    _run_forward(state, q, k, v, out, lse,
                 _attention._int(max_seqlen_q, "max_seqlen_q", _attention._INT64),
                 _attention._int(max_seqlen_k, "max_seqlen_k", _attention._INT64),
                 softmax_scale, causal, window_size, num_splits)
    return out, lse


def _pack_scalars(buf, offset, ref, workspace_size, like, *scalars):
    """Packs the scalars max_seqlen_q .. stream (`_SCALARS` less the workspace) at `offset` of a
    parameter block, asks the library's `workspace_size` query about the block `ref` (which
    validates it: an error is raised here), and when it asks for a workspace, allocates one on
    like's device and packs it too. The workspace, or None: the caller keeps it alive until its
    call is enqueued (stream-ordered: PyTorch's allocator reuses it only behind that work)."""
    _SCALARS.pack_into(buf, offset, *scalars, 0, 0)
    size = workspace_size(ref)
    if size == _SIZE_MAX:
        _capi.raise_last()
    if not size:
        return None
    workspace = empty(like, (size,), torch.uint8)
    _SCALARS.pack_into(buf, offset, *scalars, workspace.data_ptr(), size)
    return workspace


def _run_forward(state, q, k, v, out, lse, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                 window_size, num_splits):
    """Packs q, k, v, out, lse and the scalars into state's fs_attention_params_v3 (its other
    fields as the caller left them) and runs the forward, with a workspace when it needs one."""
    calls = _get_calls()
    buf, off = state.buffer, calls.offsets
    left, right = _attention._window(window_size, causal)
    scale = _attention._scale(softmax_scale)
    splits = _attention._int(num_splits, "num_splits", _attention._INT32)
    code = _DTYPES[q.dtype]
    _pack(buf, off["q"], q, code)
    _pack(buf, off["k"], k, _DTYPES[k.dtype])
    _pack(buf, off["v"], v, _DTYPES[v.dtype])
    _pack(buf, off["out"], out, code)
    if lse is not None:
        _pack(buf, off["lse"], lse, _capi.FLOAT32)
    else:
        buf[off["lse"]:off["lse"] + _FS_TENSOR.size] = _ABSENT
    workspace = _pack_scalars(buf, off["max_seqlen_q"], state.ref, calls.workspace_size, q,
                              max_seqlen_q, max_seqlen_k, scale, 1 if causal else 0, left, right,
                              splits, _current_stream(q.device.index))
    status = calls.forward(state.ref)
    if status:
        _capi.raise_for(status)
    del workspace  # kept alive until the call is enqueued (_pack_scalars)


# ---------------------------------------------------------------- the backward's fast path

class _BackwardCalls:
    """fs_attention_backward_v3 and its workspace query, looked up once, and the offsets in
    fs_attention_backward_params_v3 that fast_backward packs at."""

    def __init__(self):
        lib = _capi.lib()
        self.backward = lib.fs_attention_backward_v3
        self.workspace_size = lib.fs_attention_backward_workspace_size_v3
        B, P = _capi.AttentionBackwardParamsV3, _capi.AttentionParams
        base = B.attn.offset + _capi.AttentionParamsV3.base.offset
        self.offsets = {name: base + getattr(P, name).offset
                        for name in ("q", "k", "v", "out", "lse", "cu_seqlens_q",
                                     "cu_seqlens_k", "seqused_k", "max_seqlen_q")}
        self.offsets.update({name: getattr(B, name).offset
                             for name in ("dout", "dlse", "dq", "dk", "dv", "deterministic")})


_backward_calls = None


class _BackwardState(_Block):
    """fs_attention_backward_params_v3 per thread; its score modifiers stay off."""

    def __init__(self):
        super().__init__(_capi.AttentionBackwardParamsV3, "fs_attention_backward_params_v3_init")


_backward_state = None
_INT32 = struct.Struct("@i")


def fast_backward(dout, q, k, v, out, lse, dlse, scale, causal, left, right, deterministic,
                  cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0,
                  seqused_k=None):
    """(dq, dk, dv) of a forward of the fast paths (_dense's, or _varlen_fast's when cu_seqlens_q
    is given) through fs_attention_backward_v3, packed as the forward: no DLPack capsule per
    tensor, no ctypes field assignments (the generic _backward.backward spent ~1.4 ms of host
    time a call on them, more than the kernels take at 2k tokens). scale, left and right are the
    C API's (0.0: the default scale; the window after causal), max_seqlen_* checked integers.
    None when the tensors need the generic path."""
    varlen = cu_seqlens_q is not None
    if not (_fast_tensors(3 if varlen else 4, dout, q, k, v, out) and type(lse) is Tensor and
            lse.is_cuda and lse.dtype == torch.float32 and lse.dim() == (2 if varlen else 3) and
            (dlse is None or (type(dlse) is Tensor and dlse.is_cuda and
                              dlse.dtype == torch.float32 and dlse.dim() == lse.dim())) and
            _fast_lengths(cu_seqlens_q, cu_seqlens_k, seqused_k) and _get_calls().ok):
        return None
    global _backward_calls, _backward_state
    if _backward_calls is None:
        _backward_calls = _BackwardCalls()
    if _backward_state is None:
        _backward_state = _BackwardState()
    calls, state = _backward_calls, _backward_state
    buf, off = state.buffer, calls.offsets
    grads = (empty_like(q), empty_like(k), empty_like(v))
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout),
                    ("dq", grads[0]), ("dk", grads[1]), ("dv", grads[2])):
        _pack(buf, off[name], t, _DTYPES[t.dtype])
    _pack(buf, off["lse"], lse, _capi.FLOAT32)
    for name, t in (("dlse", dlse), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k", cu_seqlens_k), ("seqused_k", seqused_k)):
        _pack_or_absent(buf, off[name], t)
    _INT32.pack_into(buf, off["deterministic"], 1 if deterministic else 0)
    workspace = _pack_scalars(buf, off["max_seqlen_q"], state.ref, calls.workspace_size, q,
                              max_seqlen_q, max_seqlen_k, scale, 1 if causal else 0, left, right,
                              0, _current_stream(q.device.index))
    status = calls.backward(state.ref)
    if status:
        _capi.raise_for(status)
    del workspace  # kept alive until the call is enqueued (_pack_scalars)
    return grads


# ---------------------------------------------------------------- the KV-cache fast path

class _KvCalls:
    """fs_kvcache_append and the offsets of its params."""

    def __init__(self):
        lib = _capi.lib()
        self.append = lib.fs_kvcache_append
        self.validate = lib.fs_kvcache_append_validate
        A = _capi.KvCacheAppendParams
        self.offsets = {name: getattr(A, name).offset for name, _ in A._fields_}
        self.ok = (A.rotary_sin.offset + _FS_TENSOR.size == A.rotary_interleaved.offset and
                   A.q_positions_per_token.offset == A.rotary_interleaved.offset + 4)


_kv_calls = None


class _KvState(threading.local):
    """Per thread: an fs_kvcache_append_params and an fs_attention_params of the kvcache call's
    own (its attention sets seqused_k and block_table, which flash_attn_func's never does)."""

    def __init__(self):
        self.append_buffer = bytearray(ctypes.sizeof(_capi.KvCacheAppendParams))
        self.append = _capi.KvCacheAppendParams.from_buffer(self.append_buffer)
        self.append_ref = ctypes.byref(self.append)
        self.attn_buffer = bytearray(ctypes.sizeof(_capi.AttentionParamsV3))
        self.attn = _capi.AttentionParamsV3.from_buffer(self.attn_buffer)
        self.attn_ref = ctypes.byref(self.attn)
        lib = _capi.lib()
        lib.fs_kvcache_append_params_init(self.append_ref)
        lib.fs_attention_params_v3_init(self.attn_ref)


_kv_state = None
_INT64 = struct.Struct("@q")
_TWO_INT32 = struct.Struct("@ii")
_POINTER = struct.Struct("@P")


def _plain_cuda(t, rank=None):
    return (type(t) is Tensor and t.is_cuda and not t.requires_grad and
            (rank is None or t.dim() == rank) and (t.dim() == 0 or t.stride(-1) == 1))


def _kvcache_fast_ok(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                     cache_batch_idx, block_table):
    """CUDA tensors of the expected ranks with a contiguous last dimension, float dtypes the
    library knows (int32 for the indices): anything else takes the generic path, which names it."""
    if not (_plain_cuda(q, 4) and _plain_cuda(k_cache, 4) and _plain_cuda(v_cache, 4)):
        return False
    for t in (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin):
        if t is not None and t.dtype not in _DTYPES:
            return False
    for t in (cache_seqlens, cache_batch_idx):
        if t is not None and not (_plain_cuda(t, 1) and t.dtype == torch.int32):
            return False
    if block_table is not None and not (_plain_cuda(block_table, 2) and
                                        block_table.dtype == torch.int32):
        return False
    if (k is None) != (v is None) or (rotary_cos is None) != (rotary_sin is None):
        return False
    for t in (k, v):
        if t is not None and not _plain_cuda(t, 4):
            return False
    for t in (rotary_cos, rotary_sin):
        if t is not None and not _plain_cuda(t, 2):
            return False
    return _get_calls().ok and _get_kv_calls().ok


def _get_kv_calls():
    global _kv_calls
    if _kv_calls is None:
        _kv_calls = _KvCalls()
    return _kv_calls


def _pack_or_absent(buffer, offset, t):
    if t is None:
        buffer[offset:offset + _FS_TENSOR.size] = _ABSENT
    else:
        _pack(buffer, offset, t, _capi.INT32 if t.dtype == torch.int32 else _DTYPES[t.dtype])


def _kvcache_fast(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen,
                  cache_batch_idx, block_table, softmax_scale, causal, window_size,
                  rotary_interleaved, num_splits, return_lse):
    """_kvcache for CUDA tensors: the two library calls with packed params, no DLPack."""
    global _kv_state
    state = _kv_state
    if state is None:
        state = _kv_state = _KvState()
    calls, kv_calls = _get_calls(), _get_kv_calls()
    left, right = _attention._window(window_size, causal)
    scale = _attention._scale(softmax_scale)
    splits = _attention._int(num_splits, "num_splits", _attention._INT32)
    paged = block_table is not None
    capacity = k_cache.shape[1] * (block_table.shape[1] if paged else 1)
    if cache_seqlens is None:
        cache_seqlen = capacity if cache_seqlen < 0 else _attention._int(
            cache_seqlen, "cache_seqlens", _attention._INT64)
    b, sq, h, _ = q.shape
    stream = _current_stream(q.device.index)

    # The append (+ rotary): new k/v into the cache, q rotated, the new lengths.
    buf, off = state.append_buffer, kv_calls.offsets
    rotary = rotary_cos is not None
    q_attn = empty(q, tuple(q.shape)) if rotary else q
    seqlens = empty(q, (b,), torch.int32)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k_new", k), ("v_new", v),
                    ("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
                    ("block_table", block_table), ("rotary_cos", rotary_cos),
                    ("rotary_sin", rotary_sin), ("q", q if rotary else None),
                    ("q_out", q_attn if rotary else None), ("seqlens_out", seqlens)):
        _pack_or_absent(buf, off[name], t)
    _INT64.pack_into(buf, off["cache_seqlen"], 0 if cache_seqlens is not None else cache_seqlen)
    _TWO_INT32.pack_into(buf, off["rotary_interleaved"], 1 if rotary_interleaved else 0,
                         1 if (left >= 0 or right >= 0) else 0)
    _POINTER.pack_into(buf, off["stream"], stream)

    # The attention over the updated cache (a contiguous cache with cache_batch_idx is a paged one
    # whose pages are whole sequences: cache_batch_idx seen as a (batch, 1) block table).
    buf, off = state.attn_buffer, calls.offsets
    P = _capi.AttentionParams
    out = empty(q, (b, sq, h, v_cache.shape[3]))
    lse = empty(q, (b, h, sq), torch.float32) if return_lse else None
    code = _DTYPES[q.dtype]
    _pack(buf, off["q"], q_attn, code)
    _pack(buf, off["k"], k_cache, _DTYPES[k_cache.dtype])
    _pack(buf, off["v"], v_cache, _DTYPES[v_cache.dtype])
    _pack(buf, off["out"], out, code)
    _pack_or_absent(buf, off["lse"], lse)
    _pack(buf, P.seqused_k.offset, seqlens, _capi.INT32)
    if paged:
        _pack(buf, P.block_table.offset, block_table, _capi.INT32)
        max_k = capacity
    elif cache_batch_idx is not None:
        _FS_TENSOR.pack_into(buf, P.block_table.offset, cache_batch_idx.data_ptr(), _capi.INT32,
                             _capi.CUDA, cache_batch_idx.device.index, 2,
                             cache_batch_idx.shape[0], 1, 0, 0, cache_batch_idx.stride(0), 1,
                             0, 0)
        max_k = capacity
    else:
        buf[P.block_table.offset:P.block_table.offset + _FS_TENSOR.size] = _ABSENT
        max_k = 0

    # Both calls validated before the cache is written, then the append, then the attention.
    names = _attention._kvcache_names(cache_batch_idx is not None and not paged)
    status = kv_calls.validate(state.append_ref)
    if status:
        with _attention._append_names():
            _capi.raise_for(status)
    with names:
        # The size query validates and runs the CUDA dispatch's own checks (dtype, head dim,
        # device): a call the kernels refuse is refused here, before the append writes the cache.
        workspace = _pack_scalars(buf, off["max_seqlen_q"], state.attn_ref, calls.workspace_size,
                                  q, 0, max_k, scale, 1 if causal else 0, left, right, splits,
                                  stream)
    status = kv_calls.append(state.append_ref)
    if status:
        _capi.raise_for(status)
    with names:
        status = calls.forward(state.attn_ref)
        if status:
            _capi.raise_for(status)
    del workspace
    return out, lse


# ---------------------------------------------------------------- custom operators

_NO_LSE = (0,)
_FP8 = getattr(torch, "float8_e4m3fn", None)


def _out_dtype(q):
    """out's dtype: q's, or bfloat16 for a float8_e4m3fn q (FlashAttention-3's rule)."""
    return torch.bfloat16 if q.dtype == _FP8 else q.dtype


def _fp8_call(q, k, v, descales):
    """Whether this is a float8_e4m3fn call (or one with descale factors): forward only, and its
    arguments that require grad are refused by name."""
    return _FP8 is not None and (q.dtype == _FP8 or k.dtype == _FP8 or v.dtype == _FP8) \
        or any(x is not None for x in descales)


def _lse_or_empty(q, lse):
    return lse if lse is not None else q.new_empty(_NO_LSE, dtype=torch.float32)


def _define_ops():
    """Registers flashserve::fwd, ::varlen_fwd and ::with_kvcache (PyTorch >= 2.4)."""

    @torch.library.custom_op("flashserve::fwd", mutates_args=())
    def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: Optional[float], causal: bool,
            window_left: int, window_right: int, num_splits: int, return_lse: bool,
            deterministic: bool = False, softcap: float = 0.0,
            alibi_slopes: Optional[Tensor] = None, q_descale: Optional[Tensor] = None,
            k_descale: Optional[Tensor] = None,
            v_descale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        out, lse = _dense(q.detach(), k.detach(), v.detach(), softmax_scale, causal,
                          (window_left, window_right), num_splits, return_lse, softcap,
                          alibi_slopes, q_descale, k_descale, v_descale)
        return out, _lse_or_empty(q, lse)

    @fwd.register_fake
    def _(q, k, v, softmax_scale, causal, window_left, window_right, num_splits, return_lse,
          deterministic=False, softcap=0.0, alibi_slopes=None, q_descale=None, k_descale=None,
          v_descale=None):
        out = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],), dtype=_out_dtype(q))
        lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if return_lse else _NO_LSE
        return out, q.new_empty(lse_shape, dtype=torch.float32)

    @torch.library.custom_op("flashserve::varlen_fwd", mutates_args=())
    def varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
                   cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                   softmax_scale: Optional[float], causal: bool, window_left: int,
                   window_right: int, return_lse: bool, block_table: Optional[Tensor],
                   seqused_k: Optional[Tensor], num_splits: int, deterministic: bool = False,
                   softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None,
                   q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                   v_descale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        out, lse = _varlen(q.detach(), k.detach(), v.detach(), cu_seqlens_q, cu_seqlens_k,
                           max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                           (window_left, window_right), return_lse, block_table, seqused_k,
                           num_splits, softcap, alibi_slopes, q_descale, k_descale, v_descale)
        return out, _lse_or_empty(q, lse)

    @varlen_fwd.register_fake
    def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
          window_left, window_right, return_lse, block_table, seqused_k, num_splits,
          deterministic=False, softcap=0.0, alibi_slopes=None, q_descale=None, k_descale=None,
          v_descale=None):
        out = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],), dtype=_out_dtype(q))
        lse_shape = (q.shape[1], q.shape[0]) if return_lse else _NO_LSE
        return out, q.new_empty(lse_shape, dtype=torch.float32)

    @torch.library.custom_op("flashserve::with_kvcache", mutates_args=("k_cache", "v_cache"))
    def with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
                     v: Optional[Tensor], rotary_cos: Optional[Tensor],
                     rotary_sin: Optional[Tensor], cache_seqlens: Optional[Tensor],
                     cache_seqlen: int, cache_batch_idx: Optional[Tensor],
                     block_table: Optional[Tensor], softmax_scale: Optional[float], causal: bool,
                     window_left: int, window_right: int, rotary_interleaved: bool,
                     num_splits: int, return_lse: bool, softcap: float = 0.0,
                     alibi_slopes: Optional[Tensor] = None, q_descale: Optional[Tensor] = None,
                     k_descale: Optional[Tensor] = None,
                     v_descale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        out, lse = _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                            cache_seqlen, cache_batch_idx, block_table, softmax_scale, causal,
                            (window_left, window_right), rotary_interleaved, num_splits,
                            return_lse, softcap, alibi_slopes, q_descale, k_descale, v_descale)
        return out, _lse_or_empty(q, lse)

    @with_kvcache.register_fake
    def _(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen,
          cache_batch_idx, block_table, softmax_scale, causal, window_left, window_right,
          rotary_interleaved, num_splits, return_lse, softcap=0.0, alibi_slopes=None,
          q_descale=None, k_descale=None, v_descale=None):
        out = q.new_empty(tuple(q.shape[:-1]) + (v_cache.shape[-1],), dtype=_out_dtype(q))
        lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if return_lse else _NO_LSE
        return out, q.new_empty(lse_shape, dtype=torch.float32)

    _autograd.define_backward_ops()
    # Called through the packet (torch.ops.flashserve.*), the form torch.compile knows best.
    return torch.ops.flashserve.fwd, torch.ops.flashserve.varlen_fwd, \
        torch.ops.flashserve.with_kvcache


_ops = None


def register():
    """Defines the custom operators (once)."""
    global _ops
    if _ops is None and hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
        _ops = _define_ops()


def _use_ops(q):
    """Whether this call goes through the dispatcher: while torch.compile traces, or for tensor
    subclasses (FakeTensor, functional tensors); eager plain tensors call the implementation."""
    return _ops is not None and (_is_compiling() or type(q) is not Tensor)


def _check_fp8_grad(q, k, v, descales):
    if torch.is_grad_enabled():
        _attention.check_fp8_grad((("q", q), ("k", k), ("v", v), ("q_descale", descales[0]),
                                   ("k_descale", descales[1]), ("v_descale", descales[2])))


def _check_grad(*named):
    if torch.is_grad_enabled():
        for name, x in named:
            if x is not None and x.requires_grad:
                _tensor.check_autograd(x, name, "flash_attn_with_kvcache is not differentiable "
                                       "(it appends to the cache in place)")


def _window_pair(window_size):
    """The window as the generic path reads it (checked integers, negative or past int32 meaning
    unbounded): int() would truncate 1.5 to 1 and hand 2**70 to an int64 schema."""
    return _attention._window(window_size, False)


def _int32(value, name):
    return _attention._int(value, name, _attention._INT32)


def _int64(value, name):
    return _attention._int(value, name, _attention._INT64)


def _opt_float(x):
    return None if x is None else float(x)


# ---------------------------------------------------------------- the public functions' bodies

def flash_attn_func(q, k, v, softmax_scale, causal, window_size, return_lse, num_splits,
                    deterministic=False, softcap=0.0, alibi_slopes=None, q_descale=None,
                    k_descale=None, v_descale=None):
    """(out, lse), lse None unless return_lse."""
    softcap = _attention._softcap(softcap)
    deterministic = _attention._flag(deterministic, "deterministic")
    _autograd.refuse_slope_grad(alibi_slopes)
    descales = (q_descale, k_descale, v_descale)
    if _fp8_call(q, k, v, descales):
        _check_fp8_grad(q, k, v, descales)
        if _use_ops(q):
            left, right = _window_pair(window_size)
            out, lse = _ops[0](q, k, v, _opt_float(softmax_scale), bool(causal), left, right,
                               _int32(num_splits, "num_splits"), bool(return_lse), deterministic,
                               softcap, alibi_slopes, *descales)
        else:
            out, lse = _dense(q, k, v, softmax_scale, causal, window_size, num_splits, return_lse,
                              softcap, alibi_slopes, *descales)
        return out, (lse if return_lse else None)
    if _autograd.needs_grad(q, k, v):
        # Through the operator, whose autograd formula (_autograd.py) needs the LSE.
        _autograd.require_ops(_ops, q)
        _autograd.refuse_cuda_modifier_grad(q, softcap, alibi_slopes)
        _autograd.refuse_cuda_head_dim_grad(q, k, v)
        left, right = _window_pair(window_size)
        if (softcap == 0.0 and alibi_slopes is None and not _use_ops(q) and
                _fast_tensors(4, q, k, v) and _get_calls().ok):
            out, lse = _autograd.DenseFunction.apply(
                q, k, v, _opt_float(softmax_scale), bool(causal), left, right,
                _int32(num_splits, "num_splits"), deterministic)
        else:
            out, lse = _ops[0](q, k, v, _opt_float(softmax_scale), bool(causal), left, right,
                               _int32(num_splits, "num_splits"), True, deterministic, softcap,
                               alibi_slopes)
    elif _use_ops(q):
        left, right = _window_pair(window_size)
        out, lse = _ops[0](q, k, v, _opt_float(softmax_scale), bool(causal), left, right,
                           _int32(num_splits, "num_splits"), bool(return_lse), deterministic,
                           softcap, alibi_slopes)
    else:
        out, lse = _dense(q, k, v, softmax_scale, causal, window_size, num_splits, return_lse,
                          softcap, alibi_slopes)
    return out, (lse if return_lse else None)


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
            causal, window_size, return_lse, block_table, seqused_k, num_splits, softcap=0.0,
            alibi_slopes=None, q_descale=None, k_descale=None, v_descale=None):
    return _attention._forward(q, k, v, varlen=True, cu_seqlens_q=cu_seqlens_q,
                               cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                               max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale,
                               causal=causal, window_size=window_size, return_lse=return_lse,
                               block_table=block_table, seqused_k=seqused_k,
                               num_splits=num_splits, softcap=softcap, alibi_slopes=alibi_slopes,
                               q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           softmax_scale, causal, window_size, return_lse, block_table, seqused_k,
                           num_splits, deterministic=False, softcap=0.0, alibi_slopes=None,
                           q_descale=None, k_descale=None, v_descale=None):
    """(out, lse), lse None unless return_lse."""
    softcap = _attention._softcap(softcap)
    deterministic = _attention._flag(deterministic, "deterministic")
    _autograd.refuse_slope_grad(alibi_slopes)
    descales = (q_descale, k_descale, v_descale)
    if _fp8_call(q, k, v, descales):
        _check_fp8_grad(q, k, v, descales)
        if _use_ops(q):
            left, right = _window_pair(window_size)
            out, lse = _ops[1](q, k, v, cu_seqlens_q, cu_seqlens_k,
                               _int64(max_seqlen_q, "max_seqlen_q"),
                               _int64(max_seqlen_k, "max_seqlen_k"), _opt_float(softmax_scale),
                               bool(causal), left, right, bool(return_lse), block_table,
                               seqused_k, _int32(num_splits, "num_splits"), deterministic,
                               softcap, alibi_slopes, *descales)
        else:
            out, lse = _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale, causal, window_size, return_lse, block_table,
                               seqused_k, num_splits, softcap, alibi_slopes, *descales)
        return out, (lse if return_lse else None)
    grad = _autograd.needs_grad(q, k, v)
    if grad:
        _autograd.require_ops(_ops, q)
        _autograd.refuse_cuda_modifier_grad(q, softcap, alibi_slopes)
        _autograd.refuse_cuda_head_dim_grad(q, k, v)
        if block_table is not None:
            raise NotImplementedError("block_table: the backward takes dense or varlen K/V, not "
                                      "a paged KV cache; detach q, k and v to run the forward")
    if (grad and softcap == 0.0 and alibi_slopes is None and not _use_ops(q) and
            _varlen_fast_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)):
        # (block_table is None: refused above with a gradient)
        left, right = _window_pair(window_size)
        out, lse = _autograd.VarlenFunction.apply(
            q, k, v, cu_seqlens_q, cu_seqlens_k, _int64(max_seqlen_q, "max_seqlen_q"),
            _int64(max_seqlen_k, "max_seqlen_k"), _opt_float(softmax_scale), bool(causal), left,
            right, seqused_k, _int32(num_splits, "num_splits"), deterministic)
    elif grad or _use_ops(q):
        left, right = _window_pair(window_size)
        out, lse = _ops[1](q, k, v, cu_seqlens_q, cu_seqlens_k,
                           _int64(max_seqlen_q, "max_seqlen_q"),
                           _int64(max_seqlen_k, "max_seqlen_k"),
                           _opt_float(softmax_scale),
                           bool(causal), left, right, bool(return_lse) or grad, block_table,
                           seqused_k, _int32(num_splits, "num_splits"), deterministic, softcap,
                           alibi_slopes)
    elif (block_table is None and softcap == 0.0 and alibi_slopes is None and
          _varlen_fast_ok(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)):
        out, lse = _varlen_fast(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                softmax_scale, causal, window_size, num_splits, return_lse,
                                seqused_k)
    else:
        out, lse = _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           softmax_scale, causal, window_size, return_lse, block_table, seqused_k,
                           num_splits, softcap, alibi_slopes)
    return out, (lse if return_lse else None)


def _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlen,
             cache_batch_idx, block_table, softmax_scale, causal, window_size, rotary_interleaved,
             num_splits, return_lse, softcap=0.0, alibi_slopes=None, q_descale=None,
             k_descale=None, v_descale=None):
    """cache_seqlens: a tensor, or None with cache_seqlen an int (-1: the whole cache). Calls with
    descales (or float8_e4m3fn tensors, which _kvcache_fast_ok never takes) take the generic
    path: its v4 parameter block carries the descales."""
    descales = (q_descale, k_descale, v_descale)
    plain = (softcap == 0.0 and alibi_slopes is None and q_descale is None and
             k_descale is None and v_descale is None)
    if plain and _kvcache_fast_ok(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                  cache_seqlens, cache_batch_idx, block_table):
        return _kvcache_fast(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                             cache_seqlen, cache_batch_idx, block_table, softmax_scale, causal,
                             window_size, rotary_interleaved, num_splits, return_lse)
    lengths = cache_seqlens if cache_seqlens is not None else (
        None if cache_seqlen < 0 else cache_seqlen)
    return _attention._with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, lengths,
                                    cache_batch_idx, block_table, softmax_scale, causal,
                                    window_size, rotary_interleaved, num_splits, return_lse,
                                    softcap, alibi_slopes, *descales)


def flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                            cache_batch_idx, block_table, softmax_scale, causal, window_size,
                            rotary_interleaved, num_splits, return_lse, softcap=0.0,
                            alibi_slopes=None, q_descale=None, k_descale=None, v_descale=None):
    descales = (q_descale, k_descale, v_descale)
    if torch.is_grad_enabled():
        _attention.check_fp8_grad((("q_descale", q_descale), ("k_descale", k_descale),
                                   ("v_descale", v_descale)))
    _check_grad(("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v),
                ("alibi_slopes", alibi_slopes))
    softcap = _attention._softcap(softcap)
    if isinstance(cache_seqlens, Tensor) and cache_seqlens.dim() > 0:
        lengths, length = cache_seqlens, -1
    elif cache_seqlens is None:
        lengths, length = None, -1
    else:  # an int (or a 0-d tensor): one length for every sequence
        # Checked as the generic path checks it: int() would truncate 3.7 to 3.
        lengths, length = None, _int64(cache_seqlens, "cache_seqlens")
        if length < 0:
            raise ValueError(f"cache_seqlens: {length} is negative")
    if _use_ops(q):
        left, right = _window_pair(window_size)
        out, lse = _ops[2](q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, lengths, length,
                           cache_batch_idx, block_table, _opt_float(softmax_scale), bool(causal),
                           left, right, bool(rotary_interleaved),
                           _int32(num_splits, "num_splits"), bool(return_lse), softcap,
                           alibi_slopes, *descales)
    else:
        out, lse = _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, lengths, length,
                            cache_batch_idx, block_table, softmax_scale, causal, window_size,
                            rotary_interleaved, num_splits, return_lse, softcap, alibi_slopes,
                            *descales)
    return (out, lse) if return_lse else out
