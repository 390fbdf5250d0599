"""flashserve's FlashAttention-style API on NumPy arrays (the CPU path), against the float64 NumPy
reference in attention_reference.py, on fresh random inputs with poisoned outputs (conftest.py)."""

import gc
import math
import sys

import numpy as np
import pytest

import flashserve
from flashserve import flash_attn_func, flash_attn_varlen_func
from attention_reference import attention, check_close, check_lse

FLOOR = {np.float32: 1e-6, np.float16: 2.5e-4}  # about the rounding of an output of size 0.3


def floor_for(dtype, head_dim):
    """In float32 the naive reference is as exact as the kernel but for the length-head_dim dot
    products, which NumPy's BLAS sums in blocks and a streaming kernel sums in longer runs: that
    rounding grows with head_dim (seen: 3.5e-6 at d = 256 against a naive 8e-7, about 1 run in 80
    of the d = 256 cases), so the float32 floor scales with it from the 1e-6 set at d = 64."""
    return FLOOR[dtype] * max(1.0, head_dim / 64) if dtype == np.float32 else FLOOR[dtype]


def randn(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def dense_reference(q, k, v, scale, causal, window, dtype):
    """Per batch element; returns (exact out, exact lse [b, h, sq], naive low-precision out)."""
    outs, lses, naives = [], [], []
    for b in range(q.shape[0]):
        o, l = attention(q[b], k[b], v[b], scale, causal, window)
        n, _ = attention(q[b], k[b], v[b], scale, causal, window, low_precision=dtype)
        outs.append(o), lses.append(l), naives.append(n)
    return np.stack(outs), np.stack(lses), np.stack(naives)


DENSE_SHAPES = [  # batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim
    (2, 17, 33, 4, 4, 64),
    (1, 33, 17, 8, 2, 32),  # seqlen_q > seqlen_k: causal leaves the first rows with no key
    (3, 1, 127, 8, 1, 128),  # decode, MQA
    (1, 40, 40, 4, 1, 256),  # GQA 4
]
MASKS = [  # causal, window_size
    (False, (-1, -1)),
    (True, (-1, -1)),
    (False, (5, 3)),
    (True, (7, -1)),  # sliding window, causal
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", DENSE_SHAPES)
@pytest.mark.parametrize("causal,window", MASKS)
def test_dense_matches_reference(seed, dtype, shape, causal, window):
    rng = np.random.default_rng(seed)
    b, sq, sk, h, hk, d = shape
    q, k, v = randn(rng, (b, sq, h, d), dtype), randn(rng, (b, sk, hk, d), dtype), \
        randn(rng, (b, sk, hk, d), dtype)
    out, lse = flash_attn_func(q, k, v, causal=causal, window_size=window, return_lse=True)
    assert isinstance(out, np.ndarray) and out.dtype == dtype and out.shape == (b, sq, h, d)
    assert isinstance(lse, np.ndarray) and lse.dtype == np.float32 and lse.shape == (b, h, sq)
    ref, ref_lse, naive = dense_reference(q, k, v, 1 / math.sqrt(d), causal, window, dtype)
    check_close(out, ref, naive, floor_for(dtype, d))
    check_lse(lse, ref_lse)
    # Without return_lse only the output comes back, and it is the same.
    again = flash_attn_func(q, k, v, causal=causal, window_size=window)
    assert np.array_equal(again, out)


def test_fully_masked_rows_are_zero_with_lse_minus_inf(seed):
    # causal with seqlen_q > seqlen_k: query t sees keys up to t - (seqlen_q - seqlen_k).
    rng = np.random.default_rng(seed)
    q, k, v = randn(rng, (2, 9, 2, 16), np.float32), randn(rng, (2, 4, 2, 16), np.float32), \
        randn(rng, (2, 4, 2, 16), np.float32)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert np.all(out[:, :5] == 0.0) and np.all(np.isneginf(lse[:, :, :5]))
    assert np.all(np.isfinite(lse[:, :, 5:])) and np.abs(out[:, 5:]).max() > 0


def test_softmax_scale_and_value_head_dim(seed):
    rng = np.random.default_rng(seed)
    q, k = randn(rng, (2, 11, 4, 64), np.float32), randn(rng, (2, 13, 2, 64), np.float32)
    v = randn(rng, (2, 13, 2, 32), np.float32)  # head_dim_v != head_dim
    out, lse = flash_attn_func(q, k, v, softmax_scale=0.3, causal=True, return_lse=True)
    assert out.shape == (2, 11, 4, 32)
    ref, ref_lse, naive = dense_reference(q, k, v, 0.3, True, (-1, -1), np.float32)
    # Scores 2.4x as wide as the default scale's (0.3 sqrt(64) against 1): the exponentials'
    # rounding grows with them (3 of 3000 seeds passed 1e-6 by up to 1.8e-6), so the floor too.
    check_close(out, ref, naive, FLOOR[np.float32] * 0.3 * math.sqrt(64))
    check_lse(lse, ref_lse)


def pack(rng, lens, heads, dim, dtype):
    """Packed [total, heads, dim] and int32 cu_seqlens for the given lengths."""
    cu = np.zeros(len(lens) + 1, dtype=np.int32)
    cu[1:] = np.cumsum(lens)
    return randn(rng, (int(cu[-1]), heads, dim), dtype), cu


def varlen_reference(q, cu_q, k_seqs, v_seqs, scale, causal, window, dtype, h):
    """k_seqs/v_seqs: the keys and values of each sequence.
    Returns the packed out, lse [h, total] and the naive low-precision out."""
    total = q.shape[0]
    out = np.zeros((total,) + (h, v_seqs[0].shape[-1]))
    naive = np.zeros_like(out)
    lse = np.full((h, total), -np.inf)
    for b in range(len(cu_q) - 1):
        s, e = cu_q[b], cu_q[b + 1]
        o, l = attention(q[s:e], k_seqs[b], v_seqs[b], scale, causal, window)
        n, _ = attention(q[s:e], k_seqs[b], v_seqs[b], scale, causal, window, low_precision=dtype)
        out[s:e], lse[:, s:e], naive[s:e] = o, l, n
    return out, lse, naive


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("causal,window", MASKS)
def test_varlen_with_empty_sequences(seed, dtype, causal, window):
    rng = np.random.default_rng(seed)
    q_lens, kv_lens = [5, 0, 13, 1, 7], [9, 4, 0, 30, 7]  # an empty query set and an empty key set
    h, hk, d = 6, 2, 64
    q, cu_q = pack(rng, q_lens, h, d, dtype)
    k, cu_k = pack(rng, kv_lens, hk, d, dtype)
    v = randn(rng, k.shape, dtype)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, np.int64(max(q_lens)), max(kv_lens),
                                      causal=causal, window_size=window, return_lse=True)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (h, q.shape[0]) and lse.dtype == np.float32
    k_seqs = [k[cu_k[b]:cu_k[b + 1]] for b in range(len(kv_lens))]
    v_seqs = [v[cu_k[b]:cu_k[b + 1]] for b in range(len(kv_lens))]
    ref, ref_lse, naive = varlen_reference(q, cu_q, k_seqs, v_seqs, 1 / math.sqrt(d), causal,
                                           window, dtype, h)
    check_close(out, ref, naive, FLOOR[dtype])
    check_lse(lse, ref_lse)
    # The sequence without keys: zero rows, lse -inf.
    assert np.all(out[cu_q[2]:cu_q[3]] == 0) and np.all(np.isneginf(lse[:, cu_q[2]:cu_q[3]]))


def test_varlen_seqused_k_without_paging(seed):
    rng = np.random.default_rng(seed)
    q_lens, kv_lens, used = [3, 4, 2], [10, 6, 8], [7, 0, 8]
    q, cu_q = pack(rng, q_lens, 4, 32, np.float32)
    k, cu_k = pack(rng, kv_lens, 4, 32, np.float32)
    v = randn(rng, k.shape, np.float32)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 10, causal=True, return_lse=True,
                                      seqused_k=np.array(used, dtype=np.int32))
    k_seqs = [k[cu_k[b]:cu_k[b] + used[b]] for b in range(3)]
    v_seqs = [v[cu_k[b]:cu_k[b] + used[b]] for b in range(3)]
    ref, ref_lse, naive = varlen_reference(q, cu_q, k_seqs, v_seqs, 1 / math.sqrt(32), True,
                                           (-1, -1), np.float32, 4)
    check_close(out, ref, naive, FLOOR[np.float32])
    check_lse(lse, ref_lse)


def paged_cache(rng, kv_lens, page_size, hk, d, dtype):
    """A shuffled page pool holding each sequence's keys and values, and its block table.
    Every slot no sequence uses (unused pages, the tail of a last page, the padding of the
    block table) holds NaN: reading it would show in the output."""
    pages_per_seq = max(1, max(-(-n // page_size) for n in kv_lens))
    needed = sum(-(-n // page_size) for n in kv_lens)
    num_pages = needed + 3
    k_cache = np.full((num_pages, page_size, hk, d), np.nan, dtype=dtype)
    v_cache = np.full((num_pages, page_size, hk, d), np.nan, dtype=dtype)
    order = rng.permutation(num_pages)
    poison_page = int(order[-1])
    table = np.full((len(kv_lens), pages_per_seq), poison_page, dtype=np.int32)
    k_seqs, v_seqs, next_page = [], [], 0
    for b, n in enumerate(kv_lens):
        ks, vs = randn(rng, (n, hk, d), dtype), randn(rng, (n, hk, d), dtype)
        for i in range(-(-n // page_size)):
            page = int(order[next_page])
            next_page += 1
            table[b, i] = page
            rows = slice(i * page_size, min(n, (i + 1) * page_size))
            k_cache[page, :rows.stop - rows.start] = ks[rows]
            v_cache[page, :rows.stop - rows.start] = vs[rows]
        k_seqs.append(ks), v_seqs.append(vs)
    return k_cache, v_cache, table, k_seqs, v_seqs


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("page_size", [16, 256, 5])
def test_paged_kv(seed, dtype, page_size):
    rng = np.random.default_rng(seed)
    q_lens, kv_lens = [1, 6, 1, 3], [37, 6, 1, 0]  # decodes and a prefill chunk, as serving issues
    h, hk, d = 8, 2, 64
    q, cu_q = pack(rng, q_lens, h, d, dtype)
    k_cache, v_cache, table, k_seqs, v_seqs = paged_cache(rng, kv_lens, page_size, hk, d, dtype)
    used = np.array(kv_lens, dtype=np.int32)
    out, lse = flash_attn_varlen_func(q, k_cache, v_cache, cu_q, None, max(q_lens), max(kv_lens),
                                      causal=True, return_lse=True, block_table=table,
                                      seqused_k=used)
    ref, ref_lse, naive = varlen_reference(q, cu_q, k_seqs, v_seqs, 1 / math.sqrt(d), True,
                                           (-1, -1), dtype, h)
    check_close(out, ref, naive, FLOOR[dtype])
    check_lse(lse, ref_lse)
    # FlashAttention-2's convention: the key lengths as differences of cu_seqlens_k.
    cu_k = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    out2 = flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, max(q_lens), max(kv_lens),
                                  causal=True, block_table=table)
    assert np.array_equal(out2, out)


def test_non_contiguous_inputs(seed):
    rng = np.random.default_rng(seed)
    b, s, h, d = 2, 19, 4, 32
    # Packed qkv: every view strides over the other two, but the last dimension is contiguous.
    qkv = randn(rng, (b, s, 3, h, d), np.float32)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    out = flash_attn_func(q, k, v, causal=True)
    ref, _, naive = dense_reference(q, k, v, 1 / math.sqrt(d), True, (-1, -1), np.float32)
    check_close(out, ref, naive, FLOOR[np.float32])
    # A transposed view: the last dimension has stride h. It is copied (as FlashAttention does).
    q_t = randn(rng, (b, s, d, h), np.float32).transpose(0, 1, 3, 2)
    assert q_t.strides[-1] != q_t.itemsize
    out = flash_attn_func(q_t, k, v, causal=True)
    ref, _, naive = dense_reference(q_t, k, v, 1 / math.sqrt(d), True, (-1, -1), np.float32)
    check_close(out, ref, naive, FLOOR[np.float32])
    # Read-only inputs (through __array_interface__) work too.
    q_ro = np.array(q)
    q_ro.flags.writeable = False
    assert np.array_equal(flash_attn_func(q_ro, k, v), flash_attn_func(np.array(q), k, v))


class DLPackOnly:
    """Offers nothing but DLPack, like a tensor of a framework flashserve does not know."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_tensors(seed):
    rng = np.random.default_rng(seed)
    q, k, v = (randn(rng, (2, 9, 4, 16), np.float16) for _ in range(3))
    k_view = randn(rng, (2, 9, 8, 16), np.float16)[:, :, ::2]  # strided, through the capsule
    v = v.copy()
    refs = [sys.getrefcount(x) for x in (q, k_view, v)]
    out, lse = flash_attn_func(DLPackOnly(q), DLPackOnly(k_view), DLPackOnly(v), causal=True,
                               return_lse=True)
    assert isinstance(out, np.ndarray) and out.dtype == np.float16  # host output: NumPy
    ref, ref_lse, naive = dense_reference(q, k_view, v, 0.25, True, (-1, -1), np.float16)
    check_close(out, ref, naive, FLOOR[np.float16])
    check_lse(lse, ref_lse)
    gc.collect()
    assert [sys.getrefcount(x) for x in (q, k_view, v)] == refs, "a DLPack capsule was leaked"


def test_dlpack_description_matches_array_interface(seed):
    from flashserve import _tensor
    rng = np.random.default_rng(seed)
    base = randn(rng, (3, 8, 6, 10), np.float32)
    for view in (base, base[1:, ::3], base[:, :, 2:5]):
        via_dlpack = _tensor.describe(DLPackOnly(view), "q")
        via_interface = _tensor.describe(view, "q")
        assert via_dlpack.struct.data == via_interface.struct.data == view.ctypes.data
        assert via_dlpack.shape == via_interface.shape == view.shape
        assert via_dlpack.strides == via_interface.strides == \
            tuple(s // view.itemsize for s in view.strides)


# ---------------------------------------------------------------- errors

def qkv(rng, shape=(2, 5, 4, 32), dtype=np.float32, heads_k=None):
    b, s, h, d = shape
    hk = heads_k or h
    return (randn(rng, shape, dtype), randn(rng, (b, s, hk, d), dtype),
            randn(rng, (b, s, hk, d), dtype))


def test_error_wrong_rank(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng)
    with pytest.raises(ValueError, match=r"^q: expected rank 4 .*got rank 3"):
        flash_attn_func(q[0], k, v)
    with pytest.raises(ValueError, match=r"^k: expected rank 4 .*got rank 5"):
        flash_attn_func(q, k[None], v)
    cu = np.array([0, 5], dtype=np.int32)
    with pytest.raises(ValueError, match=r"^q: expected rank 3 \(total_q"):
        flash_attn_varlen_func(q, k[0], v[0], cu, cu, 5, 5)
    with pytest.raises(ValueError, match=r"^k: expected rank 3 or 4|^k: expected rank 3"):
        flash_attn_varlen_func(q[0], k, v[0], cu, cu, 5, 5)


def test_error_mismatched_heads_and_dims(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, (2, 5, 6, 32), heads_k=4)
    with pytest.raises(ValueError, match=r"^k: h_q \(6\) must be a multiple of h_kv \(4\)"):
        flash_attn_func(q, k, v)
    q, k, v = qkv(rng)
    with pytest.raises(ValueError, match=r"^k: head_dim 16 differs from q's 32"):
        flash_attn_func(q, k[..., :16].copy(), v)
    with pytest.raises(ValueError, match=r"^k: batch 1 differs from q's 2"):
        flash_attn_func(q, k[:1], v[:1])
    with pytest.raises(ValueError, match=r"^v: shape .* does not match k's"):
        flash_attn_func(q, k, v[:, :3])


def test_error_bad_dtypes(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng)
    with pytest.raises(ValueError, match=r"^q: dtype float64 is not supported"):
        flash_attn_func(q.astype(np.float64), k, v)
    with pytest.raises(ValueError, match=r"^q: dtype int64 is not supported"):
        flash_attn_func(q.astype(np.int64), k, v)
    with pytest.raises(ValueError, match=r"^k: dtype float32 differs from q's float16"):
        flash_attn_func(q.astype(np.float16), k, v)
    with pytest.raises(TypeError, match=r"^q: expected a tensor"):
        flash_attn_func(q.tolist(), k, v)
    cu64 = np.array([0, 5, 10], dtype=np.int64)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: dtype int64 is not supported"):
        flash_attn_varlen_func(q.reshape(10, 4, 32), k.reshape(10, 4, 32), v.reshape(10, 4, 32),
                               cu64, cu64.astype(np.int32), 5, 5)


def test_error_unsupported_features(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng)
    with pytest.raises(NotImplementedError, match=r"^dropout_p: dropout is not supported"):
        flash_attn_func(q, k, v, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match=r"^dropout_p"):
        flash_attn_func(q, k, v, 0.5)
    with pytest.raises(TypeError, match=r"^return_attn_probs: expected a bool"):
        flash_attn_func(q, k, v, return_attn_probs="yes")
    with pytest.raises(ValueError, match=r"^return_lse: pass return_attn_probs=True"):
        flash_attn_func(q, k, v, return_attn_probs=True, return_lse=True)
    with pytest.raises(ValueError, match=r"^softcap: must be 0 \(off\)"):
        flash_attn_func(q, k, v, softcap=-30.0)
    with pytest.raises(ValueError, match=r"^alibi_slopes: shape \[3\] is neither"):
        flash_attn_func(q, k, v, alibi_slopes=np.ones(3, dtype=np.float32))
    with pytest.raises(ValueError, match=r"^softmax_scale: 0 is not supported"):
        flash_attn_func(q, k, v, softmax_scale=0.0)
    with pytest.raises(ValueError, match=r"^window_size: expected a pair"):
        flash_attn_func(q, k, v, window_size=3)


def test_error_bad_lengths_and_tables(seed):
    rng = np.random.default_rng(seed)
    q, cu_q = pack(rng, [3, 4], 2, 16, np.float32)
    k, cu_k = pack(rng, [5, 2], 2, 16, np.float32)
    v = randn(rng, k.shape, np.float32)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: must be non-decreasing"):
        flash_attn_varlen_func(q, k, v, np.array([0, 4, 3], np.int32), cu_k, 4, 5)
    with pytest.raises(ValueError, match=r"^max_seqlen_q: 3 is less than the longest sequence"):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 5)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: expected 3 entries, got 2"):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k[:2], 4, 5)
    k_cache, v_cache = randn(rng, (4, 8, 2, 16), np.float32), randn(rng, (4, 8, 2, 16), np.float32)
    table = np.array([[0, 1], [99, 2]], dtype=np.int32)
    used = np.array([9, 3], dtype=np.int32)
    with pytest.raises(ValueError, match=r"^block_table: entry \[1, 0\] is 99, outside the pool"):
        flash_attn_varlen_func(q, k_cache, v_cache, cu_q, None, 4, 9, block_table=table,
                               seqused_k=used)
    with pytest.raises(ValueError, match=r"^seqused_k: the key lengths are required"):
        flash_attn_varlen_func(q, k_cache, v_cache, cu_q, None, 4, 9, block_table=table)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: with block_table pass either"):
        flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 4, 9, block_table=table,
                               seqused_k=used)
    with pytest.raises(ValueError, match=r"^seqused_k: entry 0 is 17, outside \[0, 16\]"):
        flash_attn_varlen_func(q, k_cache, v_cache, cu_q, None, 4, 17,
                               block_table=np.array([[0, 1], [2, 3]], np.int32),
                               seqused_k=np.array([17, 3], np.int32))


def test_version_and_capabilities():
    assert flashserve.version() == flashserve.__version__
    assert flashserve.built_with_cuda() in (True, False)
    assert flashserve.cuda_available() <= flashserve.built_with_cuda()


def test_empty_shapes(seed):
    rng = np.random.default_rng(seed)
    q, k = randn(rng, (2, 3, 2, 8), np.float32), randn(rng, (2, 0, 2, 8), np.float32)
    out, lse = flash_attn_func(q, k, k, return_lse=True)  # no keys at all: zeros, lse -inf
    assert np.all(out == 0) and np.all(np.isneginf(lse)) and lse.shape == (2, 2, 3)
    out = flash_attn_func(q[:, :0], randn(rng, (2, 5, 2, 8), np.float32),
                          randn(rng, (2, 5, 2, 8), np.float32))
    assert out.shape == (2, 0, 2, 8)
    k = randn(rng, (5, 2, 8), np.float32)
    out, lse = flash_attn_varlen_func(q.reshape(6, 2, 8)[:0], k, k, np.array([0, 0], np.int32),
                                      np.array([0, 5], np.int32), 0, 5, return_lse=True)
    assert out.shape == (0, 2, 8) and lse.shape == (2, 0)


def test_concurrent_calls_from_threads(seed):
    """ctypes releases the GIL: calls from several threads overlap in the library."""
    from concurrent.futures import ThreadPoolExecutor
    rng = np.random.default_rng(seed)
    cases = [tuple(randn(rng, (2, 33, 4, 32), np.float32) for _ in range(3)) for _ in range(8)]
    expected = [flash_attn_func(q, k, v, causal=True) for q, k, v in cases]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: flash_attn_func(*c, causal=True), cases * 4))
    for i, out in enumerate(results):
        assert np.array_equal(out, expected[i % len(cases)])


class CudaArrayInterfaceOnly:
    """A device array that offers only __cuda_array_interface__ (as Numba's do)."""

    def __init__(self, array):
        self.__cuda_array_interface__ = {"shape": array.shape, "typestr": array.dtype.str,
                                         "data": (array.ctypes.data, False), "strides": None,
                                         "version": 3, "stream": None}


@pytest.mark.skipif(flashserve.built_with_cuda(), reason="checks the CPU-only build's refusal")
def test_cuda_array_interface_reaches_the_library(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng)
    with pytest.raises(ValueError, match=r"^k: must be on the same device as q"):
        flash_attn_func(q, CudaArrayInterfaceOnly(k), v)
    with pytest.raises(TypeError, match=r"cannot allocate the output .* on cuda"):
        flash_attn_func(CudaArrayInterfaceOnly(q), k, v)
