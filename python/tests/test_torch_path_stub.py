"""The PyTorch path's host code (flashserve/_torch.py) on a machine without PyTorch: a stand-in
`torch` module whose CUDA tensors are NumPy buffers. The library (built with or without CUDA) then
validates the fs_attention_params the fast path packed with struct.pack_into: a call that passes
validation stops at "built without CUDA" (or at the CUDA runtime), and a malformed one must be
refused with the message the generic path gives, which shows that shapes, strides, dtypes, devices,
the lse and the scalars land in the right fields. Skipped where the real PyTorch is installed (the
GPU tests run the real thing there)."""

import importlib.util
import sys
import types

import numpy as np
import pytest

if importlib.util.find_spec("torch") is not None:
    pytest.skip("the real PyTorch is installed: test_gpu_torch*.py cover this path",
                allow_module_level=True)

import flashserve  # noqa: E402
from flashserve import attention as fs_attention  # noqa: E402


class DType:
    def __init__(self, name, np_dtype, floating):
        self.name, self.np, self.is_floating_point = name, np.dtype(np_dtype), floating

    def __repr__(self):
        return f"torch.{self.name}"


class Device:
    def __init__(self, kind, index):
        self.type, self.index = kind, index


def make_fake_torch():
    torch = types.ModuleType("torch")
    torch.float32 = DType("float32", np.float32, True)
    torch.float16 = DType("float16", np.float16, True)
    torch.bfloat16 = DType("bfloat16", np.uint16, True)
    torch.float64 = DType("float64", np.float64, True)
    torch.uint8 = DType("uint8", np.uint8, False)
    torch.int32 = DType("int32", np.int32, False)

    class Tensor:
        """A 'CUDA' tensor over a NumPy array (the library never touches its data here)."""

        def __init__(self, array, dtype, device=None):
            self.array, self.dtype = array, dtype
            self.device = device or Device("cuda", 0)
            self.requires_grad = False

        @property
        def shape(self):
            return self.array.shape

        @property
        def is_cuda(self):
            return self.device.type == "cuda"

        def dim(self):
            return self.array.ndim

        def stride(self, i=None):
            s = tuple(b // self.array.itemsize for b in self.array.strides)
            return s if i is None else s[i]

        def data_ptr(self):
            return self.array.__array_interface__["data"][0]

        def new_empty(self, shape, dtype=None):
            dtype = dtype or self.dtype
            return Tensor(np.empty(shape, dtype=dtype.np), dtype, self.device)

        def __getitem__(self, index):
            return Tensor(self.array[index], self.dtype, self.device)

        def transpose(self, a, b):
            return Tensor(self.array.swapaxes(a, b), self.dtype, self.device)

    def empty(shape, dtype=None, device=None):
        return Tensor(np.full(shape, 0x55, dtype=dtype.np), dtype, device)

    def empty_like(t):
        return Tensor(np.full_like(t.array, 0x55), t.dtype, t.device)

    torch.Tensor = Tensor
    torch.empty = empty
    torch.empty_like = empty_like
    torch.is_grad_enabled = lambda: True
    torch.library = types.SimpleNamespace()  # no custom_op: the operators are not defined
    torch.compiler = types.SimpleNamespace(is_compiling=lambda: False)
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda index: 0)
    return torch


@pytest.fixture
def fake(monkeypatch):
    torch = make_fake_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    # A fresh flashserve._torch bound to this stand-in (`from . import _torch` would reuse the
    # package attribute of an earlier import).
    monkeypatch.delitem(sys.modules, "flashserve._torch", raising=False)
    monkeypatch.delattr(flashserve, "_torch", raising=False)
    monkeypatch.setattr(fs_attention, "_torch_path", None)
    monkeypatch.setattr(fs_attention, "_torch_failed", False)
    yield torch
    sys.modules.pop("flashserve._torch", None)
    if hasattr(flashserve, "_torch"):
        delattr(flashserve, "_torch")


def tensor(torch, rng, shape, dtype):
    if dtype is torch.bfloat16:
        array = rng.integers(0, 2**16, shape).astype(np.uint16)
    else:
        array = rng.standard_normal(shape).astype(dtype.np)
    return torch.Tensor(array, dtype)


UNREACHABLE_DEVICE = r"(built without CUDA|CUDA error|CUDA device|is not one of the)"


def test_a_valid_call_passes_validation(fake, seed):
    rng = np.random.default_rng(seed)
    q = tensor(fake, rng, (2, 5, 8, 64), fake.bfloat16)
    k = tensor(fake, rng, (2, 7, 2, 64), fake.bfloat16)
    v = tensor(fake, rng, (2, 7, 2, 64), fake.bfloat16)
    for kwargs in (dict(), dict(causal=True, return_lse=True), dict(window_size=(3, 1)),
                   dict(softmax_scale=0.5, num_splits=3), dict(return_attn_probs=True)):
        with pytest.raises((NotImplementedError, RuntimeError, ValueError),
                           match=UNREACHABLE_DEVICE):
            flashserve.flash_attn_func(q, k, v, **kwargs)
    import flashserve._torch as fs_torch
    assert fs_attention._torch_path is fs_torch and fs_torch._ops is None
    assert fs_torch._get_calls().ok, "the packed layout does not match the library's structs"


@pytest.mark.parametrize("kwargs", [dict(softcap=30.0), dict(alibi_slopes="slopes")])
def test_score_modifiers_take_the_generic_path(fake, seed, monkeypatch, kwargs):
    """The fast path packs no softcap and no slopes: a call with either must reach the generic
    path (whose library call applies them, or refuses them by name on CUDA), never the fast one."""
    rng = np.random.default_rng(seed)
    q, k, v = (tensor(fake, rng, (1, 4, 2, 64), fake.bfloat16) for _ in range(3))
    if "alibi_slopes" in kwargs:
        kwargs = dict(alibi_slopes=tensor(fake, rng, (2,), fake.float32))
    seen = {}

    def generic(*args, **given):
        seen.update(given)
        return "out", None

    monkeypatch.setattr(fs_attention, "_forward", generic)
    assert flashserve.flash_attn_func(q, k, v, **kwargs) == "out"
    for name, value in kwargs.items():
        assert seen[name] is value or seen[name] == value


@pytest.mark.parametrize("bad,match", [
    ("heads", r"^k: h_q \(8\) must be a multiple of h_kv \(3\)"),
    ("dtype", r"^k: dtype float16 differs from q's bfloat16"),
    ("batch", r"^k: batch 3 differs from q's 2"),
    ("head_dim", r"^k: head_dim 32 differs from q's 64"),
    ("v_shape", r"^v: shape \[2, 6, 2, 64\] does not match k's \[2, 7, 2, 64\]"),
    ("window", r"^window_right: must be 0 or -1 with causal"),
    ("device", r"^k: must be on the same device as q"),
    ("splits", r"^num_splits: must be in \[0, 256\], got 300"),
])
def test_malformed_calls_are_refused_by_field(fake, seed, bad, match):
    rng = np.random.default_rng(seed)
    q = tensor(fake, rng, (2, 5, 8, 64), fake.bfloat16)
    k_shape, v_shape = [2, 7, 2, 64], [2, 7, 2, 64]
    k_dtype = fake.bfloat16
    kwargs = {}
    if bad == "heads":
        k_shape[2] = v_shape[2] = 3
    elif bad == "dtype":
        k_dtype = fake.float16
    elif bad == "batch":
        k_shape[0] = v_shape[0] = 3
    elif bad == "head_dim":
        k_shape[3] = 32
    elif bad == "v_shape":
        v_shape[1] = 6
    elif bad == "splits":
        kwargs["num_splits"] = 300
    k = tensor(fake, rng, tuple(k_shape), k_dtype)
    v = tensor(fake, rng, tuple(v_shape), fake.bfloat16)
    if bad == "device":
        k.device = Device("cuda", 1)
    if bad == "window":
        # causal with window_right > 0 cannot come from the public API (causal sets it to 0):
        # write the packed struct directly through the fast path's own packing.
        import flashserve._torch as fs_torch
        fs_torch.register()
        state = fs_torch._State()
        off = fs_torch._get_calls().offsets
        out = q.new_empty((2, 5, 8, 64))
        fs_torch._pack(state.buffer, off["q"], q, 2)
        fs_torch._pack(state.buffer, off["k"], k, 2)
        fs_torch._pack(state.buffer, off["v"], v, 2)
        fs_torch._pack(state.buffer, off["out"], out, 2)
        fs_torch._SCALARS.pack_into(state.buffer, off["max_seqlen_q"], 0, 0, 0.0, 1, -1, 4, 1,
                                    0, 0, 0)
        from flashserve import _capi
        with pytest.raises(ValueError, match=match):
            _capi.raise_for(_capi.lib().fs_attention_validate_v3(state.ref))
        return
    with pytest.raises(ValueError, match=match):
        flashserve.flash_attn_func(q, k, v, **kwargs)


def test_lse_and_strided_views_are_packed(fake, seed):
    """A transposed q (non-default strides, last one 1) and the lse output pass validation; an
    lse of the wrong shape (packed by hand) is refused by name."""
    rng = np.random.default_rng(seed)
    q = tensor(fake, rng, (2, 8, 5, 64), fake.float16).transpose(1, 2)
    assert q.stride() == (2560, 64, 320, 1)
    k = tensor(fake, rng, (2, 7, 4, 64), fake.float16)
    v = tensor(fake, rng, (2, 7, 4, 64), fake.float16)
    with pytest.raises((NotImplementedError, RuntimeError, ValueError), match=UNREACHABLE_DEVICE):
        flashserve.flash_attn_func(q, k, v, return_lse=True)
    import flashserve._torch as fs_torch
    from flashserve import _capi
    state = fs_torch._State()
    off = fs_torch._get_calls().offsets
    for name, t in (("q", q), ("k", k), ("v", v), ("out", q.new_empty((2, 5, 8, 64)))):
        fs_torch._pack(state.buffer, off[name], t, _capi.FLOAT16)
    fs_torch._pack(state.buffer, off["lse"], q.new_empty((2, 5, 8), fake.float32), _capi.FLOAT32)
    with pytest.raises(ValueError, match=r"^lse: shape \[2, 5, 8\] does not match"):
        _capi.raise_for(_capi.lib().fs_attention_validate_v3(state.ref))


def test_requires_grad_is_refused(fake, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (tensor(fake, rng, (1, 4, 2, 64), fake.float16) for _ in range(3))
    q.requires_grad = True
    with pytest.raises(NotImplementedError, match=r"^q: requires grad"):
        flashserve.flash_attn_func(q, k, v)


# ---------------------------------------------------------------- flash_attn_with_kvcache

def kv_inputs(fake, rng, paged=False):
    q = tensor(fake, rng, (2, 1, 8, 64), fake.bfloat16)
    shape = (5, 16, 2, 64) if paged else (2, 16, 2, 64)
    kc, vc = tensor(fake, rng, shape, fake.bfloat16), tensor(fake, rng, shape, fake.bfloat16)
    kn, vn = (tensor(fake, rng, (2, 1, 2, 64), fake.bfloat16) for _ in range(2))
    return q, kc, vc, kn, vn


def ints(fake, values):
    return fake.Tensor(np.array(values, dtype=np.int32), fake.int32)


def test_kvcache_valid_calls_pass_the_append_validation(fake, seed):
    rng = np.random.default_rng(seed)
    q, kc, vc, kn, vn = kv_inputs(fake, rng)
    cos, sin = (tensor(fake, rng, (20, 32), fake.float32) for _ in range(2))
    for kwargs in (dict(cache_seqlens=ints(fake, [3, 15])), dict(cache_seqlens=7, causal=True),
                   dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=ints(fake, [0, 1])),
                   dict(cache_batch_idx=ints(fake, [1, 0]), cache_seqlens=2)):
        with pytest.raises((NotImplementedError, RuntimeError, ValueError),
                           match=r"^k_cache: is a CUDA tensor, but this flashserve was built "
                                 r"without CUDA|CUDA"):
            flashserve.flash_attn_with_kvcache(q, kc, vc, kn, vn, **kwargs)


@pytest.mark.parametrize("bad,match", [
    ("overflow", r"^cache_seqlens: sequence 0 holds 16 keys; appending 1 new ones needs 17"),
    ("heads", r"^k: shape \[2, 1, 3, 64\] does not match"),
    ("rotary_dim", r"^rotary_cos: rotary_dim \(2 x 40 columns\) must be in \[2, head_dim 64\]"),
    ("q_positions", r"^rotary_cos: has 12 positions, but sequence 0 rotates position 12"),
    ("both_maps", r"^cache_batch_idx: cannot be combined with block_table"),
    ("seqlens_batch", r"^cache_seqlens: has 3 entries in dimension 0 for a batch of 2"),
])
def test_kvcache_malformed_calls_are_refused_by_field(fake, seed, bad, match):
    rng = np.random.default_rng(seed)
    q, kc, vc, kn, vn = kv_inputs(fake, rng)
    kwargs = dict(cache_seqlens=ints(fake, [3, 4]))
    if bad == "overflow":
        kwargs["cache_seqlens"] = 16
    elif bad == "heads":
        kn, vn = (tensor(fake, rng, (2, 1, 3, 64), fake.bfloat16) for _ in range(2))
    elif bad == "rotary_dim":
        kwargs["rotary_cos"], kwargs["rotary_sin"] = (tensor(fake, rng, (20, 40), fake.float32)
                                                      for _ in range(2))
    elif bad == "q_positions":  # causal: the new key sits at 9, q's 4 tokens at 9..12
        q = tensor(fake, rng, (2, 4, 8, 64), fake.bfloat16)
        kwargs = dict(cache_seqlens=9, causal=True)
        kwargs["rotary_cos"], kwargs["rotary_sin"] = (tensor(fake, rng, (12, 32), fake.float32)
                                                      for _ in range(2))
        kn, vn = (tensor(fake, rng, (2, 1, 2, 64), fake.bfloat16) for _ in range(2))
    elif bad == "both_maps":
        kwargs["cache_batch_idx"] = ints(fake, [0, 1])
        kwargs["block_table"] = fake.Tensor(np.zeros((2, 1), np.int32), fake.int32)
    elif bad == "seqlens_batch":
        kwargs["cache_seqlens"] = ints(fake, [1, 2, 3])
    with pytest.raises(ValueError, match=match):
        flashserve.flash_attn_with_kvcache(q, kc, vc, kn, vn, **kwargs)


def test_kvcache_q_positions_follow_the_mask(fake, seed):
    """The q_positions case above without causal: every query sits at cache_seqlens (9), the new
    key too, inside the 12-position table."""
    rng = np.random.default_rng(seed)
    q = tensor(fake, rng, (2, 4, 8, 64), fake.bfloat16)
    _, kc, vc, kn, vn = kv_inputs(fake, rng)
    cos, sin = (tensor(fake, rng, (12, 32), fake.float32) for _ in range(2))
    with pytest.raises((NotImplementedError, RuntimeError, ValueError), match=r"^((k_cache|q): is a |device: no CUDA device)"):
        # Built without CUDA: "q: is a CUDA tensor, but ..." (the attention's checks, which
        # come before the append); built with it on a machine without a GPU: "device: no CUDA
        # device". Either way the call got past the positions.
        flashserve.flash_attn_with_kvcache(q, kc, vc, kn, vn, rotary_cos=cos, rotary_sin=sin,
                                           cache_seqlens=9)


def test_kvcache_refused_by_the_kernels_writes_nothing(fake, seed, monkeypatch):
    """The workspace-size query runs the CUDA dispatch's own checks (on a GPU: dtype, head dim,
    alignment; here: no device, or no CUDA in the build), and it comes before the append: a call
    the kernels refuse leaves the cache as it was."""
    rng = np.random.default_rng(seed)
    q, kc, vc, kn, vn = kv_inputs(fake, rng)
    import flashserve._torch as fs_torch
    fs_torch.register()
    appended = []
    monkeypatch.setattr(fs_torch._get_kv_calls(), "append", lambda ref: appended.append(ref) or 0)
    with pytest.raises((NotImplementedError, RuntimeError, ValueError), match="CUDA"):
        flashserve.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=ints(fake, [3, 4]))
    assert appended == []


@pytest.mark.parametrize("layout", ["contiguous", "batch_idx", "paged"])
def test_kvcache_attention_params_are_packed(fake, seed, monkeypatch, layout):
    """With the append's validation and run made to succeed (the stand-in has no device), the
    attention call is validated: a valid one stops at "built without CUDA" for q, a block table of
    the wrong batch is refused by name (the cache_batch_idx view and the paged table are packed)."""
    rng = np.random.default_rng(seed)
    paged = layout == "paged"
    q, kc, vc, kn, vn = kv_inputs(fake, rng, paged)
    import flashserve._torch as fs_torch
    fs_torch.register()
    monkeypatch.setattr(fs_torch._get_kv_calls(), "append", lambda ref: 0)
    monkeypatch.setattr(fs_torch._get_kv_calls(), "validate", lambda ref: 0)
    kwargs = dict(cache_seqlens=ints(fake, [3, 4]), return_softmax_lse=True, causal=True)
    if layout == "batch_idx":
        kwargs["cache_batch_idx"] = ints(fake, [1, 0])
    if paged:
        kwargs["block_table"] = fake.Tensor(np.array([[0], [3]], np.int32), fake.int32)
    with pytest.raises((NotImplementedError, RuntimeError, ValueError),
                       match=r"^q: is a CUDA tensor|CUDA"):
        flashserve.flash_attn_with_kvcache(q, kc, vc, kn, vn, **kwargs)
    if layout == "contiguous":
        return
    if paged:
        kwargs["block_table"] = fake.Tensor(np.zeros((3, 1), np.int32), fake.int32)
        match = r"^block_table: has 3 rows for a batch of 2"
    else:  # the attention's block table is cache_batch_idx, and is named so
        kwargs["cache_batch_idx"] = ints(fake, [1, 0, 1])
        match = r"^cache_batch_idx: has 3 rows for a batch of 2"
    with pytest.raises(ValueError, match=match):
        flashserve.flash_attn_with_kvcache(q, kc, vc, kn, vn, **kwargs)


def test_kvcache_interleaved_cache_passes_and_aliasing_is_refused_on_the_fast_path(fake, seed):
    """K and V split from one tensor (kv[:, :, 0], kv[:, :, 1]) reach the device (FlashAttention
    accepts them); the same view twice, or views sharing a head, are refused by the append's
    validation, through the packed fast path."""
    rng = np.random.default_rng(seed)
    q, _, _, kn, vn = kv_inputs(fake, rng)
    kv = tensor(fake, rng, (2, 16, 2, 2, 64), fake.bfloat16)
    with pytest.raises((NotImplementedError, RuntimeError, ValueError), match=UNREACHABLE_DEVICE):
        flashserve.flash_attn_with_kvcache(q, kv[:, :, 0], kv[:, :, 1], kn, vn, cache_seqlens=3)
    with pytest.raises(ValueError, match=r"^v_cache: overlaps k_cache in memory"):
        flashserve.flash_attn_with_kvcache(q, kv[:, :, 0], kv[:, :, 0], kn, vn, cache_seqlens=3)


@pytest.mark.parametrize("value,error,match", [
    (3.7, TypeError, r"^cache_seqlens: expected an integer, got float"),
    (True, TypeError, r"^cache_seqlens: expected an integer, got bool"),
    (2**70, ValueError, r"^cache_seqlens: 1180591620717411303424 is outside"),
])
def test_kvcache_scalar_length_is_checked_not_truncated(fake, seed, value, error, match):
    """The PyTorch path read an int length with int(): 3.7 ran as 3."""
    rng = np.random.default_rng(seed)
    q, kc, vc, kn, vn = kv_inputs(fake, rng)
    with pytest.raises(error, match=match):
        flashserve.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=value)


def test_kvcache_batch_mismatch_names_q_on_the_fast_path(fake, seed):
    rng = np.random.default_rng(seed)
    _, kc, vc, kn, vn = kv_inputs(fake, rng)
    q = tensor(fake, rng, (3, 1, 8, 64), fake.bfloat16)
    with pytest.raises(ValueError, match=r"^q: has 3 entries in dimension 0 for a batch of 2"):
        flashserve.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=3)


def test_ops_path_integers_are_checked_not_truncated(fake):
    """What the custom operators receive (window, num_splits, max_seqlen) goes through the
    generic path's checks: int() would truncate 1.5 to 1 and pass 2**70 to an int64 schema."""
    from flashserve import _torch
    assert _torch._window_pair((2**70, -5)) == (-1, -1)
    with pytest.raises(ValueError, match=r"^window_size: expected a pair of integers"):
        _torch._window_pair((1.5, 0))
    with pytest.raises(TypeError, match=r"^num_splits: expected an integer, got float"):
        _torch._int32(2.5, "num_splits")
    with pytest.raises(ValueError, match=r"^max_seqlen_q: .* is outside"):
        _torch._int64(2**63, "max_seqlen_q")


# ---------------------------------------------------------------- the backward's fast path

def backward_inputs(fake, rng):
    """dout, q, k, v, out, lse of a dense GQA call (q 8 heads, k/v 2)."""
    q, out, dout = (tensor(fake, rng, (2, 5, 8, 64), fake.bfloat16) for _ in range(3))
    k, v = (tensor(fake, rng, (2, 7, 2, 64), fake.bfloat16) for _ in range(2))
    return dout, q, k, v, out, tensor(fake, rng, (2, 8, 5), fake.float32)


@pytest.mark.parametrize("with_dlse", [False, True])
def test_backward_fast_path_packs_every_field(fake, seed, with_dlse):
    """fast_backward's packed fs_attention_backward_params_v3 passes the library's validation
    (the call then stops at the device), and each tensor and scalar sits in its own field."""
    import flashserve._torch as fs_torch
    rng = np.random.default_rng(seed)
    dout, q, k, v, out, lse = backward_inputs(fake, rng)
    dlse = tensor(fake, rng, (2, 8, 5), fake.float32) if with_dlse else None
    scale = float(rng.uniform(0.1, 1.0))
    with pytest.raises((NotImplementedError, RuntimeError, ValueError), match=UNREACHABLE_DEVICE):
        fs_torch.fast_backward(dout, q, k, v, out, lse, dlse, scale, False, 3, 2, True)
    p = fs_torch._backward_state.params
    for field, t in (("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)):
        packed = getattr(p.attn, field)
        assert packed.data == t.data_ptr() and tuple(packed.shape[:t.dim()]) == t.shape, field
        assert tuple(packed.strides[:t.dim()]) == t.stride(), field
    assert p.dout.data == dout.data_ptr() and tuple(p.dout.shape) == dout.shape
    assert (p.dlse.data or 0) == (dlse.data_ptr() if with_dlse else 0)  # c_void_p: None is 0
    assert tuple(p.dq.shape) == q.shape and tuple(p.dk.shape) == k.shape
    assert tuple(p.dv.shape) == v.shape and p.dq.data not in (None, q.data_ptr())
    assert p.attn.softmax_scale == pytest.approx(scale, rel=1e-7)
    assert (p.attn.causal, p.attn.window_left, p.attn.window_right) == (0, 3, 2)
    assert p.deterministic == 1 and p.attn.max_seqlen_q == 0 and p.attn.softcap == 0.0


@pytest.mark.parametrize("bad,match", [
    ("lse", r"^lse: shape \[2, 5, 8\] does not match"),
    ("dout_shape", r"^dout: shape \[2, 5, 8, 32\] differs from out's \[2, 5, 8, 64\]"),
    ("dout_dtype", r"^dout: dtype float16 differs from out's bfloat16"),
    ("dlse", r"^dlse: shape \[2, 8, 4\] differs from lse's \[2, 8, 5\]"),
    ("window", r"^window_right: must be 0 or -1 with causal"),
])
def test_backward_fast_path_malformed_calls_are_refused_by_field(fake, seed, bad, match):
    import flashserve._torch as fs_torch
    rng = np.random.default_rng(seed)
    dout, q, k, v, out, lse = backward_inputs(fake, rng)
    dlse, causal = None, False
    if bad == "lse":
        lse = tensor(fake, rng, (2, 5, 8), fake.float32)
    elif bad == "dout_shape":
        dout = tensor(fake, rng, (2, 5, 8, 32), fake.bfloat16)
    elif bad == "dout_dtype":
        dout = tensor(fake, rng, (2, 5, 8, 64), fake.float16)
    elif bad == "dlse":
        dlse = tensor(fake, rng, (2, 8, 4), fake.float32)
    elif bad == "window":
        causal = True  # with window_right 2: not from the public API (causal sets it to 0)
    with pytest.raises(ValueError, match=match):
        fs_torch.fast_backward(dout, q, k, v, out, lse, dlse, 0.0, causal, -1, 2, False)


def test_backward_fast_path_leaves_other_tensors_to_the_generic_path(fake, seed):
    """A gradient the fast path does not pack as it is (a last stride other than 1, an lse
    gradient not float32) gives None: the caller takes the generic path."""
    import flashserve._torch as fs_torch
    rng = np.random.default_rng(seed)
    dout, q, k, v, out, lse = backward_inputs(fake, rng)
    strided = tensor(fake, rng, (2, 5, 8, 128), fake.bfloat16)[:, :, :, ::2]
    assert strided.stride(-1) == 2
    assert fs_torch.fast_backward(strided, q, k, v, out, lse, None, 0.0, False, -1, -1,
                                   False) is None
    half = tensor(fake, rng, (2, 8, 5), fake.float16)
    assert fs_torch.fast_backward(dout, q, k, v, out, lse, half, 0.0, False, -1, -1,
                                   False) is None


# ---------------------------------------------------------------- the varlen fast paths

def varlen_inputs(fake, rng):
    """q (9 rows: sequences of 4 and 5), k/v (11 rows: 6 and 5), GQA 8/2, d 64."""
    q = tensor(fake, rng, (9, 8, 64), fake.bfloat16)
    k, v = (tensor(fake, rng, (11, 2, 64), fake.bfloat16) for _ in range(2))
    return q, k, v, ints(fake, [0, 4, 9]), ints(fake, [0, 6, 11])


def test_varlen_fast_path_packs_the_lengths(fake, seed):
    """flash_attn_varlen_func's fast path: a valid call passes validation (it stops at the
    device), with cu_seqlens_q/k, seqused_k and the max lengths in their fields; a dense call
    after it packs none of them (each path has its own parameter block)."""
    import flashserve._torch as fs_torch
    rng = np.random.default_rng(seed)
    q, k, v, cu_q, cu_k = varlen_inputs(fake, rng)
    used = ints(fake, [5, 3])
    with pytest.raises((NotImplementedError, RuntimeError, ValueError), match=UNREACHABLE_DEVICE):
        flashserve.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6, causal=True,
                                          seqused_k=used, return_lse=True)
    p = fs_torch._varlen_state.params
    for packed, t in ((p.cu_seqlens_q, cu_q), (p.cu_seqlens_k, cu_k), (p.seqused_k, used)):
        assert packed.data == t.data_ptr() and packed.rank == 1 and packed.shape[0] == 3 - (
            t is used)
    assert (p.max_seqlen_q, p.max_seqlen_k, p.causal, p.window_right) == (5, 6, 1, 0)
    assert tuple(p.lse.shape[:2]) == (8, 9) and tuple(p.out.shape[:3]) == (9, 8, 64)
    dense = [tensor(fake, rng, (2, 5, 8, 64), fake.bfloat16) for _ in range(3)]
    with pytest.raises((NotImplementedError, RuntimeError, ValueError), match=UNREACHABLE_DEVICE):
        flashserve.flash_attn_func(*dense)
    d = fs_torch._state.params
    assert not (d.cu_seqlens_q.data or d.cu_seqlens_k.data or d.seqused_k.data)


@pytest.mark.parametrize("bad,match", [
    ("cu_len", r"^cu_seqlens_k: expected 3 entries, got 4"),
    ("rows", r"^k: h_q \(8\) must be a multiple of h_kv \(3\)"),
])
def test_varlen_fast_path_malformed_calls_are_refused_by_field(fake, seed, bad, match):
    rng = np.random.default_rng(seed)
    q, k, v, cu_q, cu_k = varlen_inputs(fake, rng)
    if bad == "cu_len":
        cu_k = ints(fake, [0, 6, 11, 11])  # 3 sequences against q's 2
    else:
        k = tensor(fake, rng, (11, 3, 64), fake.bfloat16)  # 8 heads not a multiple of 3
    with pytest.raises(ValueError, match=match):
        flashserve.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6)


def test_varlen_backward_fast_path_packs_the_lengths(fake, seed):
    """fast_backward with cu_seqlens: passes validation (stops at the device) with the lengths,
    the max lengths and the (heads, rows) lse in their fields; a dense backward after it leaves
    the length fields absent again (the two share one parameter block)."""
    import flashserve._torch as fs_torch
    rng = np.random.default_rng(seed)
    q, k, v, cu_q, cu_k = varlen_inputs(fake, rng)
    out, dout = (tensor(fake, rng, (9, 8, 64), fake.bfloat16) for _ in range(2))
    lse = tensor(fake, rng, (8, 9), fake.float32)
    with pytest.raises((NotImplementedError, RuntimeError, ValueError), match=UNREACHABLE_DEVICE):
        fs_torch.fast_backward(dout, q, k, v, out, lse, None, 0.0, True, -1, 0, False, cu_q,
                               cu_k, 5, 6, None)
    p = fs_torch._backward_state.params
    assert p.attn.cu_seqlens_q.data == cu_q.data_ptr()
    assert p.attn.cu_seqlens_k.data == cu_k.data_ptr() and not p.attn.seqused_k.data
    assert (p.attn.max_seqlen_q, p.attn.max_seqlen_k, p.attn.causal) == (5, 6, 1)
    assert tuple(p.dq.shape[:3]) == (9, 8, 64) and tuple(p.dk.shape[:3]) == (11, 2, 64)
    dout, q, k, v, out, lse = backward_inputs(fake, rng)
    with pytest.raises((NotImplementedError, RuntimeError, ValueError), match=UNREACHABLE_DEVICE):
        fs_torch.fast_backward(dout, q, k, v, out, lse, None, 0.0, False, -1, -1, False)
    assert not (p.attn.cu_seqlens_q.data or p.attn.cu_seqlens_k.data)
    assert (p.attn.max_seqlen_q, p.attn.max_seqlen_k) == (0, 0)
