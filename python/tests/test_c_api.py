"""The C ABI of libflashserve_c.so itself (include/flashserve/c_api.h), through ctypes and through a
small C program: status codes, per-thread messages, malformed structs, and that nothing throws
across the boundary."""

import ctypes
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import attention_reference
import flashserve
from flashserve import _capi, _tensor

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZE_MAX = ctypes.c_size_t(-1).value


def params_for(q, k, v, out, lse=None, **scalars):
    p = _capi.default_params()
    keep = []
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)):
        d = _tensor.describe(x, name)
        keep.append(d)
        setattr(p, name, d.struct)
    for key, value in scalars.items():
        setattr(p, key, value)
    return p, keep


def dense(seed, b=2, s=7, h=2, d=16):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, s, h, d)).astype(np.float32) for _ in range(3))
    out = np.full((b, s, h, d), np.nan, dtype=np.float32)
    return q, k, v, out


def call(fn, params):
    return fn(ctypes.byref(params))


def test_params_init_matches_the_cpp_defaults():
    p = _capi.AttentionParams()
    ctypes.memset(ctypes.byref(p), 0x5a, ctypes.sizeof(p))
    _capi.lib().fs_attention_params_init(ctypes.byref(p))
    assert (p.window_left, p.window_right, p.num_splits) == (-1, -1, 1)
    assert (p.causal, p.softmax_scale, p.max_seqlen_q, p.max_seqlen_k) == (0, 0.0, 0, 0)
    assert (p.stream, p.workspace, p.workspace_bytes) == (None, None, 0)
    for name in ("q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k", "seqused_k",
                 "block_table"):
        t = getattr(p, name)
        assert t.data is None and t.rank == 0 and list(t.shape) == [0] * 4


def test_v3_params_init_adds_the_score_modifiers_off():
    p = _capi.AttentionParamsV3()
    ctypes.memset(ctypes.byref(p), 0x5a, ctypes.sizeof(p))
    _capi.lib().fs_attention_params_v3_init(ctypes.byref(p))
    base = _capi.default_params().base
    assert bytes(p.base) == bytes(base) and ctypes.sizeof(p.base) == ctypes.sizeof(base)
    assert (p.window_left, p.num_splits, p.softcap) == (-1, 1, 0.0)
    assert p.alibi_slopes.data is None and p.alibi_slopes.rank == 0


def test_abi2_entry_points_still_run_the_abi2_struct(seed):
    """A program built against ABI 2 passes the ABI-2 struct to the unsuffixed functions: they
    read no field past it, and compute what the ABI-3 ones compute without modifiers."""
    lib = _capi.lib()
    q, k, v, out3 = dense(seed)
    out2 = np.full_like(out3, np.nan)
    lse2, lse3 = (np.full((2, 2, 7), np.nan, dtype=np.float32) for _ in range(2))
    p3, keep3 = params_for(q, k, v, out3, lse3, causal=1)
    p2 = _capi.AttentionParams()
    lib.fs_attention_params_init(ctypes.byref(p2))
    keep2 = []
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out2), ("lse", lse2)):
        d = _tensor.describe(x, name)
        keep2.append(d)
        setattr(p2, name, d.struct)
    p2.causal = 1
    assert call(lib.fs_attention_validate, p2) == 0 and call(lib.fs_attention_workspace_size,
                                                             p2) == 0
    assert call(lib.fs_attention_forward, p2) == 0
    assert call(lib.fs_attention_forward_v3, p3) == 0
    np.testing.assert_array_equal(out2, out3)
    np.testing.assert_array_equal(lse2, lse3)
    p2.window_left = -7
    assert call(lib.fs_attention_forward, p2) == _capi.INVALID_ARGUMENT
    assert lib.fs_last_error() == b"window_left: must be >= -1, got -7"
    del keep2, keep3


def test_struct_layout_and_version():
    lib = _capi.lib()
    assert lib.fs_abi_version() == _capi.ABI_VERSION == 4
    assert lib.fs_sizeof_tensor() == ctypes.sizeof(_capi.Tensor)
    assert lib.fs_sizeof_attention_params() == ctypes.sizeof(_capi.AttentionParams)
    assert lib.fs_sizeof_attention_params_v3() == ctypes.sizeof(_capi.AttentionParamsV3)
    assert lib.fs_sizeof_attention_params_v4() == ctypes.sizeof(_capi.AttentionParamsV4)
    assert lib.fs_sizeof_attention_backward_params_v3() == ctypes.sizeof(
        _capi.AttentionBackwardParamsV3)
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        cmake_version = re.search(r"project\(flashserve VERSION ([0-9.]+)", f.read()).group(1)
    assert flashserve.version() == cmake_version == flashserve.__version__


def test_forward_through_the_c_struct(seed):
    q, k, v, out = dense(seed)
    lse = np.full((2, 2, 7), np.nan, dtype=np.float32)
    p, keep = params_for(q, k, v, out, lse, causal=1)
    lib = _capi.lib()
    assert call(lib.fs_attention_validate_v3, p) == 0
    assert np.isnan(out).all(), "validate must not write"
    assert call(lib.fs_attention_workspace_size_v3, p) == 0  # the CPU path needs none
    assert call(lib.fs_attention_forward_v3, p) == 0
    assert lib.fs_last_error() == b""
    expected, expected_lse = flashserve.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert np.array_equal(out, expected) and np.array_equal(lse, expected_lse)


def e4m3_table():
    """The value of each of the 256 float8_e4m3fn codes (NaN for 0x7f and 0xff; no infinities)."""
    codes = np.arange(256)
    e, m = (codes >> 3) & 0xF, codes & 7
    mag = np.where(e == 0, m / 8.0 * 2.0**-6, (1 + m / 8.0) * 2.0**(e - 7.0))
    val = np.where(codes & 0x80, -mag, mag)
    val[[0x7F, 0xFF]] = np.nan
    return val


def to_e4m3(x):
    """The codes nearest to x (uint8), and their values."""
    table = e4m3_table()
    finite = np.flatnonzero(~np.isnan(table))
    idx = finite[np.argmin(np.abs(x[..., None] - table[finite]), axis=-1)]
    return idx.astype(np.uint8), table[idx]


def raw_tensor(a, code):
    """An fs_tensor over a NumPy array whose element type NumPy has no name for (e4m3 codes in
    uint8, bfloat16 bits in uint16)."""
    t = _capi.Tensor()
    t.data, t.dtype, t.device_type, t.device_index, t.rank = a.ctypes.data, code, _capi.CPU, 0, a.ndim
    for i in range(a.ndim):
        t.shape[i], t.strides[i] = a.shape[i], a.strides[i] // a.itemsize
    return t


@pytest.mark.parametrize("all_e4m3", [False, True])
def test_e4m3_through_the_v4_struct_matches_float64(seed, all_e4m3):
    """ABI 4: k and v as e4m3 codes with per-(batch, KV head) descales beside a float32 q (an fp8
    KV cache), or q, k and v all e4m3 with a bfloat16 out (FlashAttention-3's FP8 call), on the
    CPU path, against float64 attention of the dequantised values."""
    rng = np.random.default_rng(seed)
    b, sq, sk, hq, hk, d = 2, 9, 13, 4, 2, 16
    scale = 1.0 / np.sqrt(d)
    kc, kval = to_e4m3(rng.standard_normal((b, sk, hk, d)) * 4)
    vc, vval = to_e4m3(rng.standard_normal((b, sk, hk, d)) * 4)
    k_ds, v_ds, q_ds = (rng.uniform(0.05, 0.5, (b, hk)).astype(np.float32) for _ in range(3))
    group = np.repeat(np.arange(hk), hq // hk)  # the KV head of each query head
    p = _capi.AttentionParamsV4()
    _capi.lib().fs_attention_params_v4_init(ctypes.byref(p))
    if all_e4m3:
        qc, qval = to_e4m3(rng.standard_normal((b, sq, hq, d)) * 4)
        q_deq = qval * q_ds[:, None, group, None]
        out = np.full((b, sq, hq, d), 0x7FC0, dtype=np.uint16)  # bfloat16 NaN
        p.q, p.out = raw_tensor(qc, _capi.FLOAT8_E4M3), raw_tensor(out, _capi.BFLOAT16)
        p.q_descale = raw_tensor(q_ds, _capi.FLOAT32)
    else:
        q = rng.standard_normal((b, sq, hq, d)).astype(np.float32)
        q_deq = q.astype(np.float64)
        out = np.full((b, sq, hq, d), np.nan, dtype=np.float32)
        p.q, p.out = raw_tensor(q, _capi.FLOAT32), raw_tensor(out, _capi.FLOAT32)
    p.k, p.v = raw_tensor(kc, _capi.FLOAT8_E4M3), raw_tensor(vc, _capi.FLOAT8_E4M3)
    p.k_descale, p.v_descale = raw_tensor(k_ds, _capi.FLOAT32), raw_tensor(v_ds, _capi.FLOAT32)
    p.causal = 1
    lib = _capi.lib()
    assert call(lib.fs_attention_validate_v4, p) == 0, lib.fs_last_error()
    assert call(lib.fs_attention_forward_v4, p) == 0, lib.fs_last_error()
    v_deq = vval * v_ds[:, None, :, None]
    k_deq = kval * k_ds[:, None, :, None]
    expected = np.stack([attention_reference.attention(q_deq[i], k_deq[i], v_deq[i], scale,
                                                       causal=True)[0] for i in range(b)])
    got = ((out.astype(np.uint32) << 16).view(np.float32) if all_e4m3 else out).astype(np.float64)
    # float32 arithmetic on the dequantised values; a bfloat16 out adds half an ulp (2^-9).
    tol = (2.0**-8 if all_e4m3 else 1e-5) * np.abs(v_deq).max()
    assert np.abs(got - expected).max() <= tol


def test_kvcache_append_copies_e4m3_codes_through_the_c_struct(seed):
    """FS_FLOAT8_E4M3 caches in the unchanged fs_kvcache_append_params: the new codes (every
    byte value, NaN codes of both signs included) land at cache_seqlens[b] + i of a paged cache,
    byte for byte; every other byte stays; rotary and new tokens of another dtype are refused by
    name (the struct is ABI 2's: its tensors carry their dtype codes)."""
    rng = np.random.default_rng(seed)
    pages, page, hk, d, b, s_new = 6, 4, 2, 16, 2, 3
    kc = rng.integers(0, 256, (pages, page, hk, d), dtype=np.uint8)
    vc = rng.integers(0, 256, (pages, page, hk, d), dtype=np.uint8)
    kn = rng.integers(0, 256, (b, s_new, hk, d), dtype=np.uint8)
    vn = rng.integers(0, 256, (b, s_new, hk, d), dtype=np.uint8)
    table = rng.permutation(pages)[:4].astype(np.int32).reshape(b, 2)
    lens = np.array([int(rng.integers(0, 6)), 5], np.int32)
    out = np.full(b, -1, np.int32)
    before_k, before_v = kc.copy(), vc.copy()
    p = _capi.default_append_params()
    e4m3 = _capi.FLOAT8_E4M3
    p.k_cache, p.v_cache = raw_tensor(kc, e4m3), raw_tensor(vc, e4m3)
    p.k_new, p.v_new = raw_tensor(kn, e4m3), raw_tensor(vn, e4m3)
    p.cache_seqlens = raw_tensor(lens, _capi.INT32)
    p.block_table = raw_tensor(table, _capi.INT32)
    p.seqlens_out = raw_tensor(out, _capi.INT32)
    lib = _capi.lib()
    assert call(lib.fs_kvcache_append_validate, p) == 0, lib.fs_last_error()
    assert call(lib.fs_kvcache_append, p) == 0, lib.fs_last_error()
    want_k, want_v = before_k.copy(), before_v.copy()
    for i in range(b):
        pos = lens[i] + np.arange(s_new)
        slot = table[i, pos // page], pos % page
        want_k[slot], want_v[slot] = kn[i], vn[i]
    assert np.array_equal(kc, want_k) and np.array_equal(vc, want_v)
    assert np.array_equal(out, lens + s_new)
    cos = np.ones((16, d // 2), np.float32)
    p.rotary_cos, p.rotary_sin = raw_tensor(cos, _capi.FLOAT32), raw_tensor(cos, _capi.FLOAT32)
    assert call(lib.fs_kvcache_append, p) == _capi.UNSUPPORTED
    assert lib.fs_last_error().startswith(b"rotary_cos: rotary embedding into a float8_e4m3fn")
    p.rotary_cos, p.rotary_sin = _capi.Tensor(), _capi.Tensor()
    wide = kn.astype(np.uint16)
    p.k_new = raw_tensor(wide, _capi.BFLOAT16)
    assert call(lib.fs_kvcache_append, p) == _capi.INVALID_ARGUMENT
    assert lib.fs_last_error().startswith(b"k: dtype bfloat16 differs from k_cache's "
                                          b"float8_e4m3fn")
    assert np.array_equal(kc, want_k) and np.array_equal(vc, want_v), "a refused call wrote"


def test_descale_beside_a_tensor_that_is_not_e4m3_is_refused_by_name(seed):
    q, k, v, out = dense(seed)
    p = _capi.AttentionParamsV4()
    _capi.lib().fs_attention_params_v4_init(ctypes.byref(p))
    keep = []
    for name, x in (("q", q), ("k", k), ("v", v), ("out", out)):
        keep.append(_tensor.describe(x, name))
        setattr(p, name, keep[-1].struct)
    ds = np.ones((2, 2), dtype=np.float32)
    p.k_descale = raw_tensor(ds, _capi.FLOAT32)
    lib = _capi.lib()
    assert call(lib.fs_attention_forward_v4, p) == _capi.INVALID_ARGUMENT
    assert b"k_descale" in lib.fs_last_error()
    assert np.isnan(out).all()


def test_null_and_malformed_structs_return_codes(seed):
    lib = _capi.lib()
    assert lib.fs_attention_forward(None) == _capi.INVALID_ARGUMENT
    assert lib.fs_last_error() == b"params: null pointer"
    assert lib.fs_attention_workspace_size(None) == SIZE_MAX
    q, k, v, out = dense(seed)
    cases = [
        ("q", "dtype", 9, b"q: unknown dtype code 9"),
        ("k", "rank", 5, b"k: rank 5 is not supported (0..4)"),
        ("v", "rank", -1, b"v: rank -1 is not supported (0..4)"),
        ("out", "device_type", 7, b"out: unknown device type code 7"),
    ]
    for name, field, value, message in cases:
        p, keep = params_for(q, k, v, out)
        setattr(getattr(p, name), field, value)
        assert call(lib.fs_attention_forward_v3, p) == _capi.INVALID_ARGUMENT
        assert lib.fs_last_error() == message
        assert call(lib.fs_attention_validate_v3, p) == _capi.INVALID_ARGUMENT
        assert call(lib.fs_attention_workspace_size_v3, p) == SIZE_MAX
        assert lib.fs_last_error() == message
    # A last dimension that is not contiguous is named, not read wrongly.
    p, keep = params_for(q, k, v, out)
    p.q.shape[3], p.q.strides[3] = 8, 2
    assert call(lib.fs_attention_forward_v3, p) == _capi.INVALID_ARGUMENT
    assert lib.fs_last_error() == \
        b"q: the last dimension must be contiguous (stride 1), got stride 2"
    # A missing required tensor.
    p, keep = params_for(q, k, v, None)
    assert call(lib.fs_attention_forward_v3, p) == _capi.INVALID_ARGUMENT
    assert lib.fs_last_error().startswith(b"out: expected rank 4")
    assert np.isnan(out).all()


def test_errors_map_to_python_exceptions(seed):
    q, k, v, out = dense(seed)
    p, keep = params_for(q, k, v, out)
    p.q.dtype = _capi.INT32
    with pytest.raises(ValueError, match=r"^q: dtype int32 is not supported"):
        _capi.raise_for(call(_capi.lib().fs_attention_forward_v3, p))
    assert _capi.lib().fs_attention_forward(None) == _capi.INVALID_ARGUMENT
    for code, exception in ((_capi.INVALID_ARGUMENT, ValueError),
                            (_capi.UNSUPPORTED, NotImplementedError),
                            (_capi.CUDA_ERROR, RuntimeError), (_capi.INTERNAL, RuntimeError)):
        with pytest.raises(exception, match="params: null pointer"):
            _capi.raise_for(code)
    _capi.raise_for(_capi.OK)


@pytest.mark.parametrize("status,exception", [(_capi.INVALID_ARGUMENT, ValueError),
                                               (_capi.UNSUPPORTED, NotImplementedError),
                                               (_capi.CUDA_ERROR, RuntimeError)])
def test_failed_workspace_query_raises_what_it_failed_with(seed, monkeypatch, status, exception):
    """For CUDA tensors the package first asks for the split-KV workspace size, a query without a
    status code (SIZE_MAX on failure): fs_last_status says what it failed with (a head dim the CUDA
    kernels lack is kUnsupported there, not a runtime error). Simulated on the host: the tensors
    are reported as CUDA ones and the size query fails after leaving a message and a status."""
    real = _capi.lib()

    class FailingSizeQuery:
        def __getattr__(self, name):
            return getattr(real, name)

        def fs_attention_workspace_size_v3(self, params):
            assert real.fs_attention_forward(None) == _capi.INVALID_ARGUMENT  # sets a message
            return SIZE_MAX

        def fs_last_status(self):
            assert real.fs_last_status() == _capi.INVALID_ARGUMENT
            return status

    monkeypatch.setattr(_capi, "lib", lambda: FailingSizeQuery())
    monkeypatch.setattr(_tensor, "device_of", lambda obj: ("cuda", 0))
    monkeypatch.setattr(_tensor, "empty", lambda like, framework, device, shape, dtype=None:
                        np.full(shape, np.nan, dtype=dtype or like.dtype))
    q, k, v, _ = dense(seed)
    with pytest.raises(exception, match=r"params: null pointer$") as raised:
        flashserve.flash_attn_func(q, k, v)
    if exception is RuntimeError:
        assert not isinstance(raised.value, NotImplementedError)  # a subclass of RuntimeError


def test_last_status_follows_the_last_call(seed):
    lib = _capi.lib()
    assert lib.fs_attention_forward(None) == _capi.INVALID_ARGUMENT
    assert lib.fs_last_status() == _capi.INVALID_ARGUMENT
    q, k, v, out = dense(seed)
    p, keep = params_for(q, k, v, out)
    assert call(lib.fs_attention_forward_v3, p) == _capi.OK and lib.fs_last_status() == _capi.OK


@pytest.mark.skipif(flashserve.built_with_cuda(), reason="the library was built with CUDA")
def test_cuda_tensor_without_cuda_is_unsupported(seed):
    q, k, v, out = dense(seed)
    p, keep = params_for(q, k, v, out)
    for name in ("q", "k", "v", "out"):
        getattr(p, name).device_type = _capi.CUDA
    assert call(_capi.lib().fs_attention_forward_v3, p) == _capi.UNSUPPORTED
    assert b"built without CUDA" in _capi.lib().fs_last_error()
    assert _capi.lib().fs_cuda_stream_synchronize(None) == _capi.UNSUPPORTED
    assert not flashserve.cuda_available()
    assert np.isnan(out).all()


def test_last_error_is_per_thread_and_cleared_by_success(seed):
    lib = _capi.lib()
    assert lib.fs_attention_forward(None) == _capi.INVALID_ARGUMENT
    seen = {}

    def other():
        seen["before"] = lib.fs_last_error()
        q, k, v, out = dense(seed)
        p, keep = params_for(q, k, v, out)
        p.q.dtype = 42
        lib.fs_attention_forward_v3(ctypes.byref(p))
        seen["after"] = lib.fs_last_error()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == {"before": b"", "after": b"q: unknown dtype code 42"}
    assert lib.fs_last_error() == b"params: null pointer"
    q, k, v, out = dense(seed)
    p, keep = params_for(q, k, v, out)
    assert call(lib.fs_attention_forward_v3, p) == 0 and lib.fs_last_error() == b""


C_PROGRAM = r"""
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "flashserve/c_api.h"

static fs_tensor view(void* data, int32_t dtype, int rank, const int64_t* shape) {
  fs_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.device_type = FS_CPU;
  t.rank = rank;
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i];
  }
  return t;
}

int main(void) {
  /* One query, two keys, one head of dim 2: out = softmax(q.k / sqrt 2) @ v. */
  float q[2] = {1.0f, 0.5f}, k[4] = {1.0f, 0.0f, 0.0f, 1.0f}, v[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  float out[2] = {NAN, NAN}, lse[1] = {NAN};
  const int64_t qs[4] = {1, 1, 1, 2}, ks[4] = {1, 2, 1, 2}, ls[3] = {1, 1, 1};
  fs_attention_params p;
  fs_attention_params_init(&p);
  if (p.window_left != -1 || p.window_right != -1 || p.num_splits != 1 || p.q.rank != 0) return 1;
  p.q = view(q, FS_FLOAT32, 4, qs);
  p.k = view(k, FS_FLOAT32, 4, ks);
  p.v = view(v, FS_FLOAT32, 4, ks);
  p.out = view(out, FS_FLOAT32, 4, qs);
  p.lse = view(lse, FS_FLOAT32, 3, ls);
  if (fs_attention_forward(&p) != FS_OK) { printf("error %s\n", fs_last_error()); return 1; }
  const double s0 = 1.0 / sqrt(2.0), s1 = 0.5 / sqrt(2.0);
  const double w0 = exp(s0) / (exp(s0) + exp(s1)), w1 = 1.0 - w0;
  const double e0 = w0 * 1.0 + w1 * 3.0, e1 = w0 * 2.0 + w1 * 4.0;
  const double el = log(exp(s0) + exp(s1));
  if (fabs(out[0] - e0) > 1e-5 || fabs(out[1] - e1) > 1e-5 || fabs(lse[0] - el) > 1e-5) {
    printf("wrong %f %f %f\n", out[0], out[1], lse[0]);
    return 1;
  }
  /* ABI 3: the same call with softcap 0.25 (s = 0.25 tanh(s / 0.25)) and one ALiBi slope of
   * 0.5 (the query sits at position 1: key 0 is 1 away). */
  fs_attention_params_v3 p3;
  fs_attention_params_v3_init(&p3);
  if (p3.softcap != 0.0f || p3.alibi_slopes.rank != 0 || p3.base.window_left != -1) return 1;
  float slope[1] = {0.5f};
  const int64_t ss[1] = {1};
  p3.base = p;
  p3.softcap = 0.25f;
  p3.alibi_slopes = view(slope, FS_FLOAT32, 1, ss);
  if (fs_attention_forward_v3(&p3) != FS_OK) { printf("error %s\n", fs_last_error()); return 1; }
  const double c0 = 0.25 * tanh(s0 / 0.25) - 0.5, c1 = 0.25 * tanh(s1 / 0.25);
  const double u0 = exp(c0) / (exp(c0) + exp(c1)), u1 = 1.0 - u0;
  if (fabs(out[0] - (u0 * 1.0 + u1 * 3.0)) > 1e-5 || fabs(out[1] - (u0 * 2.0 + u1 * 4.0)) > 1e-5 ||
      fabs(lse[0] - log(exp(c0) + exp(c1))) > 1e-5) {
    printf("wrong v3 %f %f %f\n", out[0], out[1], lse[0]);
    return 1;
  }
  p.v.dtype = FS_INT32;
  if (fs_attention_forward(&p) != FS_ERROR_INVALID_ARGUMENT) return 1;
  printf("%s|%s|%d\n", fs_version(), fs_last_error(), fs_cuda_available());
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_c_program(tmp_path):
    """The header is C99 (pedantic, warnings as errors) and a C program links and runs."""
    source = tmp_path / "main.c"
    source.write_text(textwrap.dedent(C_PROGRAM))
    library = _capi.library_path()
    exe = tmp_path / "main"
    subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror",
                    "-I", os.path.join(REPO, "include"), str(source), library,
                    f"-Wl,-rpath,{os.path.dirname(library)}", "-lm", "-o", str(exe)], check=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = (f"{flashserve.version()}|v: dtype int32 differs from q's float32|"
                f"{int(flashserve.cuda_available())}")
    assert result.stdout.strip() == expected


def run_python(code, env_update, cwd=None):
    env = dict(os.environ)
    env.update(env_update)
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=cwd)


def test_import_pulls_in_no_framework():
    code = ("import sys, flashserve; flashserve.version(); "
            "print(sorted(m for m in ('numpy', 'torch', 'cupy', 'jax') if m in sys.modules))")
    result = run_python(code, {})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_library_lookup(tmp_path):
    result = run_python("import flashserve; flashserve.version()",
                        {"FLASHSERVE_LIBRARY": "/nonexistent/libflashserve_c.so"})
    assert result.returncode != 0
    assert "FLASHSERVE_LIBRARY='/nonexistent/libflashserve_c.so' does not name an existing file" \
        in result.stderr
    # Without the variable, in a copy of the checkout: build/*/src (newest first, sanitizer builds
    # skipped), and next to the package before that.
    library = _capi.library_path()
    repo = tmp_path / "repo"
    package = repo / "python" / "flashserve"
    shutil.copytree(os.path.dirname(flashserve.__file__), package,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name, sanitize in (("release", "OFF"), ("asan", "ON")):
        (repo / "build" / name / "src").mkdir(parents=True)
        shutil.copy(library, repo / "build" / name / "src" / _capi.LIBRARY_NAME)
        (repo / "build" / name / "CMakeCache.txt").write_text(
            f"FLASHSERVE_SANITIZE:BOOL={sanitize}\n")
    env = {"FLASHSERVE_LIBRARY": None, "PYTHONPATH": str(repo / "python")}
    code = "import flashserve; print(flashserve.library_path())"
    result = run_python(code, env, cwd=tmp_path)  # not where flashserve/ is
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(repo / "build" / "release" / "src" / _capi.LIBRARY_NAME)
    shutil.copy(library, package / _capi.LIBRARY_NAME)
    result = run_python(code, env, cwd=tmp_path)  # not where flashserve/ is
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(package / _capi.LIBRARY_NAME)
    for name in ("release", "asan"):
        shutil.rmtree(repo / "build" / name)
    os.remove(package / _capi.LIBRARY_NAME)
    result = run_python(code, env, cwd=tmp_path)  # not where flashserve/ is
    assert result.returncode != 0 and "set FLASHSERVE_LIBRARY" in result.stderr
