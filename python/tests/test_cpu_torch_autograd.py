"""Autograd through flashserve's PyTorch operators on the CPU path: gradients of flash_attn_func,
flash_attn_varlen_func and the packed variants against PyTorch's own autograd of a naive attention
in float64, with the tolerance set by the same naive attention's autograd in the input's low
precision (as FlashAttention's tests do); gradcheck on a tiny float32 case (the CPU path takes no
float64); deterministic reruns; torch.compile and activation checkpointing through the operators.
Skipped without PyTorch, or with one older than the custom-operator API (2.4)."""

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.checkpoint  # noqa: E402  (not imported by `import torch` everywhere)
if not hasattr(torch.library, "register_autograd"):
    pytest.skip(f"PyTorch {torch.__version__} lacks torch.library.register_autograd",
                allow_module_level=True)

from flashserve import (flash_attn_func, flash_attn_kvpacked_func,  # noqa: E402
                        flash_attn_qkvpacked_func, flash_attn_varlen_func,
                        flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
from attention_reference import check_close, visible  # noqa: E402

FLOOR = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 1e-5}


def naive(q, k, v, scale, causal, window, dtype, softcap=0.0, slopes=None):
    """Attention of one sequence in `dtype` with PyTorch ops (q [sq, h, d], k/v [sk, hk, d]),
    differentiable: out [sq, h, dv] and lse [h, sq]; softcap > 0 caps the scores with tanh, slopes
    ([h]) subtract ALiBi's slope * |p - j|. Masked scores are a large negative number,
    not -inf, and rows that see nothing are zeroed after the softmax, so that autograd gives them
    zero gradients rather than NaN."""
    q, k, v = (x.to(dtype) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    mask = torch.from_numpy(visible(q.shape[0], k.shape[0], causal, window))
    seen = mask.any(dim=1)
    work = torch.float64 if dtype == torch.float64 else torch.float32

    def product(equation, a, b):
        # In float32 on dtype values, rounded to dtype (what a kernel accumulating in float32
        # stores); autograd rounds the gradients at the same casts.
        return torch.einsum(equation, a.to(work), b.to(work)).to(dtype)

    s = product("qhd,khd->hqk", q, k).to(work) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:
        sq, sk = s.shape[1], s.shape[2]
        p = sk - sq + torch.arange(sq)[:, None]
        s = s - slopes.to(work)[:, None, None] * (p - torch.arange(sk)[None, :]).abs().to(work)
    s = s.masked_fill(~mask, -1e30)
    p = torch.softmax(s, dim=-1) * seen[None, :, None]
    lse = torch.logsumexp(s, dim=-1).masked_fill(~seen[None], -math.inf)
    out = product("hqk,khd->qhd", p.to(dtype), v)
    return out, lse


def reference_grads(q, k, v, dout, scale, causal, window, dtype, dlse=None, softcap=0.0,
                    slopes=None):
    """(dq, dk, dv) of sum(out * dout) (+ sum(lse * dlse)) by PyTorch autograd of naive() in
    dtype, as float64 NumPy arrays."""
    leaves = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    out, lse = naive(*leaves, scale, causal, window, dtype, softcap, slopes)
    loss = (out.double() * dout.double()).sum()
    if dlse is not None:
        seen = torch.isfinite(lse)
        loss = loss + (torch.where(seen, lse, 0).double() * dlse.double()).sum()
    loss.backward()
    return [x.grad.double().numpy() for x in leaves]


def random(g, shape, dtype):
    return torch.randn(*shape, generator=g).to(dtype)


def check_grads(got, exact, low, dtype):
    for name, a, e, n in zip(("dq", "dk", "dv"), got, exact, low):
        scale = max(np.abs(e).max(), 1.0)
        check_close(a.detach().double().numpy(), e, n, FLOOR[dtype] * scale, what=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (9, 3))])
def test_dense_grads_match_float64_autograd(dtype, causal, window):
    g = torch.Generator().manual_seed(2200 + int(causal) + 7 * window[0])
    b, sq, sk, h, hk, d = 2, 45, 29, 4, 2, 32  # q_len > kv_len: causal rows that see nothing
    q, k, v = random(g, (b, sq, h, d), dtype), random(g, (b, sk, hk, d), dtype), \
        random(g, (b, sk, hk, d), dtype)
    dout = random(g, (b, sq, h, d), dtype)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = flash_attn_func(*leaves, causal=causal, window_size=window)
    assert out.requires_grad and out.dtype == dtype
    out.backward(dout)
    for x, leaf in zip((q, k, v), leaves):
        assert leaf.grad.dtype == dtype and leaf.grad.shape == x.shape
    scale = 1 / math.sqrt(d)
    for i in range(b):
        args = (q[i], k[i], v[i], dout[i], scale, causal, window)
        exact = reference_grads(*args, torch.float64)
        low = reference_grads(*args, dtype)
        check_grads([leaf.grad[i] for leaf in leaves], exact, low, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("softcap,alibi", [(1.5, False), (0.0, True), (0.8, True)])
def test_softcap_and_alibi_grads_match_float64_autograd(dtype, softcap, alibi):
    """The CPU backward carries the softcap's tanh into the gradient (and ALiBi's shift into the
    recomputed probabilities); the lse is differentiated too (return_attn_probs)."""
    g = torch.Generator().manual_seed(2210 + int(softcap * 10) + int(alibi))
    b, sq, sk, h, hk, d = 2, 23, 37, 4, 2, 32
    q, k, v = random(g, (b, sq, h, d), dtype), random(g, (b, sk, hk, d), dtype), \
        random(g, (b, sk, hk, d), dtype)
    dout = random(g, (b, sq, h, d), dtype)
    dlse = random(g, (b, h, sq), torch.float32)
    slopes = torch.rand(b, h, generator=g) * 0.7 + 0.05 if alibi else None
    scale = 0.6  # scores of about N(0, 12): the cap bends them
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse, s_dmask = flash_attn_func(*leaves, 0.0, scale, True, (-1, -1), softcap, slopes,
                                        False, True)
    assert s_dmask.shape == (0,) and not s_dmask.requires_grad
    torch.autograd.backward([out, lse], [dout, dlse])
    for i in range(b):
        row = None if slopes is None else slopes[i]
        args = (q[i], k[i], v[i], dout[i], scale, True, (-1, -1))
        kw = dict(dlse=dlse[i], softcap=softcap, slopes=row)
        check_grads([leaf.grad[i] for leaf in leaves], reference_grads(*args, torch.float64, **kw),
                    reference_grads(*args, dtype, **kw), dtype)


def test_alibi_slopes_that_require_grad_are_refused():
    q = torch.randn(1, 5, 2, 16, requires_grad=True)
    slopes = torch.rand(2, requires_grad=True)
    with pytest.raises(NotImplementedError, match=r"^alibi_slopes: requires grad"):
        flash_attn_func(q, q, q, alibi_slopes=slopes)
    with torch.no_grad():
        flash_attn_func(q, q, q, alibi_slopes=slopes)  # no gradient asked for: runs


def test_lse_gradient(seed=2205):
    g = torch.Generator().manual_seed(seed)
    q, k, v = random(g, (1, 21, 4, 16), torch.float32), random(g, (1, 33, 1, 16), torch.float32), \
        random(g, (1, 33, 1, 16), torch.float32)
    dout, dlse = random(g, (1, 21, 4, 16), torch.float32), random(g, (1, 4, 21), torch.float32)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = flash_attn_func(*leaves, causal=True, return_lse=True)
    torch.autograd.backward([out, lse], [dout, dlse])
    args = (q[0], k[0], v[0], dout[0], 0.25, True, (-1, -1))
    exact = reference_grads(*args, torch.float64, dlse=dlse[0])
    low = reference_grads(*args, torch.float32, dlse=dlse[0])
    check_grads([leaf.grad[0] for leaf in leaves], exact, low, torch.float32)


def test_varlen_with_empty_sequences():
    g = torch.Generator().manual_seed(2206)
    q_lens, kv_lens = [7, 0, 40, 13], [11, 5, 40, 0]
    cu_q = torch.tensor([0] + np.cumsum(q_lens).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + np.cumsum(kv_lens).tolist(), dtype=torch.int32)
    dtype = torch.bfloat16
    q = random(g, (int(cu_q[-1]), 4, 32), dtype)
    k, v = random(g, (int(cu_k[-1]), 2, 32), dtype), random(g, (int(cu_k[-1]), 2, 32), dtype)
    dout = random(g, q.shape, dtype)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = flash_attn_varlen_func(*leaves, cu_q, cu_k, max(q_lens), max(kv_lens), causal=True)
    out.backward(dout)
    for b in range(len(q_lens)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        got = [leaves[0].grad[qs], leaves[1].grad[ks], leaves[2].grad[ks]]
        if q_lens[b] == 0 or kv_lens[b] == 0:  # nothing to attend: zero gradients
            for x in got:
                assert torch.equal(x, torch.zeros_like(x))
            continue
        args = (q[qs], k[ks], v[ks], dout[qs], 1 / math.sqrt(32), True, (-1, -1))
        check_grads(got, reference_grads(*args, torch.float64), reference_grads(*args, dtype),
                    dtype)


def test_packed_variants_give_the_unpacked_gradients():
    g = torch.Generator().manual_seed(2207)
    qkv = random(g, (2, 19, 3, 4, 16), torch.float32)
    dout = random(g, (2, 19, 4, 16), torch.float32)

    def grads_of(fn, *inputs):
        leaves = [x.clone().requires_grad_() for x in inputs]
        fn(*leaves).backward(dout)
        return [x.grad for x in leaves]

    dq, dk, dv = grads_of(lambda q, k, v: flash_attn_func(q, k, v, causal=True),
                          qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
    (dqkv,) = grads_of(lambda x: flash_attn_qkvpacked_func(x, causal=True), qkv)
    assert torch.equal(dqkv, torch.stack([dq, dk, dv], dim=2))
    dq2, dkv = grads_of(lambda q, kv: flash_attn_kvpacked_func(q, kv, causal=True),
                        qkv[:, :, 0], qkv[:, :, 1:])
    assert torch.equal(dq2, dq) and torch.equal(dkv, torch.stack([dk, dv], dim=2))
    cu = torch.tensor([0, 19, 38], dtype=torch.int32)
    (dvar,) = grads_of(lambda x: flash_attn_varlen_qkvpacked_func(x, cu, 19, causal=True)
                       .view(2, 19, 4, 16), qkv.reshape(38, 3, 4, 16))
    # Two sequences of 19 run the dense batch's tiles; rounding may differ, not more.
    torch.testing.assert_close(dvar.view(2, 19, 3, 4, 16), dqkv, rtol=1e-5, atol=1e-6)


def test_gradcheck_float32():
    # The CPU path takes float32 at most (no float64): finite differences of step 1e-2 in float32
    # are good to ~1e-4 relative here; a wrong term (dropping D) is off by ~0.1.
    g = torch.Generator().manual_seed(2208)
    inputs = [random(g, (1, 5, 2, 8), torch.float32).requires_grad_(),
              random(g, (1, 7, 1, 8), torch.float32).requires_grad_(),
              random(g, (1, 7, 1, 8), torch.float32).requires_grad_()]
    with warnings.catch_warnings():  # "not a double precision floating point": known
        warnings.simplefilter("ignore", UserWarning)
        assert torch.autograd.gradcheck(
            lambda q, k, v: flash_attn_func(q, k, v, causal=True, window_size=(3, -1)), inputs,
            eps=1e-2, atol=2e-3, rtol=2e-3)


def test_deterministic_backward_is_bit_identical():
    g = torch.Generator().manual_seed(2209)
    q, k, v = (random(g, (2, 70, 8, 32), torch.bfloat16) for _ in range(3))
    dout = random(g, q.shape, torch.bfloat16)
    runs = []
    for _ in range(2):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        flash_attn_func(*leaves, causal=True, deterministic=True).backward(dout)
        runs.append([x.grad for x in leaves])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_grad_of_some_inputs_only_and_no_grad_forward_unchanged():
    g = torch.Generator().manual_seed(2210)
    q, k, v = (random(g, (1, 12, 2, 16), torch.float32) for _ in range(3))
    with torch.no_grad():
        plain = flash_attn_func(q, k, v)
    kk = k.clone().requires_grad_()
    out = flash_attn_func(q, kk, v)
    assert torch.equal(out.detach(), plain)
    out.sum().backward()  # an expanded (stride-0) dout
    assert kk.grad is not None and torch.isfinite(kk.grad).all()
    assert kk.grad.abs().max() > 0


def _grads_of_causal_attention(wrap):
    g = torch.Generator().manual_seed(2211)
    q, k, v = (random(g, (1, 23, 2, 16), torch.float32) for _ in range(3))
    dout = random(g, q.shape, torch.float32)

    def attn(a, b, c):
        return flash_attn_func(a, b, c, causal=True)

    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    wrap(attn)(*leaves).backward(dout)
    return [x.grad for x in leaves]


def test_activation_checkpointing_recomputes_through_the_operator():
    plain = _grads_of_causal_attention(lambda f: f)
    ckpt = _grads_of_causal_attention(
        lambda f: lambda *x: torch.utils.checkpoint.checkpoint(f, *x, use_reentrant=False))
    for x, y in zip(plain, ckpt):
        assert torch.equal(x, y)


def test_compile_traces_forward_and_backward():
    plain = _grads_of_causal_attention(lambda f: f)
    compiled = _grads_of_causal_attention(
        lambda f: torch.compile(f, backend="aot_eager", fullgraph=True))
    for x, y in zip(plain, compiled):
        assert torch.equal(x, y)


def test_refusals_name_the_argument():
    g = torch.Generator().manual_seed(2212)
    q = random(g, (2, 1, 4, 16), torch.float32).requires_grad_()
    cache = random(g, (4, 16, 2, 16), torch.float32)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    lens = torch.tensor([16, 20], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match=r"^block_table: the backward"):
        flash_attn_varlen_func(q[:, 0], cache, cache, torch.tensor([0, 1, 2], dtype=torch.int32),
                               None, 1, 32, block_table=table, seqused_k=lens)
    with pytest.raises(NotImplementedError, match=r"^q: requires grad, but "
                       r"flash_attn_with_kvcache is not differentiable"):
        flash_attn_with_kvcache(q, cache[:2], cache[:2])


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck missing")
def test_operators_pass_opcheck():
    g = torch.Generator().manual_seed(2213)
    q, k, v = random(g, (1, 9, 4, 16), torch.float32), random(g, (1, 13, 2, 16), torch.float32), \
        random(g, (1, 13, 2, 16), torch.float32)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    dout = random(g, out.shape, torch.float32)
    torch.library.opcheck(torch.ops.flashserve.bwd.default,
                          (dout, q, k, v, out, lse, None, None, True, -1, 0, False),
                          test_utils=("test_schema", "test_faketensor"))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    torch.library.opcheck(torch.ops.flashserve.fwd.default,
                          (*leaves, None, True, -1, -1, 1, True, False),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))
    # With the score modifiers (softcap, ALiBi slopes [h]): the same checks, and the gradient.
    slopes = torch.rand(4, generator=g)
    torch.library.opcheck(torch.ops.flashserve.fwd.default,
                          (*leaves, None, True, -1, -1, 1, True, False, 1.5, slopes),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))
    out, lse = flash_attn_func(q, k, v, causal=True, softcap=1.5, alibi_slopes=slopes,
                               return_lse=True)
    torch.library.opcheck(torch.ops.flashserve.bwd.default,
                          (dout, q, k, v, out, lse, None, None, True, -1, 0, False, 1.5, slopes),
                          test_utils=("test_schema", "test_faketensor"))
