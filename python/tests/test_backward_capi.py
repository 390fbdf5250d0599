"""The backward's C API (fs_attention_backward and friends) through the package's ctypes binding
and its framework-neutral caller (flashserve/_backward.py), on NumPy arrays: gradients against an
independent float64 NumPy backward, and errors that name the argument. Runs without PyTorch."""

import ctypes
import math

import numpy as np
import pytest

from flashserve import _backward, _capi, flash_attn_func, flash_attn_varlen_func
from attention_reference import check_close, scores, visible


def reference_backward(q, k, v, dout, scale, causal, window=(-1, -1), softcap=0.0, slopes=None):
    """float64 (dq, dk, dv) of one sequence: P from S, D = rowsum(dout * out), dS = P (dP - D),
    times the softcap's 1 - tanh^2 on the way to q.k (ALiBi's bias has no gradient)."""
    q_len, h_q, _ = q.shape
    group = h_q // k.shape[1]
    mask = visible(q_len, k.shape[0], causal, window)
    seen = mask.any(axis=1)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for h in range(h_q):
        kh, vh = k[:, h // group], v[:, h // group]
        s = np.where(mask, scores(q[:, h], kh, scale, softcap,
                                  None if slopes is None else slopes[h]), -np.inf)
        m = np.where(seen, s.max(axis=1, initial=-np.inf), 0.0)
        e = np.exp(s - m[:, None])
        p = e / np.where(seen, e.sum(axis=1), 1.0)[:, None]
        dp = dout[:, h] @ vh.T
        delta = (dout[:, h] * (p @ vh)).sum(axis=1)
        ds = p * (dp - delta[:, None])
        if softcap > 0:
            ds = ds * (1 - np.tanh(q[:, h] @ kh.T * scale / softcap) ** 2)
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


@pytest.mark.parametrize("softcap,alibi", [(1.3, False), (0.0, True), (0.9, True)])
def test_softcap_and_alibi_gradients_match_the_numpy_reference(softcap, alibi):
    rng = np.random.default_rng(2223)
    b, sq, sk, h, hk, d = 2, 19, 27, 4, 2, 16
    q, k, v, dout = (rng.standard_normal(shape, dtype=np.float32)
                     for shape in ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d), (b, sq, h, d)))
    slopes = rng.uniform(0.05, 0.8, (b, h)).astype(np.float32) if alibi else None
    scale = 0.6  # scores of about N(0, 6): the cap bends them
    out, lse = flash_attn_func(q, k, v, softmax_scale=scale, causal=True, softcap=softcap,
                               alibi_slopes=slopes, return_lse=True)
    dq, dk, dv = _backward.backward(dout, q, k, v, out, lse, varlen=False, softmax_scale=scale,
                                    causal=True, softcap=softcap, alibi_slopes=slopes)
    for i in range(b):
        exact = reference_backward(*(x[i].astype(np.float64) for x in (q, k, v, dout)), scale,
                                   True, softcap=softcap,
                                   slopes=None if slopes is None else slopes[i])
        for name, got, e in zip(("dq", "dk", "dv"), (dq[i], dk[i], dv[i]), exact):
            check_close(got, e, e, 1e-5 * max(np.abs(e).max(initial=0.0), 1.0), what=name)


def _tensor(a):
    t = _capi.Tensor()
    t.data = a.ctypes.data
    t.dtype = {np.dtype(np.float32): _capi.FLOAT32, np.dtype(np.int32): _capi.INT32}[a.dtype]
    t.device_type, t.device_index, t.rank = _capi.CPU, 0, a.ndim
    for i, (n, s) in enumerate(zip(a.shape, a.strides)):
        t.shape[i], t.strides[i] = n, s // a.itemsize
    return t


# The ABI-2 struct and entry points (what a program built before ABI 3 calls) and the ABI-3 ones
# (what the package calls) behave alike.
ABIS = {2: (_capi.AttentionBackwardParams, "fs_attention_backward_params_init", ""),
        3: (_capi.AttentionBackwardParamsV3, "fs_attention_backward_params_v3_init", "_v3")}


@pytest.mark.parametrize("abi", sorted(ABIS))
def test_struct_defaults_and_errors_by_name(abi):
    lib = _capi.lib()
    struct, init, suffix = ABIS[abi]

    def fn(name):
        f = getattr(lib, name + suffix)
        return lambda p: f(ctypes.byref(p))

    assert getattr(lib, "fs_sizeof_attention_backward_params" + suffix)() == \
        ctypes.sizeof(struct)
    params = struct()
    ctypes.memset(ctypes.byref(params), 0x5a, ctypes.sizeof(params))
    getattr(lib, init)(ctypes.byref(params))
    assert params.attn.window_left == -1 and params.attn.num_splits == 1
    assert params.deterministic == 0
    if abi == 3:
        assert params.attn.softcap == 0.0 and params.attn.alibi_slopes.rank == 0
        assert params.attn.alibi_slopes.data is None
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
    assert fn("fs_attention_backward_validate")(params) == _capi.OK
    assert fn("fs_attention_backward_workspace_size")(params) == 0
    assert fn("fs_attention_backward")(params) == _capi.OK
    assert all(np.isfinite(g).all() for g in grads)
    expected = _backward.backward(dout, q, k, v, out, lse, varlen=False)
    for g, e in zip(grads, expected):
        np.testing.assert_array_equal(g, e)

    params.dk = _tensor(grads[1][:, :5])
    status = fn("fs_attention_backward")(params)
    with pytest.raises(ValueError, match=r"^dk: shape \[1, 5, 2, 8\] differs from k's"):
        _capi.raise_for(status)
    params.dk = _tensor(grads[1])
    params.attn.lse = _capi.Tensor()
    with pytest.raises(ValueError, match=r"^lse: is required"):
        _capi.raise_for(fn("fs_attention_backward")(params))
    assert fn("fs_attention_backward_workspace_size")(params) == ctypes.c_size_t(-1).value
    assert lib.fs_last_status() == _capi.INVALID_ARGUMENT
    del keep
