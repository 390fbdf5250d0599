"""PyTorch tensors on the CPU path: bfloat16 travels through DLPack (NumPy has no bfloat16), the
output is a torch tensor, grad mode does not change the output.
Skipped without torch."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flashserve import flash_attn_func, flash_attn_varlen_func  # noqa: E402
from attention_reference import attention, check_close, check_lse, visible  # noqa: E402

FLOOR = {torch.bfloat16: 2.0**-9, torch.float16: 2.0**-12, torch.float32: 1e-6}
LOW = {torch.bfloat16: None, torch.float16: np.float16, torch.float32: np.float32}


def naive_low(q, k, v, scale, causal, window, dtype):
    """The naive low-precision run; for bfloat16 (not in NumPy) P is rounded through torch."""
    if LOW[dtype] is not None:
        return attention(q, k, v, scale, causal, window, low_precision=LOW[dtype])[0]
    out = np.zeros((q.shape[0], q.shape[1], v.shape[2]))
    group = q.shape[1] // k.shape[1]
    mask = torch.from_numpy(visible(q.shape[0], k.shape[0], causal, window))
    for h in range(q.shape[1]):
        s = torch.from_numpy(q[:, h] @ k[:, h // group].T).float() * scale
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
        o = p.to(torch.bfloat16).float() @ torch.from_numpy(v[:, h // group]).float()
        out[:, h] = o.to(torch.bfloat16).double().numpy()
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_dense(seed, dtype, causal):
    g = torch.Generator().manual_seed(seed)
    b, sq, sk, h, hk, d = 2, 19, 37, 8, 2, 64
    q = torch.randn(b, sq, h, d, generator=g).to(dtype)
    k = torch.randn(b, sk, hk, d, generator=g).to(dtype)
    v = torch.randn(b, sk, hk, d, generator=g).to(dtype)
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device.type == "cpu"
    assert lse.dtype == torch.float32 and lse.shape == (b, h, sq)
    scale = 1 / math.sqrt(d)
    for i in range(b):
        qi, ki, vi = (x[i].double().numpy() for x in (q, k, v))
        ref, ref_lse = attention(qi, ki, vi, scale, causal)
        naive = naive_low(qi, ki, vi, scale, causal, (-1, -1), dtype)
        check_close(out[i].double().numpy(), ref, naive, FLOOR[dtype])
        check_lse(lse[i].numpy(), ref_lse)


def test_varlen_bf16(seed):
    g = torch.Generator().manual_seed(seed)
    q_lens, kv_lens = [3, 0, 9], [5, 2, 9]
    cu_q = torch.tensor([0] + np.cumsum(q_lens).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + np.cumsum(kv_lens).tolist(), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), 4, 32, generator=g).bfloat16()
    k = torch.randn(int(cu_k[-1]), 4, 32, generator=g).bfloat16()
    v = torch.randn(int(cu_k[-1]), 4, 32, generator=g).bfloat16()
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, torch.tensor(9), 9, causal=True)
    for i in range(3):
        qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        qi, ki, vi = (x.double().numpy() for x in (q[qs], k[ks], v[ks]))
        ref, _ = attention(qi, ki, vi, 1 / math.sqrt(32), True)
        naive = naive_low(qi, ki, vi, 1 / math.sqrt(32), True, (-1, -1), torch.bfloat16)
        check_close(out[qs].double().numpy(), ref, naive, FLOOR[torch.bfloat16])


def test_grad_mode_does_not_change_the_output(seed):
    # Gradients themselves: test_cpu_torch_autograd.py.
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 4, 2, 16, generator=g) for _ in range(3))
    q.requires_grad_()
    with torch.no_grad():
        out = flash_attn_func(q, k, v)
    with torch.inference_mode():
        assert torch.equal(flash_attn_func(q.detach(), k, v), out)
    if hasattr(torch.library, "register_autograd"):
        assert torch.equal(flash_attn_func(q, k, v).detach(), out)


def test_transposed_last_dim_is_copied(seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 6, 16, 2, generator=g).transpose(2, 3)  # last stride 2
    k, v = (torch.randn(1, 6, 2, 16, generator=g) for _ in range(2))
    assert q.stride(-1) != 1
    assert torch.equal(flash_attn_func(q, k, v), flash_attn_func(q.contiguous(), k, v))
