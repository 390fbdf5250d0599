"""FP8 (float8_e4m3fn q, k, v with FlashAttention-3's descale factors) through the Python API on the
CPU path, with NumPy alone: the arrays are stand-ins for ml_dtypes' float8_e4m3fn and bfloat16
(what NumPy and JAX hold those types in), which the package recognises by their dtype's name, so
the whole path (dtype, descales, the v4 parameter block, the bfloat16 out) runs in CI without
PyTorch. The argument checks are here too; those that need PyTorch tensors (gradients, PyTorch's
other float8 formats) skip without it. The GPU kernel's tests: test_gpu_fp8.py; the KV-cache call
on e4m3 caches: test_kvcache_fp8_cpu.py (which reuses the helpers here)."""

import sys

import numpy as np
import pytest

import flashserve
import flashserve._tensor as fs_tensor
from flashserve import hopper
from attention_reference import attention, check_lse


def _e4m3_table():
    """float8_e4m3fn's 256 codes as float64 (S.EEEE.MMM, bias 7; NaN at S.1111.111)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e, m = (codes >> 3) & 15, codes & 7
    value = np.where(e == 0, m * 2.0**-9, (1 + m / 8.0) * 2.0**(e - 7.0))
    value = sign * value
    value[(e == 15) & (m == 7)] = np.nan
    return value


E4M3 = _e4m3_table()
_FINITE = np.flatnonzero(~np.isnan(E4M3))
_ORDER = _FINITE[np.argsort(E4M3[_FINITE], kind="stable")]


class _Dtype:
    """What an ml_dtypes dtype shows: a name, an item size, the kind 'V'."""

    def __init__(self, name, itemsize):
        self.name, self.itemsize, self.kind = name, itemsize, "V"

    def __str__(self):
        return self.name


class _Named:
    """An array of an ml_dtypes type as the array interface shows it ("|V1", "|V2"), over the
    raw codes in a NumPy array of unsigned integers."""

    def __init__(self, raw):
        self.raw = raw

    shape = property(lambda self: self.raw.shape)
    ndim = property(lambda self: self.raw.ndim)
    strides = property(lambda self: self.raw.strides)

    @property
    def __array_interface__(self):
        interface = dict(self.raw.__array_interface__)
        interface["typestr"] = f"|V{self.raw.itemsize}"
        interface["descr"] = [("", interface["typestr"])]
        return interface

    def __getitem__(self, index):
        return type(self)(self.raw[index])


class Fp8Array(_Named):
    dtype = _Dtype("float8_e4m3fn", 1)

    def values(self):
        return E4M3[self.raw]


class Bf16Array(_Named):
    dtype = _Dtype("bfloat16", 2)

    def fill(self, value):  # conftest's poison: NaN
        self.raw[...] = 0x7FC0 if np.isnan(value) else np.array(value, np.float32).view(
            np.uint32) >> 16

    def values(self):
        return (self.raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def quantise(x):
    """Nearest e4m3 codes of float64 values (saturating at +-448)."""
    x = np.clip(x, -448.0, 448.0)
    values = E4M3[_ORDER]
    i = np.clip(np.searchsorted(values, x), 1, len(values) - 1)
    lower = np.abs(x - values[i - 1]) <= np.abs(values[i] - x)
    return Fp8Array(_ORDER[np.where(lower, i - 1, i)].astype(np.uint8))


_LIBRARY_EMPTY = fs_tensor.empty  # before any fixture wraps it


@pytest.fixture(autouse=True)
def bfloat16_outputs(monkeypatch):
    """The bfloat16 out of an fp8 call as a Bf16Array (NumPy has no bfloat16), poisoned."""
    allocate = fs_tensor.empty

    def empty(like, framework, device, shape, dtype=None):
        if dtype == "bfloat16" and isinstance(like, Fp8Array):
            out = Bf16Array(np.empty(tuple(int(n) for n in shape), np.uint16))
            out.fill(float("nan"))
            return out
        return allocate(like, framework, device, shape, dtype)

    monkeypatch.setattr(fs_tensor, "empty", empty)


def random_fp8(rng, shape, scale=1.0):
    """e4m3 codes of N(0, 1) values, 0.1% of them N(0, 10^2) outliers, times 1 / scale."""
    x = rng.standard_normal(shape)
    outliers = rng.random(shape) < 1e-3
    x[outliers] *= 10
    return quantise(x / scale)


def descales(rng, batch, hk):
    return rng.uniform(0.5, 2.0, (batch, hk)).astype(np.float32)


def dequantised(x, descale, rows_of):
    """float64 values of codes x [.., h, d] times the descale of each row's (sequence, KV head):
    rows_of[r] is the sequence of row r (varlen) or None (dense, dimension 0 is the batch)."""
    values = x.values()
    if descale is None:
        return values
    heads = values.shape[-2]
    group = heads // descale.shape[1] if heads >= descale.shape[1] else 1
    per_head = np.repeat(descale.astype(np.float64), group, axis=1)  # [batch, heads]
    if rows_of is None:
        return values * per_head[:, None, :, None]
    return values * per_head[rows_of][:, :, None]


def check_fp8(out, ref, vmax):
    """The CPU path computes in float32 from the dequantised values and rounds out to bfloat16:
    per element within bfloat16's rounding (2^-8 relative, doubled for the float32 work's
    share) plus float32's sums over the keys (2^-16 of max|v|)."""
    out = np.asarray(out, dtype=np.float64)
    assert out.shape == ref.shape
    assert not np.isnan(out).any(), f"{int(np.isnan(out).sum())} NaN (unwritten?) elements"
    bound = 2.0**-7 * np.abs(ref) + 2.0**-16 * vmax
    worst = (np.abs(out - ref) / bound).max(initial=0.0)
    assert worst <= 1.0, f"error / bound {worst:.3g}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_descales", [True, False])
def test_dense_matches_float64_of_the_dequantised_inputs(seed, causal, with_descales):
    rng = np.random.default_rng(seed)
    b, sq, sk, h, hk, d = 2, 19, 37, 8, 2, 64
    q, k, v = (random_fp8(rng, (b, s, n, d)) for s, n in ((sq, h), (sk, hk), (sk, hk)))
    ds = [descales(rng, b, hk) if with_descales else None for _ in range(3)]
    out, lse = hopper.flash_attn_func(q, k, v, causal=causal, q_descale=ds[0], k_descale=ds[1],
                                      v_descale=ds[2], return_attn_probs=True)
    assert isinstance(out, Bf16Array) and out.shape == (b, sq, h, d)
    qf, kf, vf = (dequantised(x, s, None) for x, s in zip((q, k, v), ds))
    scale = d**-0.5
    for i in range(b):
        ref, ref_lse = attention(qf[i], kf[i], vf[i], scale, causal)
        check_fp8(out.values()[i], ref, np.abs(vf[i]).max())
        check_lse(lse[i], ref_lse)


def test_varlen_gqa_window_and_a_missing_descale(seed):
    """FA3's varlen layout: descales (batch, nheads_k) with batch = len(cu_seqlens_q) - 1; None
    for k_descale means 1."""
    rng = np.random.default_rng(seed)
    lens_q, lens_k, h, hk, d = [5, 1, 17], [9, 4, 17], 8, 1, 128
    cu_q = np.cumsum([0] + lens_q).astype(np.int32)
    cu_k = np.cumsum([0] + lens_k).astype(np.int32)
    q = random_fp8(rng, (cu_q[-1], h, d))
    k, v = random_fp8(rng, (cu_k[-1], hk, d)), random_fp8(rng, (cu_k[-1], hk, d))
    q_ds, v_ds = descales(rng, 3, hk), descales(rng, 3, hk)
    out, lse = hopper.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                             causal=True, window_size=(6, -1), q_descale=q_ds,
                                             v_descale=v_ds, return_attn_probs=True)
    rows_q = np.repeat(np.arange(3), lens_q)
    rows_k = np.repeat(np.arange(3), lens_k)
    qf, kf, vf = (dequantised(q, q_ds, rows_q), k.values(), dequantised(v, v_ds, rows_k))
    for i in range(3):
        sl_q, sl_k = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        ref, ref_lse = attention(qf[sl_q], kf[sl_k], vf[sl_k], d**-0.5, True, (6, -1))
        check_fp8(out.values()[sl_q], ref, np.abs(vf[sl_k]).max())
        check_lse(lse[:, sl_q], ref_lse)


def test_the_fa2_names_take_the_descales_as_keywords(seed):
    rng = np.random.default_rng(seed)
    q, k, v = (random_fp8(rng, (1, 7, 2, 64)) for _ in range(3))
    ds = descales(rng, 1, 2)
    a = flashserve.flash_attn_func(q, k, v, causal=True, q_descale=ds, k_descale=ds,
                                   v_descale=ds)
    b = hopper.flash_attn_func(q, k, v, causal=True, q_descale=ds, k_descale=ds, v_descale=ds)
    assert np.array_equal(a.raw, b.raw)


# ---------------------------------------------------------------- the argument checks

def small(rng, b=2, s=5, h=4, hk=2, d=64):
    return (random_fp8(rng, (b, s, h, d)), random_fp8(rng, (b, s, hk, d)),
            random_fp8(rng, (b, s, hk, d)))


@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale"])
def test_descale_of_another_shape_is_refused_by_name(seed, name):
    rng = np.random.default_rng(seed)
    q, k, v = small(rng)
    for shape in [(2, 4), (1, 2), (2,), (2, 2, 1)]:  # nheads instead of nheads_k, ...
        with pytest.raises(ValueError, match=rf"^{name}: "):
            hopper.flash_attn_func(q, k, v, **{name: np.ones(shape, np.float32)})


@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale"])
def test_descale_of_another_dtype_is_refused_by_name(seed, name):
    rng = np.random.default_rng(seed)
    q, k, v = small(rng)
    for dtype in (np.float64, np.float16, np.int32):
        with pytest.raises(ValueError, match=rf"^{name}: .*float32"):
            hopper.flash_attn_func(q, k, v, **{name: np.ones((2, 2), dtype)})
    with pytest.raises(TypeError, match=rf"^{name}: expected a tensor"):
        hopper.flash_attn_func(q, k, v, **{name: 0.5})  # FA3 takes tensors, not numbers


@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale"])
def test_descale_beside_a_16_or_32_bit_call_is_refused_by_name(seed, name):
    """FlashAttention-3 ignores descales unless q is float8_e4m3fn; flashserve says so."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((2, 5, 2, 64)).astype(np.float32) for _ in range(3))
    with pytest.raises(ValueError, match=rf"^{name}: applies to a float8_e4m3fn"):
        hopper.flash_attn_func(q, k, v, **{name: np.ones((2, 2), np.float32)})


def test_a_k_or_v_of_another_dtype_is_refused_by_name(seed):
    rng = np.random.default_rng(seed)
    q, k, v = small(rng)
    k32 = k.values().astype(np.float32)
    with pytest.raises(ValueError, match=r"^k: "):
        hopper.flash_attn_func(q, k32, v)
    with pytest.raises(ValueError, match=r"^v: "):
        hopper.flash_attn_func(q, k, v.values().astype(np.float32))


def test_without_a_bfloat16_type_the_out_is_refused_naming_q(seed, monkeypatch):
    """NumPy has no bfloat16: without ml_dtypes the out of an fp8 call cannot be allocated."""
    rng = np.random.default_rng(seed)
    q, k, v = small(rng)
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import fails
    monkeypatch.setattr(fs_tensor, "empty", _LIBRARY_EMPTY)
    with pytest.raises(TypeError, match=r"^q: a float8_e4m3fn q gives a bfloat16 out"):
        hopper.flash_attn_func(q, k, v)


def test_ml_dtypes_arrays_when_installed(seed):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 9, 2, 64))
    q, k, v = (x.astype(ml_dtypes.float8_e4m3fn) for _ in range(3))
    out = hopper.flash_attn_func(q, k, v, causal=True)
    assert out.dtype == ml_dtypes.bfloat16
    f = x.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)[0]
    ref, _ = attention(f, f, f, 64**-0.5, True)
    check_fp8(out.astype(np.float64)[0], ref, np.abs(f).max())


# ---------------------------------------------------------------- PyTorch tensors (CPU)

def _torch():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this PyTorch has no float8_e4m3fn")
    return torch


def test_torch_fp8_on_the_cpu_path(seed):
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    b, s, h, hk, d = 2, 13, 4, 2, 64
    q = torch.randn(b, s, h, d, generator=g).to(torch.float8_e4m3fn)
    k = torch.randn(b, s, hk, d, generator=g).to(torch.float8_e4m3fn)
    v = torch.randn(b, s, hk, d, generator=g).to(torch.float8_e4m3fn)
    ds = torch.rand(b, hk, generator=g) + 0.5
    out, lse = hopper.flash_attn_func(q, k, v, causal=True, q_descale=ds, k_descale=ds,
                                      v_descale=ds, return_attn_probs=True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    group = h // hk
    dq = ds.double().repeat_interleave(group, dim=1)[:, None, :, None]
    dk = ds.double()[:, None, :, None]
    qf, kf, vf = q.double() * dq, k.double() * dk, v.double() * dk
    for i in range(b):
        ref, ref_lse = attention(qf[i].numpy(), kf[i].numpy(), vf[i].numpy(), d**-0.5, True)
        check_fp8(out[i].double().numpy(), ref, vf[i].abs().max().item())
        check_lse(lse[i].numpy(), ref_lse)


@pytest.mark.parametrize("name", ["q", "k", "v", "q_descale", "k_descale", "v_descale"])
def test_torch_fp8_requiring_grad_is_refused_by_name(seed, name):
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    args = {n: torch.randn(1, 5, 2, 64, generator=g).to(torch.float8_e4m3fn)
            for n in ("q", "k", "v")}
    args.update({n: torch.ones(1, 2) for n in ("q_descale", "k_descale", "v_descale")})
    try:
        args[name].requires_grad_()
    except RuntimeError as e:  # a PyTorch that tracks no gradient of float8 tensors
        pytest.skip(str(e))
    with pytest.raises(NotImplementedError, match=rf"^{name}: requires grad, but the "
                       r"float8_e4m3fn forward has no backward"):
        hopper.flash_attn_func(**args)
    with torch.no_grad():  # no gradient asked for: runs
        assert hopper.flash_attn_func(**args).dtype == torch.bfloat16


def test_torch_other_float8_formats_are_refused_by_name(seed):
    torch = _torch()
    if not hasattr(torch, "float8_e5m2"):
        pytest.skip("this PyTorch has no float8_e5m2")
    q = torch.randn(1, 5, 2, 64).to(torch.float8_e4m3fn)
    k = torch.randn(1, 5, 2, 64).to(torch.float8_e5m2)
    with pytest.raises(ValueError, match=r"^k: dtype float8_e5m2 is not supported"):
        hopper.flash_attn_func(q, k, q)


def test_torch_expanded_descale_is_taken(seed):
    """vLLM passes one scale per tensor expanded to (batch, nheads_k): strides (0, 0)."""
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 5, 2, 64, generator=g).to(torch.float8_e4m3fn) for _ in range(3))
    scale = torch.tensor([0.75])
    a = hopper.flash_attn_func(q, k, v, q_descale=scale.expand(2, 2), k_descale=scale.expand(2, 2),
                               v_descale=scale.expand(2, 2))
    full = torch.full((2, 2), 0.75)
    b = hopper.flash_attn_func(q, k, v, q_descale=full, k_descale=full, v_descale=full)
    assert torch.equal(a, b)
