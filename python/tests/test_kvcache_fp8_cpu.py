"""flash_attn_with_kvcache on float8_e4m3fn caches with FlashAttention-3's descale factors, on the
CPU path with NumPy alone (test_fp8_cpu.py's stand-ins for ml_dtypes' float8_e4m3fn and bfloat16):
q e4m3 too (FA3's fp8 call, a bfloat16 out) or float32 / float16 (an fp8 KV cache beside a
higher-precision q), dense, cache_batch_idx and paged caches, GQA, causal or not, lengths as an
array or an int, with e4m3 k and v appended. The append is checked byte for byte (the new codes at
their slots, every other byte of both caches unchanged: the codes are copied, never converted),
the attention against float64 attention of the dequantised cache (code x descale of its
(sequence, KV head)), with test_fp8_cpu.py's tolerance for a bfloat16 out and test_kvcache_cpu.py's
criterion (twice a naive kernel's error in q's precision) for a 16-bit or float32 one. Then each
refusal by name, and that a refused call leaves the cache as it was. The device's cases:
test_gpu_fp8.py."""

import math

import numpy as np
import pytest

import flashserve
from flashserve import hopper
from attention_reference import attention, check_close, check_lse
from test_fp8_cpu import (E4M3, Fp8Array, bfloat16_outputs, check_fp8, dequantised,  # noqa: F401
                          descales, random_fp8)
from test_kvcache_cpu import FLOOR, LSE_TOL, Cache


def fp8_cache(rng, batch, capacity, hk, d, layout):
    """test_kvcache_cpu's Cache (its layouts, slots and table) holding e4m3 codes: random codes of
    N(0, 1) values with outliers, times 1 / 0.8 (so that a wrong descale shows)."""
    page = {"paged16": 16, "paged5": 5}.get(layout)
    cache = Cache(rng, np.float32, batch, capacity, hk, d, page_size=page,
                  batch_idx=layout == "batch_idx")
    cache.k = random_fp8(rng, cache.k.shape, 0.8).raw
    cache.v = random_fp8(rng, cache.v.shape, 0.8).raw
    return cache


def run(fn, q, cache, kn, vn, lens, causal, ds, lengths_as="array", **extra):
    """One call of fn (flashserve's or hopper's) over the cache (its codes written in place)."""
    table_name = "page_table" if fn is hopper.flash_attn_with_kvcache else "block_table"
    return fn(q, Fp8Array(cache.k), Fp8Array(cache.v), kn, vn,
              cache_seqlens=int(lens[0]) if lengths_as == "int" else lens,
              cache_batch_idx=cache.batch_idx, causal=causal, return_softmax_lse=True,
              q_descale=ds[0], k_descale=ds[1], v_descale=ds[2],
              **{table_name: cache.table}, **extra)


CASES = [  # batch, s_q, s_new, h, hk, d, layout
    (3, 1, 1, 8, 2, 64, "contiguous"),  # decode, GQA 4
    (2, 5, 5, 4, 1, 64, "paged16"),  # a chunk appended, MQA
    (3, 3, 2, 8, 2, 128, "batch_idx"),  # s_q != s_new
    (2, 4, 4, 6, 2, 32, "paged5"),  # odd page size, GQA 3
    (2, 2, 0, 4, 2, 64, "paged16"),  # no new tokens
]


@pytest.mark.parametrize("q_kind", ["e4m3", np.float32, np.float16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("with_descales", [True, False])
@pytest.mark.parametrize("lengths_as", ["array", "int"])
def test_append_and_attend_on_an_e4m3_cache(seed, q_kind, case, causal, with_descales,
                                            lengths_as):
    rng = np.random.default_rng(seed)
    b, sq, s_new, h, hk, d, layout = case
    capacity = 37
    cache = fp8_cache(rng, b, capacity, hk, d, layout)
    if lengths_as == "int":
        lens = np.full(b, int(rng.integers(0, capacity - s_new + 1)), np.int32)
    else:
        lens = rng.integers(0, capacity - s_new + 1, b).astype(np.int32)
        lens[0] = capacity - s_new  # one sequence fills the cache to its last slot
    if cache.table is not None:
        cache.trim_table(lens + s_new)
    fp8_q = q_kind == "e4m3"
    q = random_fp8(rng, (b, sq, h, d)) if fp8_q else \
        rng.standard_normal((b, sq, h, d)).astype(q_kind)
    kn = random_fp8(rng, (b, s_new, hk, d), 0.8) if s_new else None
    vn = random_fp8(rng, (b, s_new, hk, d), 0.8) if s_new else None
    ds = [descales(rng, b, hk) if with_descales else None for _ in range(3)]
    if not fp8_q:
        ds[0] = None  # q_descale applies to an e4m3 q only (refused otherwise: below)
    k_before, v_before = cache.k.copy(), cache.v.copy()

    fn = hopper.flash_attn_with_kvcache if lengths_as == "int" else \
        flashserve.flash_attn_with_kvcache
    out, lse = run(fn, q, cache, kn, vn, lens, causal, ds, lengths_as)
    out = out.values() if fp8_q else out
    assert out.shape == (b, sq, h, d) and lse.shape == (b, h, sq)
    if not fp8_q:
        assert out.dtype == q_kind

    # The append: each new token's codes at its slot, bit for bit; every other byte unchanged.
    written = np.zeros(cache.k.shape[:2], dtype=bool)
    for i in range(b):
        n = int(lens[i]) + s_new
        slots = cache.slots(i, n)
        new = (slots[0][lens[i]:], slots[1][lens[i]:])
        written[new] = True
        if s_new:
            assert np.array_equal(cache.k[new], kn.raw[i]), f"k codes of sequence {i}"
            assert np.array_equal(cache.v[new], vn.raw[i]), f"v codes of sequence {i}"
    assert written.sum() == b * s_new
    assert np.array_equal(cache.k[~written], k_before[~written])
    assert np.array_equal(cache.v[~written], v_before[~written])

    # The attention over the updated cache, dequantised with sequence i's descales (row i, not
    # the cache row cache_batch_idx[i]).
    qf = dequantised(q, ds[0], None) if fp8_q else q.astype(np.float64)
    scale = 1 / math.sqrt(d)
    for i in range(b):
        slots = cache.slots(i, int(lens[i]) + s_new)
        kd = E4M3[cache.k[slots]] * (1.0 if ds[1] is None else ds[1][i][None, :, None])
        vd = E4M3[cache.v[slots]] * (1.0 if ds[2] is None else ds[2][i][None, :, None])
        exact, exact_lse = attention(qf[i], kd, vd, scale, causal)
        if len(slots[0]) == 0:  # an empty sequence: zero rows, lse -inf
            assert np.array_equal(np.asarray(out[i], np.float64), np.zeros_like(exact))
            assert np.isneginf(lse[i]).all()
        elif fp8_q:
            check_fp8(out[i], exact, np.abs(vd).max())
            check_lse(lse[i], exact_lse)
        else:
            # test_kvcache_cpu's floors are for values of magnitude ~1; these reach ~100
            # (outliers, 1 / 0.8, descales up to 2), and float32's sums err in proportion.
            naive, _ = attention(q[i], kd, vd, scale, causal, low_precision=q_kind)
            check_close(out[i], exact, naive, FLOOR[q_kind] * np.abs(vd).max(),
                        f"out of sequence {i}")
            check_lse(lse[i], exact_lse, *LSE_TOL[q_kind])


def test_the_fa2_and_fa3_names_give_the_same_bits(seed):
    """flashserve.flash_attn_with_kvcache (descales keyword-only) and hopper's (FA3's order,
    page_table) are one call."""
    rng = np.random.default_rng(seed)
    # Two calls on two copies of one random cache (each call appends to its own copy).
    cache = fp8_cache(rng, 2, 20, 2, 64, "paged16")
    copy = fp8_cache(rng, 2, 20, 2, 64, "paged16")
    copy.k, copy.v, copy.table = cache.k.copy(), cache.v.copy(), cache.table.copy()
    q = random_fp8(rng, (2, 3, 4, 64))
    kn, vn = random_fp8(rng, (2, 3, 2, 64)), random_fp8(rng, (2, 3, 2, 64))
    ds = [descales(rng, 2, 2) for _ in range(3)]
    lens = np.array([4, 17], np.int32)
    a, a_lse = run(flashserve.flash_attn_with_kvcache, q, cache, kn, vn, lens, True, ds)
    b, b_lse = run(hopper.flash_attn_with_kvcache, q, copy, kn, vn, lens, True, ds)
    assert np.array_equal(a.raw, b.raw) and np.array_equal(a_lse, b_lse)
    assert np.array_equal(cache.k, copy.k) and np.array_equal(cache.v, copy.v)


def test_descales_equal_one_are_the_same_as_none(seed):
    rng = np.random.default_rng(seed)
    cache = fp8_cache(rng, 2, 16, 2, 64, "contiguous")
    q = rng.standard_normal((2, 2, 4, 64)).astype(np.float32)
    lens = np.array([9, 16], np.int32)
    ones = np.ones((2, 2), np.float32)
    none = run(flashserve.flash_attn_with_kvcache, q, cache, None, None, lens, True,
               [None] * 3)
    one = run(flashserve.flash_attn_with_kvcache, q, cache, None, None, lens, True,
              [None, ones, ones])
    assert np.array_equal(none[0], one[0]) and np.array_equal(none[1], one[1])


# ---------------------------------------------------------------- refusals by name

def small(rng, q_kind="e4m3"):
    """A valid call's arguments: q, caches (raw codes), new k / v (e4m3), lengths."""
    q = random_fp8(rng, (2, 1, 4, 64)) if q_kind == "e4m3" else \
        rng.standard_normal((2, 1, 4, 64)).astype(q_kind)
    kc, vc = random_fp8(rng, (2, 10, 2, 64)), random_fp8(rng, (2, 10, 2, 64))
    kn, vn = random_fp8(rng, (2, 1, 2, 64)), random_fp8(rng, (2, 1, 2, 64))
    return q, kc, vc, kn, vn, np.array([3, 7], np.int32)


def refused(exception, match, q, kc, vc, kn=None, vn=None, fn=None, **kwargs):
    """The call raises `exception` matching `match`, and neither cache changed."""
    fn = fn or flashserve.flash_attn_with_kvcache
    before = [np.array(x.raw if isinstance(x, Fp8Array) else x, copy=True) for x in (kc, vc)]
    with pytest.raises(exception, match=match):
        fn(q, kc, vc, kn, vn, **kwargs)
    after = [x.raw if isinstance(x, Fp8Array) else x for x in (kc, vc)]
    assert np.array_equal(after[0], before[0]) and np.array_equal(after[1], before[1]), \
        "the refused call wrote the cache"


@pytest.mark.parametrize("q_kind", ["e4m3", np.float32])
def test_new_tokens_of_another_dtype_are_refused_by_name(seed, q_kind):
    """The append copies codes: new k / v must be the cache's float8_e4m3fn (as FA3 requires),
    quantised by the caller with the scale the descales undo."""
    rng = np.random.default_rng(seed)
    q, kc, vc, kn, vn, lens = small(rng, q_kind)
    k32, v32 = kn.values().astype(np.float32), vn.values().astype(np.float32)
    refused(ValueError, r"^k: dtype float32 differs from k_cache's float8_e4m3fn \(what is "
            r"written into a float8_e4m3fn cache must be e4m3 codes already", q, kc, vc, k32, vn,
            cache_seqlens=lens)
    refused(ValueError, r"^v: dtype float16 differs from k_cache's float8_e4m3fn", q, kc, vc, kn,
            v32.astype(np.float16), cache_seqlens=lens)
    refused(ValueError, r"^k: ", q, kc, vc, k32, v32, cache_seqlens=lens,
            fn=hopper.flash_attn_with_kvcache)


@pytest.mark.parametrize("q_kind", ["e4m3", np.float32])
@pytest.mark.parametrize("fn", [flashserve.flash_attn_with_kvcache,
                                hopper.flash_attn_with_kvcache])
def test_rotary_into_an_e4m3_cache_is_refused_by_name(seed, q_kind, fn):
    rng = np.random.default_rng(seed)
    q, kc, vc, kn, vn, lens = small(rng, q_kind)
    cos = np.cos(rng.uniform(-3, 3, (16, 32))).astype(np.float32)
    sin = np.sin(rng.uniform(-3, 3, (16, 32))).astype(np.float32)
    refused(NotImplementedError, r"^rotary_cos: rotary embedding into a float8_e4m3fn cache is "
            r"not supported", q, kc, vc, kn, vn, fn=fn, rotary_cos=cos, rotary_sin=sin,
            cache_seqlens=lens, causal=True)
    # Without new tokens too: q would be rotated, the cache's keys were not.
    refused(NotImplementedError, r"^rotary_cos: ", q, kc, vc, fn=fn, rotary_cos=cos,
            rotary_sin=sin, cache_seqlens=lens)
    if q_kind == "e4m3":  # an e4m3 q beside a 16-bit cache: its codes cannot be rotated either
        k32, v32 = kc.values().astype(np.float32), vc.values().astype(np.float32)
        refused(NotImplementedError, r"^rotary_cos: rotary embedding of a float8_e4m3fn q", q,
                k32, v32, fn=fn, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens)


@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale"])
def test_descales_beside_16_bit_caches_are_refused_by_name(seed, name):
    """The entry point gives a descale a meaning only beside an e4m3 tensor of its name."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 1, 4, 64)).astype(np.float32)
    kc, vc = (rng.standard_normal((2, 10, 2, 64)).astype(np.float32) for _ in range(2))
    kn, vn = (rng.standard_normal((2, 1, 2, 64)).astype(np.float32) for _ in range(2))
    tensor = {"q_descale": "q", "k_descale": "k", "v_descale": "v"}[name]
    refused(ValueError, rf"^{name}: applies to a float8_e4m3fn {tensor}, not a float32 one", q,
            kc, vc, kn, vn, cache_seqlens=np.array([3, 7], np.int32),
            **{name: np.ones((2, 2), np.float32)})


def test_q_descale_beside_a_16_bit_q_is_refused_by_name(seed):
    rng = np.random.default_rng(seed)
    q, kc, vc, kn, vn, lens = small(rng, np.float16)
    refused(ValueError, r"^q_descale: applies to a float8_e4m3fn q, not a float16 one", q, kc, vc,
            kn, vn, cache_seqlens=lens, q_descale=np.ones((2, 2), np.float32),
            k_descale=np.ones((2, 2), np.float32))


@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale"])
def test_descale_of_another_shape_dtype_or_kind_is_refused_by_name(seed, name):
    rng = np.random.default_rng(seed)
    q, kc, vc, kn, vn, lens = small(rng)
    for shape in [(2, 4), (1, 2), (2,), (2, 2, 1)]:  # nheads instead of nheads_k, ...
        refused(ValueError, rf"^{name}: ", q, kc, vc, kn, vn, cache_seqlens=lens,
                **{name: np.ones(shape, np.float32)})
    # The cache's rows are not the batch: with cache_batch_idx, descales are (batch, nheads_k).
    big_kc, big_vc = random_fp8(rng, (5, 10, 2, 64)), random_fp8(rng, (5, 10, 2, 64))
    refused(ValueError, rf"^{name}: shape \[5, 2\] is not \[batch, h_kv\] = \[2, 2\]", q, big_kc,
            big_vc, kn, vn, cache_seqlens=lens, cache_batch_idx=np.array([4, 1], np.int32),
            **{name: np.ones((5, 2), np.float32)})
    for dtype in (np.float64, np.float16, np.int32):
        refused(ValueError, rf"^{name}: .*float32", q, kc, vc, kn, vn, cache_seqlens=lens,
                **{name: np.ones((2, 2), dtype)})
    refused(TypeError, rf"^{name}: expected a tensor", q, kc, vc, kn, vn, cache_seqlens=lens,
            **{name: 0.5})


def test_mixed_dtypes_are_refused_by_name(seed):
    rng = np.random.default_rng(seed)
    q, kc, vc, kn, vn, lens = small(rng)
    k32, v32 = kc.values().astype(np.float32), vc.values().astype(np.float32)
    # An e4m3 q reads e4m3 caches only (FA3's fp8 call).
    refused(ValueError, r"^k_cache: dtype float32 differs from q's float8_e4m3fn", q, k32, v32)
    # One cache e4m3, the other not.
    refused(ValueError, r"^v_cache: dtype float32 differs from k_cache's float8_e4m3fn", q, kc,
            v32, kn, vn, cache_seqlens=lens)


def test_the_bounds_checks_still_hold(seed):
    rng = np.random.default_rng(seed)
    q, kc, vc, kn, vn, _ = small(rng)
    refused(ValueError, r"^cache_seqlens: sequence 1 holds 10 keys; appending 1 new ones needs "
            r"11 slots, but the cache holds 10", q, kc, vc, kn, vn,
            cache_seqlens=np.array([3, 10], np.int32))
    pages, pages_v = random_fp8(rng, (4, 5, 2, 64)), random_fp8(rng, (4, 5, 2, 64))
    refused(ValueError, r"^block_table: entry \[1, 1\] is 7, outside the pool of 4 pages", q,
            pages, pages_v, kn, vn, cache_seqlens=np.array([3, 5], np.int32),
            block_table=np.array([[0, 1], [2, 7]], np.int32))


# ---------------------------------------------------------------- PyTorch tensors (CPU)

def _torch():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this PyTorch has no float8_e4m3fn")
    return torch


@pytest.mark.parametrize("q_dtype", ["float8_e4m3fn", "bfloat16"])
def test_torch_e4m3_paged_cache_on_the_cpu_path(seed, q_dtype):
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    fp8 = torch.float8_e4m3fn
    b, sq, h, hk, d, page, pages = 2, 2, 8, 2, 64, 16, 9
    kc = torch.randn(pages, page, hk, d, generator=g).to(fp8)
    vc = torch.randn(pages, page, hk, d, generator=g).to(fp8)
    table = torch.randperm(pages, generator=g)[:8].reshape(b, 4).int()
    lens = torch.tensor([30, 61], dtype=torch.int32)
    q = torch.randn(b, sq, h, d, generator=g).to(getattr(torch, q_dtype))
    kn = torch.randn(b, sq, hk, d, generator=g).to(fp8)
    vn = torch.randn(b, sq, hk, d, generator=g).to(fp8)
    ds = [torch.rand(b, hk, generator=g) + 0.5 for _ in range(3)]
    qd = ds[0] if q_dtype == "float8_e4m3fn" else None
    before = kc.view(torch.uint8).clone()
    out, lse = hopper.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens,
                                              page_table=table, causal=True, q_descale=qd,
                                              k_descale=ds[1], v_descale=ds[2],
                                              return_softmax_lse=True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    after = kc.view(torch.uint8)
    changed = (after != before).any(dim=(2, 3))
    for i in range(b):
        pos = int(lens[i]) + torch.arange(sq)
        rows = table[i, pos // page].long(), pos % page
        assert torch.equal(after[rows], kn[i].view(torch.uint8)), f"k codes of sequence {i}"
        assert torch.equal(vc.view(torch.uint8)[rows], vn[i].view(torch.uint8))
        changed[rows] = False
    assert not changed.any(), "the append wrote outside the new tokens' slots"
    group = h // hk
    for i in range(b):
        n = int(lens[i]) + sq
        pos = torch.arange(n)
        rows = table[i, pos // page].long(), pos % page
        # (indexed as bytes: PyTorch's CPU indexing may lack float8 kernels)
        kf = kc.view(torch.uint8)[rows].view(fp8).double() * ds[1][i].double()[None, :, None]
        vf = vc.view(torch.uint8)[rows].view(fp8).double() * ds[2][i].double()[None, :, None]
        qf = q[i].double()
        if qd is not None:
            qf = qf * qd[i].double().repeat_interleave(group)[None, :, None]
        ref, ref_lse = attention(qf.numpy(), kf.numpy(), vf.numpy(), d**-0.5, True)
        check_fp8(out[i].double().numpy(), ref, vf.abs().max().item())
        check_lse(lse[i].numpy(), ref_lse)


@pytest.mark.parametrize("name", ["q_descale", "k_descale", "v_descale"])
def test_torch_descale_requiring_grad_is_refused_by_name(seed, name):
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 2, 64, generator=g).to(torch.float8_e4m3fn)
    kc = torch.randn(1, 8, 2, 64, generator=g).to(torch.float8_e4m3fn)
    vc = torch.randn(1, 8, 2, 64, generator=g).to(torch.float8_e4m3fn)
    ds = {n: torch.ones(1, 2) for n in ("q_descale", "k_descale", "v_descale")}
    ds[name].requires_grad_()
    with pytest.raises(NotImplementedError, match=rf"^{name}: requires grad, but the "
                       r"float8_e4m3fn forward has no backward"):
        hopper.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=5, **ds)
    with torch.no_grad():
        assert hopper.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=5,
                                              **ds).dtype == torch.bfloat16
