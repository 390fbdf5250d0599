"""Head dims on the CPU path (NumPy arrays), issue 24: the multiples of 8 that CUDA now takes and
q/k head dims unlike v's (DeepSeek's 192/128) through flash_attn_func, flash_attn_varlen_func and
flash_attn_with_kvcache, against the float64 reference; and the argument checks that name what is
wrong (they are the library's, the same on CUDA tensors). The CUDA runs: test_gpu_head_dims.py."""

import math

import numpy as np
import pytest

from flashserve import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from attention_reference import check_close, check_lse
from test_cpu_numpy import FLOOR, dense_reference, floor_for, pack, randn, varlen_reference

@pytest.fixture
def seed():
    """A fixed seed (conftest.py's is fresh per run): these cases are deterministic, their inputs
    still random normal values."""
    return 2025


DIMS = [(40, 40), (96, 96), (192, 128), (64, 128), (248, 248)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dims", DIMS, ids=lambda p: f"{p[0]}_{p[1]}")
def test_dense(seed, dtype, causal, dims):
    d, dv = dims
    rng = np.random.default_rng(seed)
    q, k, v = randn(rng, (2, 13, 4, d), dtype), randn(rng, (2, 21, 2, d), dtype), \
        randn(rng, (2, 21, 2, dv), dtype)
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    assert out.shape == (2, 13, 4, dv) and out.dtype == dtype and lse.shape == (2, 4, 13)
    ref, ref_lse, naive = dense_reference(q, k, v, 1 / math.sqrt(d), causal, (-1, -1), dtype)
    check_close(out, ref, naive, floor_for(dtype, d))
    check_lse(lse, ref_lse)


def test_varlen_192_128(seed):
    rng = np.random.default_rng(seed)
    q_lens, kv_lens = [5, 0, 13, 1], [9, 4, 30, 7]
    h, hk, d, dv = 4, 2, 192, 128
    q, cu_q = pack(rng, q_lens, h, d, np.float32)
    k, cu_k = pack(rng, kv_lens, hk, d, np.float32)
    v = randn(rng, (k.shape[0], hk, dv), np.float32)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(kv_lens), causal=True,
                                      return_lse=True)
    assert out.shape == (q.shape[0], h, dv)
    k_seqs = [k[cu_k[b]:cu_k[b + 1]] for b in range(len(kv_lens))]
    v_seqs = [v[cu_k[b]:cu_k[b + 1]] for b in range(len(kv_lens))]
    ref, ref_lse, naive = varlen_reference(q, cu_q, k_seqs, v_seqs, 1 / math.sqrt(d), True,
                                           (-1, -1), np.float32, h)
    check_close(out, ref, naive, floor_for(np.float32, d))
    check_lse(lse, ref_lse)


def test_kvcache_192_128(seed):
    rng = np.random.default_rng(seed)
    b, h, hk, d, dv, cap = 2, 4, 2, 192, 128, 64
    lens = np.array([40, 3], dtype=np.int32)
    k_cache, v_cache = randn(rng, (b, cap, hk, d), np.float32), randn(rng, (b, cap, hk, dv),
                                                                     np.float32)
    q = randn(rng, (b, 1, h, d), np.float32)
    k_new, v_new = randn(rng, (b, 1, hk, d), np.float32), randn(rng, (b, 1, hk, dv), np.float32)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens,
                                  causal=True)
    assert out.shape == (b, 1, h, dv)
    for i, n in enumerate(lens):
        assert np.array_equal(k_cache[i, n], k_new[i, 0])
        assert np.array_equal(v_cache[i, n], v_new[i, 0])
        ref, _, naive = dense_reference(q[i:i + 1], k_cache[i:i + 1, :n + 1],
                                        v_cache[i:i + 1, :n + 1], 1 / math.sqrt(d), True,
                                        (-1, -1), np.float32)
        check_close(out[i:i + 1], ref, naive, floor_for(np.float32, d))


def test_argument_checks_name_the_argument(seed):
    rng = np.random.default_rng(seed)
    q, k = randn(rng, (1, 5, 2, 192), np.float16), randn(rng, (1, 7, 2, 192), np.float16)
    v = randn(rng, (1, 7, 2, 128), np.float16)
    with pytest.raises(ValueError, match=r"^k: head_dim 128 differs from q's 192"):
        flash_attn_func(q, v, v)
    with pytest.raises(ValueError, match=r"^v: head_dim 520 is not supported \(1..512\)"):
        flash_attn_func(q, k, randn(rng, (1, 7, 2, 520), np.float16))
    with pytest.raises(ValueError, match=r"^q: head_dim 520 is not supported \(1..512\)"):
        big = randn(rng, (1, 5, 2, 520), np.float16)
        flash_attn_func(big, big[:, :1].repeat(7, axis=1), v)
    # The value head dim sets out's last dimension (flash_attn_with_kvcache's v_cache likewise).
    assert flash_attn_func(q, k, v).shape == (1, 5, 2, 128)
    assert np.isfinite(FLOOR[np.float16])
