"""Issue 9 for flash_attn_with_kvcache (and the arguments every function shares), as a careless user
would call it: caches split from one tensor (accepted when their elements are disjoint, refused
when they alias), two sequences appending to one cache row or one paged slot (refused before
anything is written), read-only caches, booleans and floats where integers go, a batch mismatch
named in the caller's terms, and the NaN/inf rule through the append and the attention. Results are
checked against the float64 reference of attention_reference.py on fresh random inputs."""

import math
import os
import signal
import time

import numpy as np
import pytest

from flashserve import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from attention_reference import attention, check_close, check_lse

FLOOR = {np.float32: 2e-6, np.float16: 2.5e-4}


def randn(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def reference(q, keys, values, causal=False, window=(-1, -1)):
    """out, lse of one sequence in float64 and in a naive float32 emulation (check_close's bound)."""
    scale = 1 / math.sqrt(q.shape[-1])
    exact = attention(q.astype(np.float64), keys.astype(np.float64), values.astype(np.float64),
                      scale, causal, window)
    naive = attention(q, keys, values, scale, causal, window, low_precision=q.dtype.type)
    return exact, naive


def paged_keys(k_cache, v_cache, table_row, n, k_new, v_new):
    """A sequence's keys and values after an append: its first n from the paged caches (page
    table_row[j // page], row j % page), then the new ones."""
    page = k_cache.shape[1]
    slots = [(table_row[j // page], j % page) for j in range(n)]
    keys = np.concatenate([np.stack([k_cache[p, r] for p, r in slots]), k_new])
    values = np.concatenate([np.stack([v_cache[p, r] for p, r in slots]), v_new])
    return keys, values


# ---------------------------------------------------------------- caches split from one tensor

@pytest.mark.parametrize("split", ["kv_dim", "head_dim"])
def test_interleaved_kv_cache_from_one_tensor_is_accepted(seed, split):
    """kv = empty(B, S, 2, H, D); k_cache, v_cache = kv[:, :, 0], kv[:, :, 1] (FlashAttention
    accepts it): the views touch disjoint elements. The append writes each half, the attention
    reads the right one, and the other half's slots are untouched."""
    rng = np.random.default_rng(seed)
    b, cap, hk, h, d, s_new = 2, 12, 2, 4, 16, 2
    if split == "kv_dim":
        kv = randn(rng, (b, cap, 2, hk, d))
        kc, vc = kv[:, :, 0], kv[:, :, 1]
    else:  # the K and V of a head side by side in one row
        kv = randn(rng, (b, cap, hk, 2 * d))
        kc, vc = kv[..., :d], kv[..., d:]
    k_before, v_before = kc.copy(), vc.copy()
    q = randn(rng, (b, 1, h, d))
    kn, vn = randn(rng, (b, s_new, hk, d)), randn(rng, (b, s_new, hk, d))
    lens = np.array([3, 7], np.int32)
    out, lse = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True,
                                       return_softmax_lse=True)
    for i in range(b):
        n = lens[i]
        assert np.array_equal(kc[i, n:n + s_new], kn[i]) and np.array_equal(vc[i, n:n + s_new],
                                                                            vn[i])
        keys = np.concatenate([k_before[i, :n], kn[i]])
        values = np.concatenate([v_before[i, :n], vn[i]])
        (exact, exact_lse), (naive, _) = reference(q[i], keys, values, causal=True)
        check_close(out[i], exact, naive, FLOOR[np.float32], f"sequence {i}")
        check_lse(lse[i], exact_lse)
    written = np.zeros(kc.shape[:2], bool)
    for i in range(b):
        written[i, lens[i]:lens[i] + s_new] = True
    assert np.array_equal(kc[~written], k_before[~written])
    assert np.array_equal(vc[~written], v_before[~written])


def test_interleaved_paged_cache_is_accepted(seed):
    rng = np.random.default_rng(seed)
    pages, page, hk, h, d = 6, 4, 2, 4, 32
    kv = randn(rng, (pages, page, 2, hk, d))
    kc, vc = kv[:, :, 0], kv[:, :, 1]
    k_before, v_before = kc.copy(), vc.copy()
    table = np.array([[4, 1], [0, 5]], np.int32)
    lens = np.array([3, 5], np.int32)
    q = randn(rng, (2, 2, h, d))
    kn, vn = randn(rng, (2, 2, hk, d)), randn(rng, (2, 2, hk, d))
    out = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, block_table=table,
                                  causal=True)
    for i in range(2):
        keys, values = paged_keys(k_before, v_before, table[i], lens[i], kn[i], vn[i])
        (exact, _), (naive, _) = reference(q[i], keys, values, causal=True)
        check_close(out[i], exact, naive, FLOOR[np.float32], f"sequence {i}")


@pytest.mark.parametrize("alias", ["same", "shifted_head", "shifted_element", "k_new_in_v_cache"])
def test_caches_that_share_elements_are_refused(seed, alias):
    rng = np.random.default_rng(seed)
    q = randn(rng, (2, 1, 4, 16))
    kn, vn = randn(rng, (2, 1, 2, 16)), randn(rng, (2, 1, 2, 16))
    kv = randn(rng, (2, 10, 3, 2, 16))
    kc, vc = kv[:, :, 0], kv[:, :, 1]
    match = r"^v_cache: overlaps k_cache in memory"
    if alias == "same":
        vc = kc
    elif alias == "shifted_head":  # v's head 0 is k's head 1
        flat = kv.reshape(2, 10, 6, 16)
        kc, vc = flat[:, :, 0:2], flat[:, :, 1:3]
    elif alias == "shifted_element":  # one element of overlap per row
        flat = kv.reshape(2, 10, 96)
        kc, vc = flat[:, :, :32].reshape(2, 10, 2, 16), flat[:, :, 31:63].reshape(2, 10, 2, 16)
        match = r"^(v_cache|k_cache): "  # numpy may copy a reshape; then the views are disjoint
    else:
        kn = vc[:, 5:6]
        match = r"^k: overlaps v_cache in memory"
    before = kv.copy()
    with pytest.raises(ValueError, match=match):
        flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=2)
    assert np.array_equal(kv, before), "a refused call wrote to the cache"


def test_packed_qkv_slices_are_disjoint_inputs_and_outputs_may_interleave_with_nothing(seed):
    """flash_attn_qkvpacked's slices are inputs (read only): fine. An output can never share an
    element with an input, even when the ranges cross."""
    rng = np.random.default_rng(seed)
    qkv = randn(rng, (1, 9, 3, 2, 16))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    out = flash_attn_func(q, k, v, causal=True)
    (exact, _), (naive, _) = reference(q[0].copy(), k[0].copy(), v[0].copy(), causal=True)
    check_close(out[0], exact, naive, FLOOR[np.float32])


# ---------------------------------------------------------------- two writers, one slot

def test_duplicate_cache_batch_idx_with_an_append_is_refused(seed):
    rng = np.random.default_rng(seed)
    q = randn(rng, (3, 1, 4, 16))
    kc, vc = randn(rng, (4, 10, 2, 16)), randn(rng, (4, 10, 2, 16))
    kn, vn = randn(rng, (3, 1, 2, 16)), randn(rng, (3, 1, 2, 16))
    before = kc.copy(), vc.copy()
    # Different lengths: the appended slots differ, but each sequence would write into the
    # other's history (a contiguous row is one sequence's whole cache).
    with pytest.raises(ValueError, match=r"^cache_batch_idx: entries 0 and 2 are both row 3: two "
                                         r"sequences would append to one cache row"):
        flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=np.array([2, 4, 6], np.int32),
                                cache_batch_idx=np.array([3, 1, 3], np.int32))
    assert np.array_equal(kc, before[0]) and np.array_equal(vc, before[1])


def test_duplicate_cache_batch_idx_without_an_append_is_a_shared_read(seed):
    """Reading one row from two sequences (beams over one prompt) writes nothing: accepted."""
    rng = np.random.default_rng(seed)
    q = randn(rng, (2, 3, 4, 16))
    kc, vc = randn(rng, (3, 10, 2, 16)), randn(rng, (3, 10, 2, 16))
    lens = np.array([4, 9], np.int32)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                  cache_batch_idx=np.array([2, 2], np.int32), causal=True)
    for i in range(2):
        (exact, _), (naive, _) = reference(q[i], kc[2, :lens[i]], vc[2, :lens[i]], causal=True)
        check_close(out[i], exact, naive, FLOOR[np.float32], f"sequence {i}")


@pytest.mark.parametrize("case", ["two_sequences", "one_sequence_twice"])
def test_paged_append_writing_one_slot_twice_is_refused(seed, case):
    rng = np.random.default_rng(seed)
    pages = randn(rng, (6, 4, 2, 16))
    vpages = randn(rng, (6, 4, 2, 16))
    if case == "two_sequences":  # both append at row 3 of page 2
        q, kn, vn = randn(rng, (2, 1, 4, 16)), randn(rng, (2, 1, 2, 16)), randn(rng, (2, 1, 2, 16))
        table, lens = np.array([[0, 2], [2, 1]], np.int32), np.array([7, 3], np.int32)
        match = (r"^block_table: entries \[0, 1\] and \[1, 0\] are both page 2, and both append "
                 r"to its row 3")
    else:  # 5 new tokens from position 2: page 3 rows 2, 3 via entry 0, rows 0-2 via entry 1
        q, kn, vn = randn(rng, (1, 1, 4, 16)), randn(rng, (1, 5, 2, 16)), randn(rng, (1, 5, 2, 16))
        table, lens = np.array([[3, 3]], np.int32), np.array([2], np.int32)
        match = r"^block_table: entries \[0, 1\] and \[0, 0\] are both page 3"
    before = pages.copy(), vpages.copy()
    with pytest.raises(ValueError, match=match):
        flash_attn_with_kvcache(q, pages, vpages, kn, vn, cache_seqlens=lens, block_table=table)
    assert np.array_equal(pages, before[0]) and np.array_equal(vpages, before[1])


def test_paged_shared_prefix_page_with_distinct_slots_is_accepted(seed):
    """Two sequences share page 0 (a cached prompt of 4 tokens) and append to their own pages,
    and a third pair of writers share page 5 at distinct rows: no slot is written twice."""
    rng = np.random.default_rng(seed)
    page, hk, h, d = 4, 2, 4, 16
    kp, vp = randn(rng, (6, page, hk, d)), randn(rng, (6, page, hk, d))
    k_before, v_before = kp.copy(), vp.copy()
    table = np.array([[0, 1], [0, 2], [3, 5], [4, 5]], np.int32)
    lens = np.array([4, 4, 4, 6], np.int32)  # the last two write rows 0-1 and 2-3 of page 5
    q = randn(rng, (4, 2, h, d))
    kn, vn = randn(rng, (4, 2, hk, d)), randn(rng, (4, 2, hk, d))
    out = flash_attn_with_kvcache(q, kp, vp, kn, vn, cache_seqlens=lens, block_table=table,
                                  causal=True)
    for i in range(4):
        keys, values = paged_keys(k_before, v_before, table[i], lens[i], kn[i], vn[i])
        if i == 3:  # sequence 3 reads page 5 rows 0-1... which sequence 2 has just written
            keys[4:6], values[4:6] = kn[2], vn[2]
        (exact, _), (naive, _) = reference(q[i], keys, values, causal=True)
        check_close(out[i], exact, naive, FLOOR[np.float32], f"sequence {i}")


# ---------------------------------------------------------------- read-only caches

def test_read_only_cache_is_refused_when_appending_and_read_when_not(seed):
    rng = np.random.default_rng(seed)
    q = randn(rng, (2, 1, 4, 16))
    kc, vc = randn(rng, (2, 10, 2, 16)), randn(rng, (2, 10, 2, 16))
    kn, vn = randn(rng, (2, 1, 2, 16)), randn(rng, (2, 1, 2, 16))
    kc.flags.writeable = False  # e.g. a read-only np.memmap: writing it would fault
    before = kc.copy()
    with pytest.raises(ValueError, match=r"^k_cache: is read-only, but k and v are appended"):
        flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=3)
    assert np.array_equal(kc, before)
    ro = np.frombuffer(bytes(vc.tobytes()), np.float32).reshape(vc.shape)
    with pytest.raises(ValueError, match=r"^v_cache: is read-only"):
        flash_attn_with_kvcache(q, vc.copy(), ro, kn, vn, cache_seqlens=3)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=3)  # no append: reading is fine
    (exact, _), (naive, _) = reference(q[0], kc[0, :3], vc[0, :3])
    check_close(out[0], exact, naive, FLOOR[np.float32])


# ---------------------------------------------------------------- careless scalars

def small(rng):
    return (randn(rng, (2, 1, 4, 16)), randn(rng, (2, 10, 2, 16)), randn(rng, (2, 10, 2, 16)),
            randn(rng, (2, 1, 2, 16)), randn(rng, (2, 1, 2, 16)))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(cache_seqlens=True), TypeError, r"^cache_seqlens: expected an integer, got bool"),
    (dict(cache_seqlens=np.float32(3)), ValueError, r"^cache_seqlens: expected rank 1"),
    (dict(num_splits=True), TypeError, r"^num_splits: expected an integer, got bool"),
    (dict(num_splits=2.0), TypeError, r"^num_splits: expected an integer, got float"),
    (dict(window_size=(True, False)), ValueError, r"^window_size: expected a pair of integers"),
    (dict(causal="False"), TypeError, r"^causal: expected a bool, got str 'False'"),
    (dict(causal=2), TypeError, r"^causal: expected a bool, got int 2"),
    (dict(rotary_interleaved="no"), TypeError, r"^rotary_interleaved: expected a bool"),
    (dict(softmax_scale="0.1"), TypeError, r"^softmax_scale: expected a real number or None, "
                                           r"got str"),
    (dict(softmax_scale=1j), TypeError, r"^softmax_scale: expected a real number or None"),
    (dict(softcap=float("nan")), ValueError, r"^softcap: must be finite"),
    (dict(softcap=-1.0), ValueError, r"^softcap: must be 0 \(off\) or a normal float32"),
    (dict(softcap="30"), TypeError, r"^softcap: expected a real number"),
    (dict(softcap=1e-50), ValueError, r"^softcap: 1e-50 is below float32's range"),
    (dict(alibi_slopes=np.ones(3, np.float32)), ValueError,
     r"^alibi_slopes: shape \[3\] is neither \[h_q\] = \[4\]"),
    (dict(alibi_slopes=np.ones(4, np.float64)), ValueError,
     r"^alibi_slopes: expected float32, got float64"),
    (dict(return_softmax_lse="yes"), TypeError, r"^return_softmax_lse: expected a bool"),
    (dict(cache_seqlens=np.array([3, 4], dtype=object)), ValueError,
     r"^cache_seqlens: dtype '\|O' is not supported"),
])
def test_careless_scalars_are_refused_by_name(seed, kwargs, error, match):
    rng = np.random.default_rng(seed)
    q, kc, vc, kn, vn = small(rng)
    kwargs.setdefault("cache_seqlens", 3)
    before = kc.copy()
    with pytest.raises(error, match=match):
        flash_attn_with_kvcache(q, kc, vc, kn, vn, **kwargs)
    assert np.array_equal(kc, before)


def test_flags_accept_bools_numpy_bools_and_0_1(seed):
    rng = np.random.default_rng(seed)
    q = randn(rng, (1, 5, 2, 16))
    ref = flash_attn_func(q, q, q, causal=True)
    for flag in (np.bool_(True), 1):
        assert np.array_equal(flash_attn_func(q, q, q, causal=flag), ref)
    with pytest.raises(TypeError, match=r"^causal: expected a bool, got str"):
        flash_attn_func(q, q, q, causal="yes")
    cu = np.array([0, 5], np.int32)
    with pytest.raises(TypeError, match=r"^causal: "):
        flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 5, 5, causal=None)


@pytest.mark.parametrize("who", ["k", "cache_seqlens"])
def test_batch_mismatch_with_q_names_q_not_an_internal_buffer(seed, who):
    """flashserve sizes the lengths it writes (seqlens_out) from q: a q whose batch differs from
    the other arguments' is named as q, never as a buffer the caller did not pass."""
    rng = np.random.default_rng(seed)
    _, kc, vc, kn, vn = small(rng)
    q = randn(rng, (3, 1, 4, 16))
    kwargs = dict(cache_seqlens=3) if who == "k" else dict(cache_seqlens=np.array([1, 2],
                                                                                  np.int32))
    args = (kn, vn) if who == "k" else (None, None)
    with pytest.raises(ValueError, match=r"^q: has 3 entries in dimension 0 for a batch of 2"):
        flash_attn_with_kvcache(q, kc, vc, *args, **kwargs)


# ---------------------------------------------------------------- NaN and infinity

@pytest.mark.parametrize("dtype,poison", [
    (dtype, poison) for dtype in (np.float32, np.float16)
    for poison in ("q", "cached_key", "new_key", "overflow")
    if not (poison == "overflow" and dtype == np.float16)])  # 1e30 is inf in float16
def test_nan_rule_through_the_kvcache_append(seed, dtype, poison):
    """The rule of docs/hardening.md through flash_attn_with_kvcache: a NaN in q or in a key a row
    sees (already cached or just appended), or a score overflowing to +inf, makes that row's output
    and lse NaN; rows that see no key (causal, 4 queries over 2 keys) stay zero / -inf; every other
    row matches the reference."""
    rng = np.random.default_rng(seed)
    b, sq, h, hk, d, cap = 2, 4, 4, 2, 32, 16
    q = randn(rng, (b, sq, h, d), dtype)
    kc, vc = randn(rng, (b, cap, hk, d), dtype), randn(rng, (b, cap, hk, d), dtype)
    kn, vn = randn(rng, (b, 1, hk, d), dtype), randn(rng, (b, 1, hk, d), dtype)
    lens = np.array([1, 9], np.int32)  # sequence 0: 2 keys after the append, 4 queries
    nan_rows = np.zeros((b, sq, h), bool)
    if poison == "q":
        q[1, 2, 3, 5] = np.nan
        nan_rows[1, 2, 3] = True
        q[0, 0, 0, 0] = np.nan  # a row that sees no key: stays zero
    elif poison == "cached_key":  # key 4 of sequence 1, KV head 1: every query sees it
        kc[1, 4, 1, 7] = np.nan
        nan_rows[1, :, 2:4] = True
    elif poison == "new_key":  # the appended key (1) of sequence 0: only its last query sees it
        kn[0, 0, 0, 3] = np.nan
        nan_rows[0, 3, 0:2] = True
    else:  # q row (1, 3, 1) = 1e30, key 2 of sequence 1 = 1e30: the score overflows float32
        q[1, 3, 1] = 1e30
        kc[1, 2, 0] = 1e30
        nan_rows[1, 3, 1] = True
    k_before, v_before = kc.copy(), vc.copy()
    out, lse = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True,
                                       return_softmax_lse=True)
    lse = lse.transpose(0, 2, 1)  # (b, sq, h)
    assert np.array_equal(np.isnan(out).all(-1), nan_rows), "NaN rows"
    assert not np.isnan(out[~nan_rows]).any(), "NaN outside the planned rows"
    assert np.array_equal(np.isnan(lse), nan_rows), "NaN lse"
    # Sequence 0's first two queries see no key (4 queries, 2 keys, causal).
    assert np.array_equal(out[0, :2], np.zeros_like(out[0, :2]))
    assert np.isneginf(lse[0, :2]).all()
    for i in range(b):
        n = lens[i]
        keys = np.concatenate([k_before[i, :n], kn[i]])
        values = np.concatenate([v_before[i, :n], vn[i]])
        (exact, _), (naive, _) = reference(q[i], keys, values, causal=True)
        keep = ~nan_rows[i]
        got = np.where(keep[..., None], out[i].astype(np.float64), 0)
        check_close(got, np.where(keep[..., None], exact, 0), np.where(keep[..., None], naive, 0),
                    FLOOR[dtype], f"sequence {i}")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_extreme_finite_values_subnormals_and_negative_zero(seed, dtype):
    """Huge finite q (1e30 in float32, 3e4 in float16) against small keys, subnormal keys, and
    -0.0 everywhere in one head: finite results equal to the reference (no spurious NaN or
    -inf), and a -0.0 query is a zero query (uniform attention)."""
    rng = np.random.default_rng(seed)
    b, s, h, d = 1, 7, 3, 16
    q, k, v = (randn(rng, (b, s, h, d), dtype) for _ in range(3))
    big = 1e30 if dtype == np.float32 else 1e4
    q[0, :, 0] = np.clip(q[0, :, 0].astype(np.float64) * big, -6e4, 6e4).astype(dtype)
    k[0, :, 0] /= big if dtype == np.float32 else 1.0  # scores stay O(1) x d in float32
    tiny = np.finfo(dtype).smallest_subnormal
    k[0, :, 1] = tiny * rng.integers(-3, 4, (s, d))
    q[0, :, 2] = -0.0
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    (exact, exact_lse), (naive, _) = reference(q[0], k[0], v[0], causal=True)
    check_close(out[0], exact, naive, FLOOR[dtype])
    check_lse(lse[0], exact_lse, 1e-3 if dtype == np.float16 else 1e-5,
              1e-2 if dtype == np.float16 else 1e-4)
    # Head 2: every score is 0, so each query averages the values it sees.
    expect = np.cumsum(v[0, :, 2].astype(np.float64), 0) / np.arange(1, s + 1)[:, None]
    assert np.allclose(out[0, :, 2], expect, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("num_splits", [0, 3])
def test_nan_rule_with_split_kv(seed, dtype, num_splits):
    """Decode over a long cache, split-KV: the default num_splits=0 (one sequence, one KV head: a
    single tile, which the CPU splits when it has two or more workers) and an explicit 3 with two
    KV heads. A NaN key in a late split makes exactly the rows of its KV head NaN (output and lse);
    the clean call, and the other head, match the reference."""
    rng = np.random.default_rng(seed)
    hk = 1 if num_splits == 0 else 2
    b, h, d, cap, n = 1, 4, 64, 4200, 4000
    q = randn(rng, (b, 1, h, d), dtype)
    kc, vc = randn(rng, (b, cap, hk, d), dtype), randn(rng, (b, cap, hk, d), dtype)
    kn, vn = randn(rng, (b, 1, hk, d), dtype), randn(rng, (b, 1, hk, d), dtype)
    lse_tol = (2e-3, 2e-3) if dtype == np.float16 else (1e-5, 1e-4)
    keys = np.concatenate([kc[0, :n], kn[0]])
    values = np.concatenate([vc[0, :n], vn[0]])
    (exact, exact_lse), (naive, _) = reference(q[0], keys, values)
    out, lse = flash_attn_with_kvcache(q, kc.copy(), vc.copy(), kn, vn, cache_seqlens=n,
                                       num_splits=num_splits, return_softmax_lse=True)
    check_close(out[0], exact, naive, FLOOR[dtype])
    check_lse(lse[0], exact_lse, *lse_tol)
    kc[0, 3100, hk - 1, 9] = np.nan  # a late split of the last KV head
    out, lse = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=n,
                                       num_splits=num_splits, return_softmax_lse=True)
    poisoned = slice(h - h // hk, h)
    assert np.isnan(out[0, 0, poisoned]).all() and np.isnan(lse[0, poisoned]).all()
    clean = slice(0, h - h // hk)
    assert not np.isnan(out[0, 0, clean]).any() and not np.isnan(lse[0, clean]).any()
    if hk > 1:
        check_close(out[0, :, clean], exact[:, clean], naive[:, clean], FLOOR[dtype])
        check_lse(lse[0, clean], exact_lse[clean], *lse_tol)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_kvcache_append_in_a_forked_child(seed):
    """The fork-safety of issue 9 on the KV-cache path: after a multi-tile, split-KV append and
    attention in the parent, a forked child appends to its own (copy-on-write) cache and gets the
    same cache and output as the parent did; a child that hangs is killed and fails the test."""
    rng = np.random.default_rng(seed)
    q = randn(rng, (2, 1, 8, 64))
    kc, vc = randn(rng, (2, 3000, 2, 64)), randn(rng, (2, 3000, 2, 64))
    kn, vn = randn(rng, (2, 1, 2, 64)), randn(rng, (2, 1, 2, 64))
    kc2, vc2 = kc.copy(), vc.copy()
    lens = np.array([2500, 2990], np.int32)
    parent = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens)
    pid = os.fork()
    if pid == 0:  # the child: nothing of pytest's may run here
        code = 1
        try:
            child = flash_attn_with_kvcache(q, kc2, vc2, kn, vn, cache_seqlens=lens)
            same = np.array_equal(child, parent) and np.array_equal(kc2, kc) and \
                np.array_equal(vc2, vc)
            code = 0 if same else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    status = None
    while time.monotonic() < deadline:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            status = os.waitstatus_to_exitcode(raw)
            break
        time.sleep(0.01)
    if status is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert status is not None, "the child's call did not return within 60 s"
    assert status == 0, "the child's cache or output differs from the parent's"


def test_negative_strides_are_copied_for_inputs_and_refused_for_caches(seed):
    """A reversed NumPy view (q[:, ::-1]) is an input like any other: copied, as a non-contiguous
    last dimension is. A reversed cache cannot be copied (the append would be lost): refused,
    naming it."""
    rng = np.random.default_rng(seed)
    q, k, v = (randn(rng, (2, 9, 2, 16)) for _ in range(3))
    out = flash_attn_func(q[:, ::-1], k[::-1], v, causal=True)
    assert np.array_equal(out, flash_attn_func(q[:, ::-1].copy(), k[::-1].copy(), v, causal=True))
    (exact, _), (naive, _) = reference(q[0, ::-1].copy(), k[1], v[0], causal=True)
    check_close(out[0], exact, naive, FLOOR[np.float32])
    qk, kc, vc, kn, vn = small(rng)
    with pytest.raises(ValueError, match=r"^k_cache: negative stride"):
        flash_attn_with_kvcache(qk, kc[::-1], vc, kn, vn, cache_seqlens=3)
