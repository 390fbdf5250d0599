"""The backward's C API (fs_attention_backward and friends) through the package's ctypes binding
and its framework-neutral caller (flashserve/_backward.py), on NumPy arrays: gradients against an
independent float64 NumPy backward, and errors that name the argument. Runs without PyTorch."""

import ctypes
import math

import numpy as np
import pytest

from flashserve import _backward, _capi, flash_attn_func, flash_attn_varlen_func
from attention_reference import check_close, visible


def reference_backward(q, k, v, dout, scale, causal, window=(-1, -1)):
    """float64 (dq, dk, dv) of one sequence: P from S, D = rowsum(dout * out), dS = P (dP - D)."""
    q_len, h_q, _ = q.shape
    group = h_q // k.shape[1]
    mask = visible(q_len, k.shape[0], causal, window)
    seen = mask.any(axis=1)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for h in range(h_q):
        kh, vh = k[:, h // group], v[:, h // group]
        s = np.where(mask, q[:, h] @ kh.T * scale, -np.inf)
        m = np.where(seen, s.max(axis=1, initial=-np.inf), 0.0)
        e = np.exp(s - m[:, None])
        p = e / np.where(seen, e.sum(axis=1), 1.0)[:, None]
        dp = dout[:, h] @ vh.T
        delta = (dout[:, h] * (p @ vh)).sum(axis=1)
        ds = p * (dp - delta[:, None])
        dq[:, h] = scale * ds @ kh
        dk[:, h // group] += scale * ds.T @ q[:, h]
        dv[:, h // group] += p.T @ dout[:, h]
    return dq, dk, dv


def test_dense_float32_matches_the_numpy_reference():
    rng = np.random.default_rng(2220)
    b, sq, sk, h, hk, d = 2, 37, 21, 4, 2, 16
    q = rng.standard_normal((b, sq, h, d), dtype=np.float32)
    k = rng.standard_normal((b, sk, hk, d), dtype=np.float32)
    v = rng.standard_normal((b, sk, hk, d), dtype=np.float32)
    dout = rng.standard_normal((b, sq, h, d), dtype=np.float32)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = _backward.backward(dout, q, k, v, out, lse, varlen=False, causal=True,
                                    deterministic=True)
    for x, g in ((q, dq), (k, dk), (v, dv)):
        assert g.shape == x.shape and g.dtype == np.float32
    for i in range(b):
        exact = reference_backward(*(x[i].astype(np.float64) for x in (q, k, v, dout)),
                                   1 / math.sqrt(d), True)
        for name, got, e in zip(("dq", "dk", "dv"), (dq[i], dk[i], dv[i]), exact):
            # float32 against float64: no naive low-precision run needed, a relative floor.
            check_close(got, e, e, 1e-5 * max(np.abs(e).max(initial=0.0), 1.0), what=name)


def test_varlen_float16_with_an_empty_sequence():
    rng = np.random.default_rng(2221)
    q_lens, kv_lens = [9, 0, 17], [13, 4, 6]
    cu_q = np.array([0] + np.cumsum(q_lens).tolist(), dtype=np.int32)
    cu_k = np.array([0] + np.cumsum(kv_lens).tolist(), dtype=np.int32)
    q = rng.standard_normal((cu_q[-1], 2, 32)).astype(np.float16)
    k = rng.standard_normal((cu_k[-1], 1, 32)).astype(np.float16)
    v = rng.standard_normal((cu_k[-1], 1, 32)).astype(np.float16)
    dout = rng.standard_normal(q.shape).astype(np.float16)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 13, window_size=(5, 2),
                                      return_lse=True)
    dq, dk, dv = _backward.backward(dout, q, k, v, out, lse, varlen=True, cu_seqlens_q=cu_q,
                                    cu_seqlens_k=cu_k, max_seqlen_q=17, max_seqlen_k=13,
                                    window_size=(5, 2))
    for b in range(3):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        exact = reference_backward(*(x.astype(np.float64) for x in (q[qs], k[ks], v[ks],
                                                                     dout[qs])),
                                   1 / math.sqrt(32), False, (5, 2))
        for name, got, e in zip(("dq", "dk", "dv"), (dq[qs], dk[ks], dv[ks]), exact):
            # fp16 gradients (stored rounded) of float32 arithmetic: 2^-9 of the largest.
            check_close(got, e, e, 2.0**-9 * max(np.abs(e).max(initial=0.0), 1.0), what=name)
    assert np.all(dk[cu_k[1]:cu_k[2]] == 0) and np.all(dv[cu_k[1]:cu_k[2]] == 0)


def _tensor(a):
    t = _capi.Tensor()
    t.data = a.ctypes.data
    t.dtype = {np.dtype(np.float32): _capi.FLOAT32, np.dtype(np.int32): _capi.INT32}[a.dtype]
    t.device_type, t.device_index, t.rank = _capi.CPU, 0, a.ndim
    for i, (n, s) in enumerate(zip(a.shape, a.strides)):
        t.shape[i], t.strides[i] = n, s // a.itemsize
    return t


def test_struct_defaults_and_errors_by_name():
    lib = _capi.lib()
    assert lib.fs_sizeof_attention_backward_params() == ctypes.sizeof(
        _capi.AttentionBackwardParams)
    params = _capi.default_backward_params()
    assert params.attn.window_left == -1 and params.attn.num_splits == 1
    assert params.deterministic == 0
    rng = np.random.default_rng(2222)
    q, k, v = (rng.standard_normal((1, 6, 2, 8), dtype=np.float32) for _ in range(3))
    out, lse = flash_attn_func(q, k, v, return_lse=True)
    dout = rng.standard_normal(out.shape, dtype=np.float32)
    grads = [np.full(x.shape, np.nan, dtype=np.float32) for x in (q, k, v)]
    keep = (q, k, v, out, lse, dout, *grads)
    for name, a in zip(("q", "k", "v", "out", "lse"), keep[:5]):
        setattr(params.attn, name, _tensor(a))
    for name, a in zip(("dout", "dq", "dk", "dv"), keep[5:]):
        setattr(params, name, _tensor(a))
    assert lib.fs_attention_backward_validate(ctypes.byref(params)) == _capi.OK
    assert lib.fs_attention_backward_workspace_size(ctypes.byref(params)) == 0
    assert lib.fs_attention_backward(ctypes.byref(params)) == _capi.OK
    assert all(np.isfinite(g).all() for g in grads)

    params.dk = _tensor(grads[1][:, :5])
    status = lib.fs_attention_backward(ctypes.byref(params))
    with pytest.raises(ValueError, match=r"^dk: shape \[1, 5, 2, 8\] differs from k's"):
        _capi.raise_for(status)
    params.dk = _tensor(grads[1])
    params.attn.lse = _capi.Tensor()
    with pytest.raises(ValueError, match=r"^lse: is required"):
        _capi.raise_for(lib.fs_attention_backward(ctypes.byref(params)))
    assert lib.fs_attention_backward_workspace_size(ctypes.byref(params)) == \
        ctypes.c_size_t(-1).value
    assert lib.fs_last_status() == _capi.INVALID_ARGUMENT
    del keep
