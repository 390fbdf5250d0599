"""Issue 9 through the Python API: integers checked before ctypes can wrap them, scales that would
silently become the default refused, errors in the user's terms (the FlashAttention-2 paged
convention), NaN semantics as in PyTorch, misaligned arrays refused."""

import math

import numpy as np
import pytest

from flashserve import flash_attn_func, flash_attn_varlen_func
from attention_reference import attention


def randn(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def qkv(seed, shape=(1, 9, 2, 16)):
    rng = np.random.default_rng(seed)
    return randn(rng, shape), randn(rng, shape), randn(rng, shape)


@pytest.mark.parametrize("value", [2**32 + 3, 2**31, -2**31 - 1, 2**64])
def test_num_splits_that_ctypes_would_wrap_is_an_error(seed, value):
    q, k, v = qkv(seed)
    with pytest.raises(ValueError, match=rf"^num_splits: {value} is outside \[-2147483648, "
                                         r"2147483647\]"):
        flash_attn_func(q, k, v, num_splits=value)


def test_max_seqlen_beyond_int64_is_an_error(seed):
    rng = np.random.default_rng(seed)
    q = randn(rng, (5, 2, 16))
    cu = np.array([0, 5], np.int32)
    with pytest.raises(ValueError, match=r"^max_seqlen_q: 9223372036854775808 is outside"):
        flash_attn_varlen_func(q, q, q, cu, cu, 2**63, 5)
    with pytest.raises(ValueError, match=r"^max_seqlen_k: -9223372036854775809 is outside"):
        flash_attn_varlen_func(q, q, q, cu, cu, 5, -2**63 - 1)


@pytest.mark.parametrize("scale", [1e-46, 7e-46, 1e-40, -1e-39, 1e39, -1e300])
def test_scale_that_float32_cannot_hold_is_refused(seed, scale):
    # 1e-46 rounds to 0 in float32, which the C API reads as "default": 1/sqrt(d) was used silently.
    q, k, v = qkv(seed)
    with pytest.raises(ValueError, match=r"^softmax_scale: .* is outside float32's normal range"):
        flash_attn_func(q, k, v, softmax_scale=scale)


def test_smallest_normal_scale_is_used_not_replaced_by_the_default(seed):
    q, k, v = qkv(seed)
    scale = 2.0**-126
    out = flash_attn_func(q, k, v, softmax_scale=scale)
    # Scores are ~0: uniform attention over the keys, far from what 1/sqrt(d) gives.
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(axis=1, keepdims=True), out.shape),
                               rtol=1e-5, atol=1e-6)
    assert not np.allclose(out, flash_attn_func(q, k, v), atol=1e-3)


def paged(seed):
    rng = np.random.default_rng(seed)
    q = randn(rng, (2, 2, 16))
    cache = randn(rng, (4, 8, 2, 16))
    table = np.array([[0, 1], [2, 3]], np.int32)
    return q, cache, table


def test_fa2_paged_convention_errors_name_cu_seqlens_k(seed):
    q, cache, table = paged(seed)
    cu_q = np.array([0, 1, 2], np.int32)
    # Key lengths 17 and 3 as cu_seqlens_k differences: 17 exceeds the 2 pages x 8 of a sequence.
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: \(the key lengths .*\) entry 0 is 17, "
                                         r"outside \[0, 16\]"):
        flash_attn_varlen_func(q, cache, cache, cu_q, np.array([0, 17, 20], np.int32), 1, 17,
                               block_table=table)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: \(the key lengths .*\) expected 2 entries"):
        flash_attn_varlen_func(q, cache, cache, cu_q, np.array([0, 5, 6, 7], np.int32), 1, 8,
                               block_table=table)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: expected a 1-D tensor"):
        flash_attn_varlen_func(q, cache, cache, cu_q, np.zeros((2, 2), np.int32), 1, 8,
                               block_table=table)


def test_nan_in_q_gives_nan_row_and_lse_like_pytorch(seed):
    q, k, v = qkv(seed, (1, 12, 2, 16))
    q[0, 5, 1, 3] = np.nan  # row 5, head 1
    k[0, 2, 0, 7] = np.nan  # key 2 of head 0: causal rows 2.. of head 0 see it
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    nan_rows = np.isnan(out).all(axis=-1)  # [1, 12, 2]
    expected = np.zeros((1, 12, 2), bool)
    expected[0, 5, 1] = True
    expected[0, 2:, 0] = True
    np.testing.assert_array_equal(nan_rows, expected)
    assert not np.isnan(out[~expected]).any()
    np.testing.assert_array_equal(np.isnan(lse), expected.transpose(0, 2, 1))
    # The finite rows still match the float64 reference.
    for h in range(2):
        ref, ref_lse = attention(q[0, :, h:h + 1].astype(np.float64),
                                 k[0, :, h:h + 1].astype(np.float64),
                                 v[0, :, h:h + 1].astype(np.float64), 1 / 4, True, (-1, -1))
        ok = ~expected[0, :, h]
        np.testing.assert_allclose(out[0, ok, h], ref[ok, 0], rtol=1e-5, atol=1e-5)


def test_row_that_sees_no_key_stays_zero_even_with_nan_q(seed):
    rng = np.random.default_rng(seed)
    q, k = randn(rng, (1, 6, 1, 8)), randn(rng, (1, 3, 1, 8))
    q[0, 0, 0, 0] = np.nan  # causal, 6 queries over 3 keys: rows 0..2 see no key
    out, lse = flash_attn_func(q, k, k, causal=True, return_lse=True)
    assert np.all(out[0, :3] == 0) and np.all(np.isneginf(lse[0, 0, :3]))
    assert np.isfinite(out[0, 3:]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_misaligned_array_is_refused(seed, dtype):
    rng = np.random.default_rng(seed)
    shape = (1, 4, 2, 8)
    size = np.dtype(dtype).itemsize
    raw = np.zeros(math.prod(shape) * size + 1, np.uint8)
    q = raw[1:].view(dtype).reshape(shape)  # one byte past an aligned address
    q[...] = randn(rng, shape, dtype)
    assert q.ctypes.data % size != 0
    k = randn(rng, shape, dtype)
    with pytest.raises(ValueError, match=rf"^q: data pointer .* is not aligned to its {size}-byte "
                                         r"elements"):
        flash_attn_func(q, k, k)
