"""flash_attn_with_kvcache on NumPy arrays (the CPU path): the in-place append (+ rotary) against a
reference written here, independently of the library (whole-array NumPy slicing, in float64), and
the attention that follows against the float64 reference of attention_reference.py. Fresh random
inputs; the outputs are poisoned (conftest.py) and every cache slot the append must not touch is
compared bit for bit. Also: the packed variants and the num_splits default."""

import inspect
import math

import numpy as np
import pytest

import flashserve
from flashserve import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                        flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                        flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
from attention_reference import attention, check_close, check_lse

FLOOR = {np.float32: 2e-6, np.float16: 2.5e-4}
LSE_TOL = {np.float32: (1e-5, 1e-4), np.float16: (2e-3, 2e-3)}
ROUND_TOL = {np.float32: (2e-6, 1e-6), np.float16: (2e-3, 1e-3)}  # one rounding of a rotation


def rope(x, pos, cos, sin, interleaved):
    """x [n, h, d] float64 rotated at positions pos [n]: cos/sin [s_rot, rotary_dim / 2]. The
    textbook form: split the rotated part into its pairs, rotate them as complex numbers."""
    rd = 2 * cos.shape[1]
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    out = x.copy()
    if interleaved:
        z = x[..., 0:rd:2] + 1j * x[..., 1:rd:2]
        z = z * (c + 1j * s)
        out[..., 0:rd:2], out[..., 1:rd:2] = z.real, z.imag
    else:
        half = rd // 2
        z = x[..., :half] + 1j * x[..., half:rd]
        z = z * (c + 1j * s)
        out[..., :half], out[..., half:rd] = z.real, z.imag
    return out


def rotary_tables(rng, s_rot, rotary_dim, dtype):
    """cos/sin of random angles (not a real RoPE schedule: any angle must work)."""
    angles = rng.uniform(-math.pi, math.pi, (s_rot, rotary_dim // 2))
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


class Cache:
    """A cache built at random, contiguous (rows = sequences, optionally mapped by cache_batch_idx)
    or paged (pages in random order, unused table entries -1), with the logical view of each
    sequence's slots."""

    def __init__(self, rng, dtype, batch, capacity, hk, d, page_size=None, batch_idx=False):
        self.page_size = page_size
        if page_size is None:
            rows = batch + 3 if batch_idx else batch
            self.k = rng.standard_normal((rows, capacity, hk, d)).astype(dtype)
            self.v = rng.standard_normal((rows, capacity, hk, d)).astype(dtype)
            self.row = rng.permutation(rows)[:batch].astype(np.int32) if batch_idx else \
                np.arange(batch, dtype=np.int32)
            self.batch_idx = self.row if batch_idx else None
            self.table = None
        else:
            pages_per_seq = -(-capacity // page_size)
            num_pages = batch * pages_per_seq + 2
            self.k = rng.standard_normal((num_pages, page_size, hk, d)).astype(dtype)
            self.v = rng.standard_normal((num_pages, page_size, hk, d)).astype(dtype)
            order = rng.permutation(num_pages).astype(np.int32)
            self.table = order[:batch * pages_per_seq].reshape(batch, pages_per_seq).copy()
            self.batch_idx = None

    def slots(self, b, n):
        """(index tuples into k/v) of the first n positions of sequence b."""
        j = np.arange(n)
        if self.page_size is None:
            return (np.full(n, self.row[b]), j)
        return (self.table[b, j // self.page_size], j % self.page_size)

    def trim_table(self, needed):
        """Unused table entries become -1: the library must never read them."""
        for b, n in enumerate(needed):
            used = -(-n // self.page_size)
            self.table[b, used:] = -1


CASES = [  # batch, s_q, s_new, h, hk, d, rotary_dim, causal, window, layout
    (3, 1, 1, 8, 2, 64, 64, True, (-1, -1), "contiguous"),  # decode, GQA 4
    (2, 5, 5, 4, 4, 32, 16, True, (-1, -1), "paged16"),  # chunk appended, partial rotary
    (2, 3, 2, 4, 1, 64, 32, False, (-1, -1), "batch_idx"),  # s_q != s_new, MQA, non-causal
    (3, 4, 4, 6, 2, 16, 16, False, (3, 1), "paged7"),  # local window, odd page size
    (2, 1, 0, 4, 2, 32, 0, True, (-1, -1), "paged16"),  # no new tokens
    (2, 6, 6, 4, 2, 32, 0, True, (4, -1), "contiguous"),  # no rotary, sliding window
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("lengths_as", ["array", "int"])
def test_append_and_attend(seed, dtype, interleaved, case, lengths_as):
    rng = np.random.default_rng(seed)
    b, sq, s_new, h, hk, d, rd, causal, window, layout = case
    if not rd and not interleaved:
        pytest.skip("no rotary: the layout flag has nothing to do")
    capacity = 37
    page = {"paged16": 16, "paged7": 7}.get(layout)
    cache = Cache(rng, dtype, b, capacity, hk, d, page_size=page,
                  batch_idx=layout == "batch_idx")
    if lengths_as == "int":
        lens = np.full(b, int(rng.integers(0, capacity - s_new + 1)), dtype=np.int32)
    else:
        lens = rng.integers(0, capacity - s_new + 1, b).astype(np.int32)
        lens[0] = capacity - s_new  # one sequence fills the cache to the last slot
    if page:
        cache.trim_table(lens + s_new)
    q = rng.standard_normal((b, sq, h, d)).astype(dtype)
    k_new = rng.standard_normal((b, s_new, hk, d)).astype(dtype)
    v_new = rng.standard_normal((b, s_new, hk, d)).astype(dtype)
    s_rot = capacity + sq
    cos, sin = rotary_tables(rng, s_rot, rd, dtype) if rd else (None, None)
    k_before, v_before = cache.k.copy(), cache.v.copy()

    out, lse = flash_attn_with_kvcache(
        q, cache.k, cache.v, k_new if s_new else None, v_new if s_new else None,
        rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=int(lens[0]) if lengths_as == "int" else lens,
        cache_batch_idx=cache.batch_idx, block_table=cache.table, causal=causal,
        window_size=window, rotary_interleaved=interleaved, return_softmax_lse=True)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (b, h, sq)

    written = np.zeros(cache.k.shape[:2], dtype=bool)
    per_token = causal or window != (-1, -1)
    scale = 1 / math.sqrt(d)
    for i in range(b):
        n = int(lens[i]) + s_new
        pos_new = lens[i] + np.arange(s_new)
        k_rot = k_new[i].astype(np.float64)
        if rd:
            k_rot = rope(k_rot, pos_new, cos.astype(np.float64), sin.astype(np.float64),
                         interleaved)
        # The new slots hold the rotated keys (rounded once to the cache's dtype) and the values.
        new = cache.slots(i, n)
        new = (new[0][lens[i]:], new[1][lens[i]:])
        written[new] = True
        rtol, atol = ROUND_TOL[dtype]
        assert np.allclose(cache.k[new].astype(np.float64), k_rot, rtol=rtol, atol=atol)
        assert np.array_equal(cache.v[new], v_new[i])
        # The attention: the cached prefix as it was, then the new tokens.
        old = cache.slots(i, int(lens[i]))
        keys = np.concatenate([k_before[old].astype(np.float64), k_rot])
        keys_low = np.concatenate([k_before[old], k_rot.astype(dtype)])
        values = np.concatenate([v_before[old], v_new[i]])
        q_pos = lens[i] + (np.arange(sq) if per_token else np.zeros(sq, dtype=int))
        q_rot = q[i].astype(np.float64)
        if rd:
            q_rot = rope(q_rot, q_pos, cos.astype(np.float64), sin.astype(np.float64),
                         interleaved)
        assert keys.shape[0] == n
        exact, exact_lse = attention(q_rot, keys, values, scale, causal, window)
        naive, _ = attention(q_rot.astype(dtype), keys_low, values, scale, causal, window,
                             low_precision=dtype)
        check_close(out[i], exact, naive, FLOOR[dtype], f"out of sequence {i}")
        check_lse(lse[i], exact_lse, *LSE_TOL[dtype])
    # Every slot that was not appended to is bit for bit what it was.
    assert np.array_equal(cache.k[~written], k_before[~written])
    assert np.array_equal(cache.v[~written], v_before[~written])


def test_cache_seqlens_none_is_the_whole_cache(seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 3, 4, 32)).astype(np.float32)
    kc = rng.standard_normal((2, 20, 2, 32)).astype(np.float32)
    vc = rng.standard_normal((2, 20, 2, 32)).astype(np.float32)
    out = flash_attn_with_kvcache(q, kc, vc, causal=True)
    for b in range(2):
        exact, _ = attention(q[b], kc[b], vc[b], 1 / math.sqrt(32), True)
        check_close(out[b], exact, exact, FLOOR[np.float32])
    # ... and then there is no room for a new token.
    with pytest.raises(ValueError, match=r"^cache_seqlens: sequence 0 holds 20 keys; appending 1"):
        flash_attn_with_kvcache(q, kc, vc, kc[:, :1].copy(), vc[:, :1].copy())


def test_equals_flash_attn_func_on_the_cache_prefix(seed):
    """Without rotary and with one length, the result is flash_attn_func over the prefix of the
    updated cache (two library paths, the same numbers)."""
    rng = np.random.default_rng(seed)
    b, sq, h, hk, d, cap, n = 2, 4, 8, 2, 64, 50, 29
    q = rng.standard_normal((b, sq, h, d)).astype(np.float16)
    kc, vc = (rng.standard_normal((b, cap, hk, d)).astype(np.float16) for _ in range(2))
    kn, vn = (rng.standard_normal((b, sq, hk, d)).astype(np.float16) for _ in range(2))
    out = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=n, causal=True)
    ref = flash_attn_func(q, kc[:, :n + sq], vc[:, :n + sq], causal=True)
    assert np.array_equal(out, ref)


def lengths(b, value):
    return np.full(b, value, dtype=np.int32)


def small(rng, dtype=np.float32):
    q = rng.standard_normal((2, 1, 4, 32)).astype(dtype)
    kc = rng.standard_normal((2, 10, 2, 32)).astype(dtype)
    vc = rng.standard_normal((2, 10, 2, 32)).astype(dtype)
    kn = rng.standard_normal((2, 1, 2, 32)).astype(dtype)
    vn = rng.standard_normal((2, 1, 2, 32)).astype(dtype)
    return q, kc, vc, kn, vn


def test_overflow_is_an_error_and_nothing_is_written(seed):
    rng = np.random.default_rng(seed)
    q, kc, vc, _, _ = small(rng)
    kn, vn = (rng.standard_normal((2, 3, 2, 32)).astype(np.float32) for _ in range(2))
    before = kc.copy(), vc.copy()
    with pytest.raises(ValueError, match=r"^cache_seqlens: sequence 1 holds 8 keys; appending 3 "
                                         r"new ones needs 11 slots, but the cache holds 10"):
        flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=np.array([7, 8], np.int32))
    assert np.array_equal(kc, before[0]) and np.array_equal(vc, before[1])
    with pytest.raises(ValueError, match=r"^cache_seqlens: sequence 0 holds 8 keys"):
        flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=8)
    # Paged: the capacity is pages_per_seq * page_size.
    pages = rng.standard_normal((6, 4, 2, 32)).astype(np.float32)
    table = np.array([[0, 1], [2, 3]], np.int32)
    with pytest.raises(ValueError, match=r"needs 9 slots, but the cache holds 8"):
        flash_attn_with_kvcache(q, pages, pages.copy(), kn, vn, cache_seqlens=lengths(2, 6),
                                block_table=table)


@pytest.mark.parametrize("bad,match", [
    (dict(cache_seqlens=np.array([-1, 0], np.int32)), r"^cache_seqlens: entry 0 is negative"),
    (dict(cache_seqlens=np.array([1, 2], np.int64)), r"^cache_seqlens: dtype int64"),
    (dict(cache_seqlens=np.array([1, 2, 3], np.int32)), r"^cache_seqlens: has 3 entries"),
    (dict(cache_batch_idx=np.array([0, 2], np.int32)),
     r"^cache_batch_idx: entry 1 is 2, outside the 2 rows of k_cache"),
    (dict(rotary=(8, 16)), r"^rotary_cos: has 8 positions, but sequence \d rotates position"),
    (dict(rotary=(20, 17)), r"^rotary_cos: rotary_dim \(2 x 17 columns\) must be in \[2, head_dim"),
    (dict(only_k=True), r"^k: k and v must be given together"),
    (dict(k_dtype=np.float16), r"^k: dtype float16 differs from k_cache's float32"),
    (dict(k_heads=4), r"^k: shape \[2, 1, 4, 32\] does not match"),
    (dict(k_in_cache=True), r"^k: overlaps k_cache in memory"),
    (dict(cache_batch=3), r"^k_cache: batch 3 differs from the batch of 2"),
    (dict(both_maps=True), r"^cache_batch_idx: cannot be combined with block_table"),
    (dict(cache_leftpad=np.zeros(2, np.int32)), r"^cache_leftpad"),
])
def test_bad_inputs(seed, bad, match):
    rng = np.random.default_rng(seed)
    q, kc, vc, kn, vn = small(rng)
    kwargs = dict(cache_seqlens=lengths(2, 4))
    if "cache_seqlens" in bad:
        kwargs["cache_seqlens"] = bad["cache_seqlens"]
    if "cache_batch_idx" in bad:
        kwargs["cache_batch_idx"] = bad["cache_batch_idx"]
    if "rotary" in bad:
        s_rot, cols = bad["rotary"]
        kwargs["rotary_cos"] = rng.standard_normal((s_rot, cols)).astype(np.float32)
        kwargs["rotary_sin"] = rng.standard_normal((s_rot, cols)).astype(np.float32)
        kwargs["cache_seqlens"] = lengths(2, 8)
    if bad.get("only_k"):
        vn = None
    if "k_dtype" in bad:
        kn = kn.astype(bad["k_dtype"])
    if "k_heads" in bad:
        kn = rng.standard_normal((2, 1, bad["k_heads"], 32)).astype(np.float32)
    if bad.get("k_in_cache"):
        kn = kc[:, 8:9]
    if "cache_batch" in bad:
        kc = rng.standard_normal((3, 10, 2, 32)).astype(np.float32)
        vc = kc.copy()
    if bad.get("both_maps"):
        kwargs["cache_batch_idx"] = np.array([0, 1], np.int32)
        kwargs["block_table"] = np.array([[0], [1]], np.int32)
    if "cache_leftpad" in bad:
        kwargs["cache_leftpad"] = bad["cache_leftpad"]
    k_before = kc.copy()
    with pytest.raises((ValueError, NotImplementedError), match=match):
        flash_attn_with_kvcache(q, kc, vc, kn, vn, **kwargs)
    assert np.array_equal(kc, k_before), "a refused call wrote to the cache"


def test_attention_errors_come_before_the_append_and_name_the_cache(seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 1, 6, 32)).astype(np.float32)  # 6 heads over 4 KV heads
    kc, vc = (rng.standard_normal((2, 10, 4, 32)).astype(np.float32) for _ in range(2))
    kn, vn = (rng.standard_normal((2, 1, 4, 32)).astype(np.float32) for _ in range(2))
    before = kc.copy()
    with pytest.raises(ValueError, match=r"^k_cache: h_q \(6\) must be a multiple of h_kv \(4\)"):
        flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=3)
    assert np.array_equal(kc, before), "the cache was written before the call was refused"
    with pytest.raises(ValueError, match=r"^softmax_scale: 0 is not supported"):
        flash_attn_with_kvcache(q[:, :, :4], kc, vc, kn, vn, cache_seqlens=3, softmax_scale=0.0)
    assert np.array_equal(kc, before)


def test_paged_block_table_entry_outside_the_pool(seed):
    rng = np.random.default_rng(seed)
    q, _, _, kn, vn = small(rng)
    pages = rng.standard_normal((4, 4, 2, 32)).astype(np.float32)
    table = np.array([[0, 1], [2, 9]], np.int32)  # sequence 1 appends at 4: page index 1 -> 9
    with pytest.raises(ValueError, match=r"^block_table: entry \[1, 1\] is 9, outside the pool "
                                         r"of 4 pages"):
        flash_attn_with_kvcache(q, pages, pages.copy(), kn, vn, cache_seqlens=lengths(2, 4),
                                block_table=table)


def test_bad_page_before_the_append_is_refused_before_the_cache_is_written(seed):
    # The append writes page 1 of sequence 0 (position 5, valid); the attention that follows reads
    # page 0 too, whose entry is outside the pool: refused before either call touches the cache.
    rng = np.random.default_rng(seed)
    q, _, _, kn, vn = small(rng)
    kp, vp = (rng.standard_normal((4, 4, 2, 32)).astype(np.float32) for _ in range(2))
    table = np.array([[7, 1], [2, 3]], np.int32)
    before = kp.copy(), vp.copy()
    with pytest.raises(ValueError, match=r"^block_table: entry \[0, 0\] is 7, outside the pool "
                                         r"of 4 pages"):
        flash_attn_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=np.array([5, 6], np.int32),
                                block_table=table)
    assert np.array_equal(kp, before[0]) and np.array_equal(vp, before[1]), \
        "the cache was written before the call was refused"


# ---------------------------------------------------------------- num_splits, packed variants

@pytest.mark.parametrize("fn", [flash_attn_func, flash_attn_varlen_func, flash_attn_qkvpacked_func,
                                flash_attn_kvpacked_func, flash_attn_varlen_qkvpacked_func,
                                flash_attn_varlen_kvpacked_func, flash_attn_with_kvcache])
def test_num_splits_defaults_to_automatic(fn):
    assert inspect.signature(fn).parameters["num_splits"].default == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_default_num_splits_gives_the_same_results(seed, dtype):
    """Decode over a long cache, where the automatic choice splits on the CPU: the default call is
    the explicit num_splits=0 call bit for bit, and both it and num_splits=1 are within the
    reference tolerance."""
    rng = np.random.default_rng(seed)
    b, sk, h, hk, d = 2, 3000, 8, 2, 64
    q = rng.standard_normal((b, 1, h, d)).astype(dtype)
    k, v = (rng.standard_normal((b, sk, hk, d)).astype(dtype) for _ in range(2))
    default, lse = flash_attn_func(q, k, v, return_lse=True)
    auto = flash_attn_func(q, k, v, num_splits=0)
    single = flash_attn_func(q, k, v, num_splits=1)
    assert np.array_equal(default, auto)
    for i in range(b):
        exact, exact_lse = attention(q[i], k[i], v[i], 1 / 8)
        naive, _ = attention(q[i], k[i], v[i], 1 / 8, low_precision=dtype)
        check_close(default[i], exact, naive, FLOOR[dtype])
        check_close(single[i], exact, naive, FLOOR[dtype])
        check_lse(lse[i], exact_lse)


def test_packed_variants_match_the_unpacked_calls(seed):
    rng = np.random.default_rng(seed)
    b, s, h, d = 2, 19, 4, 32
    qkv = rng.standard_normal((b, s, 3, h, d)).astype(np.float32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    ref = flash_attn_func(q.copy(), k.copy(), v.copy(), causal=True)
    assert np.array_equal(flash_attn_qkvpacked_func(qkv, causal=True), ref)
    kv = np.ascontiguousarray(qkv[:, :, 1:])
    assert np.array_equal(flash_attn_kvpacked_func(q, kv, causal=True), ref)
    cu = np.array([0, s, 2 * s], np.int32)
    packed = qkv.reshape(b * s, 3, h, d)
    out = flash_attn_varlen_qkvpacked_func(packed, cu, s, causal=True)
    assert np.array_equal(out.reshape(b, s, h, d), ref)
    out = flash_attn_varlen_kvpacked_func(packed[:, 0], np.ascontiguousarray(packed[:, 1:]), cu,
                                          cu, s, s, causal=True)
    assert np.array_equal(out.reshape(b, s, h, d), ref)


def test_exports():
    for name in ("flash_attn_with_kvcache", "flash_attn_qkvpacked_func", "register_torch"):
        assert name in flashserve.__all__
