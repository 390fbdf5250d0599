"""Head dims beyond 64/128/256 on CUDA (issue 24): multiples of 8 from 32 to 256 (FlashAttention-2
takes these), q/k's and v's equal or not (DeepSeek's 192/128, which FlashAttention-3 takes), run on
the padded sm80 kernels; their gradients with equal dims (issue 22) on the padded sm80 backward.
Against the float64 SDPA reference of test_gpu_torch.py with its tolerance. Skipped without torch
or without a CUDA device."""

import math

import pytest

torch = pytest.importorskip("torch")

import flashserve  # noqa: E402
from flashserve import (flash_attn_func, flash_attn_varlen_func,  # noqa: E402
                        flash_attn_with_kvcache)
from test_gpu_torch import (check, check_autograd_against_float64,  # noqa: E402,F401
                            check_lse, gen, pack, randn, reference)


@pytest.fixture(autouse=True)
def _padded_head_dims_on(monkeypatch):
    """The padded kernels are on by default (kPaddedHeadDimsByDefault in cuda/plan.h); the
    tests say so explicitly so that they run whatever the default."""
    monkeypatch.setenv("FLASHSERVE_PADDED_HEAD_DIMS", "1")

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no CUDA device"),
    pytest.mark.skipif(torch.cuda.is_available() and not flashserve.cuda_available(),
                       reason="skipped: libflashserve_c was built without CUDA"),
]

@pytest.fixture
def seed():
    """A fixed seed (conftest.py's is fresh per run): these cases are deterministic, their inputs
    still random normal values."""
    return 2024


DTYPES = [torch.bfloat16, torch.float16]
DIMS = [(32, 32), (40, 40), (72, 72), (96, 96), (136, 136), (160, 160), (192, 192), (224, 224),
        (248, 248), (192, 128), (128, 64), (64, 128)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dims", DIMS, ids=lambda p: f"{p[0]}_{p[1]}")
def test_dense(gen, dtype, causal, dims):
    d, dv = dims
    b, sq, sk, h, hk = 2, 113, 203, 8, 2
    q, k, v = randn(gen, (b, sq, h, d), dtype), randn(gen, (b, sk, hk, d), dtype), \
        randn(gen, (b, sk, hk, dv), dtype)
    with torch.no_grad():
        out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    assert out.shape == (b, sq, h, dv) and out.dtype == dtype and lse.shape == (b, h, sq)
    scale = 1 / math.sqrt(d)  # the default: q/k's real head dim
    for i in range(b):
        exact, low, lse_i = reference(q[i], k[i], v[i], scale, causal, (-1, -1))
        check(out[i], exact, low, dtype)
        check_lse(lse[i], lse_i)


@pytest.mark.parametrize("dims", [(96, 96), (160, 160), (192, 128), (40, 40)],
                         ids=lambda p: f"{p[0]}_{p[1]}")
def test_varlen_and_paged(gen, dims):
    d, dv = dims
    dtype = torch.bfloat16
    q_lens, kv_lens = [1, 17, 0, 127, 40], [300, 17, 5, 127, 0]
    h, hk = 8, 4
    q, cu_q = pack(gen, q_lens, h, d, dtype)
    k, cu_k = pack(gen, kv_lens, hk, d, dtype)
    v = randn(gen, (k.shape[0], hk, dv), dtype)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(kv_lens), causal=True,
                                      return_lse=True)
    assert out.shape == (q.shape[0], h, dv)
    qs, ks = cu_q.tolist(), cu_k.tolist()
    for i in range(len(q_lens)):
        exact, low, lse_i = reference(q[qs[i]:qs[i + 1]], k[ks[i]:ks[i + 1]], v[ks[i]:ks[i + 1]],
                                      1 / math.sqrt(d), True, (-1, -1))
        check(out[qs[i]:qs[i + 1]], exact, low, dtype, f"out of sequence {i}")
        check_lse(lse[:, qs[i]:qs[i + 1]], lse_i)
    # The same keys in a paged cache of 16-key pages (NaN in every slot no sequence uses).
    page = 16
    pages = [-(-n // page) for n in kv_lens]
    num_pages = sum(pages) + 2
    k_cache = torch.full((num_pages, page, hk, d), float("nan"), dtype=dtype, device="cuda")
    v_cache = torch.full((num_pages, page, hk, dv), float("nan"), dtype=dtype, device="cuda")
    table = torch.full((len(kv_lens), max(pages)), num_pages - 1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(kv_lens):
        for i in range(pages[b]):
            rows = slice(ks[b] + i * page, ks[b] + min(n, (i + 1) * page))
            k_cache[used, :rows.stop - rows.start] = k[rows]
            v_cache[used, :rows.stop - rows.start] = v[rows]
            table[b, i] = used
            used += 1
    seqused = torch.tensor(kv_lens, dtype=torch.int32, device="cuda")
    paged, paged_lse = flash_attn_varlen_func(q, k_cache, v_cache, cu_q, None, max(q_lens),
                                              max(kv_lens), causal=True, return_lse=True,
                                              block_table=table.cuda(), seqused_k=seqused)
    assert paged.shape == (q.shape[0], h, dv)
    for i in range(len(q_lens)):
        exact, low, lse_i = reference(q[qs[i]:qs[i + 1]], k[ks[i]:ks[i + 1]], v[ks[i]:ks[i + 1]],
                                      1 / math.sqrt(d), True, (-1, -1))
        check(paged[qs[i]:qs[i + 1]], exact, low, dtype, f"paged out of sequence {i}")
        check_lse(paged_lse[:, qs[i]:qs[i + 1]], lse_i)


@pytest.mark.parametrize("num_splits", [0, 1, 5])
@pytest.mark.parametrize("dims", [(96, 96), (192, 128), (72, 72)], ids=lambda p: f"{p[0]}_{p[1]}")
def test_kvcache_decode(gen, num_splits, dims):
    """flash_attn_with_kvcache: one new token appended per sequence, decode over the cache, split
    (automatically or forced) or not; the combine writes v's head dim."""
    d, dv = dims
    dtype = torch.bfloat16
    b, h, hk, cap = 3, 16, 2, 4096
    lens = [4000, 1, 777]
    k_cache, v_cache = randn(gen, (b, cap, hk, d), dtype), randn(gen, (b, cap, hk, dv), dtype)
    q = randn(gen, (b, 1, h, d), dtype)
    k_new, v_new = randn(gen, (b, 1, hk, d), dtype), randn(gen, (b, 1, hk, dv), dtype)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                       causal=True, num_splits=num_splits,
                                       return_softmax_lse=True)
    assert out.shape == (b, 1, h, dv)
    for i, n in enumerate(lens):
        assert torch.equal(k_cache[i, n], k_new[i, 0]) and torch.equal(v_cache[i, n], v_new[i, 0])
        exact, low, lse_i = reference(q[i], k_cache[i, :n + 1], v_cache[i, :n + 1],
                                      1 / math.sqrt(d), True, (-1, -1))
        check(out[i], exact, low, dtype, f"out of sequence {i}")
        check_lse(lse[i], lse_i)


def test_refusals_name_the_argument(gen):
    dtype = torch.bfloat16
    q, k, v = (randn(gen, (1, 16, 2, 40), dtype) for _ in range(3))
    with pytest.raises(NotImplementedError, match=r"^q: head_dim 36 is not supported by the CUDA "
                                                  r"kernels \(a multiple of 8 from 32 to 256\)"):
        flash_attn_func(q[..., :36].contiguous(), k[..., :36].contiguous(),
                        v[..., :36].contiguous())
    with pytest.raises(NotImplementedError, match=r"^q: head_dim 24 is not supported"):
        flash_attn_func(q[..., :24].contiguous(), k[..., :24].contiguous(),
                        v[..., :24].contiguous())
    with pytest.raises(NotImplementedError, match=r"^softcap: logit soft-capping is not supported "
                                                  r"by the CUDA kernels with head dims 40/40"):
        flash_attn_func(q, k, v, softcap=30.0)
    # Gradients: the CUDA backward needs q's and v's head dims equal; refused before the forward
    # runs.
    with pytest.raises(NotImplementedError,
                       match=r"^q: head_dim 40 \(v's 32\) has no CUDA backward \(q's and v's "
                             r"head dims must be equal"):
        flash_attn_func(q.requires_grad_(), k, v[..., :32].contiguous())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [32, 40, 96, 136, 192, 256])
def test_autograd_padded_head_dims(gen, dtype, causal, d):
    """The CUDA backward at head dims other than 64 and 128 (the sm80 kernels of 64, 128 or 256,
    padded; past 128 in two launches of half the columns), through autograd, against float64
    autograd (test_gpu_torch.py's check_autograd_against_float64)."""
    check_autograd_against_float64(gen, d, causal, dtype)
