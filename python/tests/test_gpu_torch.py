"""flashserve on PyTorch CUDA tensors (bf16/fp16) against scaled_dot_product_attention computed in
float64 on upcast inputs with an explicit bottom-right mask, with FlashAttention's tolerance: our
max error <= 2 x the max error of SDPA run in the low precision itself + the rounding of an output
of size 0.3. lse against a float64 logsumexp. Skipped without torch or without a CUDA device."""

import math

import pytest

torch = pytest.importorskip("torch")

import flashserve  # noqa: E402
import flashserve._torch as fs_torch  # noqa: E402
from flashserve import flash_attn_func, flash_attn_varlen_func  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no CUDA device"),
    pytest.mark.skipif(torch.cuda.is_available() and not flashserve.cuda_available(),
                       reason="skipped: libflashserve_c was built without CUDA"),
]

DTYPES = [torch.bfloat16, torch.float16]
FLOOR = {torch.bfloat16: 2.0**-9, torch.float16: 2.0**-12}  # one ulp of 0.3


@pytest.fixture
def gen(seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def randn(gen, shape, dtype):
    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)


def visible(sq, sk, causal, window, device="cuda"):
    """[sq, sk] bool, bottom-right aligned: query t sits at position sk - sq + t."""
    left, right = window
    if causal:
        right = 0
    t = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    p = sk - sq + t
    mask = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= j >= p - left
    if right >= 0:
        mask &= j <= p + right
    return mask


def sdpa(q, k, v, scale, mask):
    """q [sq, h, d], k/v [sk, hk, d] of one sequence, in their own dtype -> [sq, h, dv]; rows that
    see no key are 0 (the contract; SDPA itself gives NaN there)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # query head h reads KV head h // group
    v = v.repeat_interleave(group, dim=1)
    # 4-D (1, h, s, d) so that a fused backend (memory-efficient attention: fp32 accumulation, P
    # rounded to the input dtype, like ours) can serve the low-precision run; float64 takes the math
    # backend.
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=mask, scale=scale)
    out = out[0].transpose(0, 1)
    return torch.where(mask.any(dim=1)[:, None, None], out, torch.zeros((), dtype=out.dtype,
                                                                         device=out.device))


def lse_ref(q, k, scale, mask):
    """float64 [h, sq]; -inf where nothing is visible."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    return torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1)


def reference(q, k, v, scale, causal, window):
    """One sequence: (float64 out, SDPA-in-low-precision out, float64 lse)."""
    if q.shape[0] == 0 or k.shape[0] == 0:  # SDPA backends may refuse empty sequences
        zeros = torch.zeros(q.shape[:2] + v.shape[2:], dtype=torch.float64, device=q.device)
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64,
                         device=q.device)
        return zeros, zeros.to(q.dtype), lse
    mask = visible(q.shape[0], k.shape[0], causal, window)
    exact = sdpa(q.double(), k.double(), v.double(), scale, mask)
    low = sdpa(q, k, v, scale, mask)
    return exact, low, lse_ref(q, k, scale, mask)


def check(out, exact, low, dtype, what="out"):
    assert not torch.isnan(out).any(), f"{what}: NaN (unwritten or poisoned) elements"
    err = (out.double() - exact).abs().max().item() if out.numel() else 0.0
    base = (low.double() - exact).abs().max().item() if out.numel() else 0.0
    assert err <= 2 * base + FLOOR[dtype], f"{what}: error {err:.3g} > 2 * {base:.3g} + floor"


def check_lse(lse, ref):
    masked = torch.isneginf(ref)
    assert torch.equal(torch.isneginf(lse), masked), "lse: -inf exactly where no key is visible"
    assert torch.allclose(lse.double()[~masked], ref[~masked], rtol=1e-4, atol=1e-3), \
        f"lse: max error {(lse.double()[~masked] - ref[~masked]).abs().max().item():.3g}"


DENSE = [  # batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window
    (2, 128, 128, 8, 8, 64, False, (-1, -1)),
    (2, 113, 203, 8, 2, 128, True, (-1, -1)),  # causal, seqlen_q < seqlen_k, GQA 4
    (1, 239, 113, 4, 1, 256, True, (-1, -1)),  # seqlen_q > seqlen_k: rows with no key; MQA
    (3, 1, 1000, 16, 2, 128, False, (-1, -1)),  # decode, GQA 8
    (2, 256, 512, 8, 4, 64, True, (100, -1)),  # causal sliding window
    (1, 17, 127, 4, 4, 256, False, (8, 8)),  # local window, odd lengths
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", DENSE)
def test_dense(gen, dtype, shape):
    b, sq, sk, h, hk, d, causal, window = shape
    q, k, v = randn(gen, (b, sq, h, d), dtype), randn(gen, (b, sk, hk, d), dtype), \
        randn(gen, (b, sk, hk, d), dtype)
    with torch.no_grad():
        out, lse = flash_attn_func(q, k, v, causal=causal, window_size=window, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.device == q.device and out.dtype == dtype
    assert out.shape == q.shape and lse.shape == (b, h, sq) and lse.dtype == torch.float32
    scale = 1 / math.sqrt(d)
    for i in range(b):
        exact, low, lse_i = reference(q[i], k[i], v[i], scale, causal, window)
        check(out[i], exact, low, dtype)
        check_lse(lse[i], lse_i)


def pack(gen, lens, heads, dim, dtype):
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32, device="cuda")
    cu[1:] = torch.tensor(lens, device="cuda").cumsum(0)
    return randn(gen, (int(cu[-1]), heads, dim), dtype), cu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_varlen(gen, dtype, causal, d):
    q_lens, kv_lens = [1, 17, 0, 127, 40], [300, 17, 5, 127, 0]
    h, hk = 8, 4
    q, cu_q = pack(gen, q_lens, h, d, dtype)
    k, cu_k = pack(gen, kv_lens, hk, d, dtype)
    v = randn(gen, tuple(k.shape), dtype)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(kv_lens),
                                      causal=causal, return_lse=True)
    assert out.shape == q.shape and lse.shape == (h, q.shape[0])
    qs, ks = cu_q.tolist(), cu_k.tolist()
    for i in range(len(q_lens)):
        exact, low, lse_i = reference(q[qs[i]:qs[i + 1]], k[ks[i]:ks[i + 1]], v[ks[i]:ks[i + 1]],
                                      1 / math.sqrt(d), causal, (-1, -1))
        check(out[qs[i]:qs[i + 1]], exact, low, dtype, f"out of sequence {i}")
        check_lse(lse[:, qs[i]:qs[i + 1]], lse_i)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [16, 256])
def test_paged_kv(gen, dtype, page_size):
    q_lens, kv_lens = [1, 1, 5, 64], [1000, 1, 37, 256]  # decodes and a prefill chunk
    h, hk, d = 16, 2, 128
    q, cu_q = pack(gen, q_lens, h, d, dtype)
    pages = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages) + 2
    # Slots no sequence uses (tails of last pages, the spare pages the padding points at) hold
    # NaN: a kernel that reads them shows it.
    k_cache = torch.full((num_pages, page_size, hk, d), float("nan"), dtype=dtype, device="cuda")
    v_cache = torch.full_like(k_cache, float("nan"))
    order = torch.randperm(num_pages, generator=gen, device="cuda").tolist()
    table = torch.full((len(kv_lens), max(pages)), order[-1], dtype=torch.int32)
    seqs, used = [], 0
    for b, n in enumerate(kv_lens):
        ks, vs = randn(gen, (n, hk, d), dtype), randn(gen, (n, hk, d), dtype)
        for i in range(pages[b]):
            page, rows = order[used], slice(i * page_size, min(n, (i + 1) * page_size))
            used += 1
            table[b, i] = page
            k_cache[page, :rows.stop - rows.start] = ks[rows]
            v_cache[page, :rows.stop - rows.start] = vs[rows]
        seqs.append((ks, vs))
    table = table.cuda()
    seqused = torch.tensor(kv_lens, dtype=torch.int32, device="cuda")
    out, lse = flash_attn_varlen_func(q, k_cache, v_cache, cu_q, None, max(q_lens), max(kv_lens),
                                      causal=True, return_lse=True, block_table=table,
                                      seqused_k=seqused)
    qs = cu_q.tolist()
    for i, (ks, vs) in enumerate(seqs):
        exact, low, lse_i = reference(q[qs[i]:qs[i + 1]], ks, vs, 1 / math.sqrt(d), True, (-1, -1))
        check(out[qs[i]:qs[i + 1]], exact, low, dtype, f"out of sequence {i}")
        check_lse(lse[:, qs[i]:qs[i + 1]], lse_i)


SPLIT = [  # batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, num_splits
    (2, 1, 4000, 8, 1, 128, False, 0),  # long-context decode: the library chooses the split
    (2, 1, 4000, 8, 1, 128, False, 5),
    (1, 70, 40, 4, 2, 64, True, 5),  # one key block over 5 splits (4 empty); 30 rows see no key
    (3, 33, 700, 8, 8, 256, True, 3),  # prefill chunk over a cached prefix
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SPLIT)
def test_split_kv(gen, monkeypatch, dtype, shape):
    """Split-KV and its combine, with the workspace the package allocates (the only caller of the
    automatic split, num_splits 0, that passes one): the allocation shows that the call split."""
    b, sq, sk, h, hk, d, causal, num_splits = shape
    workspace = []
    allocate = fs_torch.empty  # the PyTorch path's allocator (conftest.py poisons through it)

    def recording(like, dims, kind=None):
        if kind == torch.uint8:
            workspace.append(dims[0])
        return allocate(like, dims, kind)

    monkeypatch.setattr(fs_torch, "empty", recording)
    q, k, v = randn(gen, (b, sq, h, d), dtype), randn(gen, (b, sk, hk, d), dtype), \
        randn(gen, (b, sk, hk, d), dtype)
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True, num_splits=num_splits)
    assert len(workspace) == 1 and workspace[0] > 0, "the call did not split"
    for i in range(b):
        exact, low, lse_i = reference(q[i], k[i], v[i], 1 / math.sqrt(d), causal, (-1, -1))
        check(out[i], exact, low, dtype)
        check_lse(lse[i], lse_i)


def test_runs_on_the_current_stream(gen):
    """q is written on a side stream behind a long sleep; if flashserve did not issue its work on
    that (current) stream it would read the NaN that q holds before."""
    if not hasattr(torch.cuda, "_sleep"):
        pytest.skip("torch.cuda._sleep is not available")
    dtype = torch.bfloat16
    src, k, v = (randn(gen, (2, 64, 4, 64), dtype) for _ in range(3))
    q = torch.full_like(src, float("nan"))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        q.copy_(src)
        out = flash_attn_func(q, k, v, causal=True)
    side.synchronize()
    for i in range(2):
        exact, low, _ = reference(src[i], k[i], v[i], 1 / 8, True, (-1, -1))
        check(out[i], exact, low, dtype)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_another_device(gen):
    dtype = torch.float16
    q, k, v = (randn(gen, (1, 33, 4, 64), dtype).to("cuda:1") for _ in range(3))
    with torch.cuda.device(0):
        out = flash_attn_func(q, k, v)
    assert out.device == q.device
    exact, low, _ = reference(q[0], k[0], v[0], 1 / 8, False, (-1, -1))
    check(out[0], exact, low, dtype)


def check_autograd_against_float64(gen, d, causal, dtype=torch.bfloat16):
    """flash_attn_func's gradients on CUDA at head dim d (GQA 4/2, odd lengths, q_len < kv_len)
    against PyTorch's autograd of a naive attention in float64, with the tolerance of the same
    naive attention's autograd in dtype (test_cpu_torch_autograd's reference); and under
    torch.no_grad() the forward alone, the same out."""
    from test_cpu_torch_autograd import check_grads, reference_grads  # skips without the API

    b, sq, sk, h, hk = 2, 77, 130, 4, 2
    q = randn(gen, (b, sq, h, d), dtype).requires_grad_()
    k, v = (randn(gen, (b, sk, hk, d), dtype).requires_grad_() for _ in range(2))
    out = flash_attn_func(q, k, v, causal=causal)
    dout = randn(gen, tuple(out.shape), dtype)
    out.backward(dout)
    for i in range(b):
        args = [x[i].detach().cpu() for x in (q, k, v, dout)] + [d**-0.5, causal, (-1, -1)]
        exact = reference_grads(*args, torch.float64)
        low = reference_grads(*args, dtype)
        check_grads([x.grad[i].cpu() for x in (q, k, v)], exact, low, dtype)
    with torch.no_grad():
        again = flash_attn_func(q, k, v, causal=causal)
    assert again.grad_fn is None and torch.equal(again, out.detach())


@pytest.mark.parametrize("causal", [False, True])
def test_autograd_matches_float64_on_cuda(gen, causal):
    """The CUDA backward through autograd (the default family: sm90 on an H100/H200 build with
    90a, else sm80; FLASHSERVE_BWD_KERNEL forces one) at head dim 64:
    check_autograd_against_float64."""
    check_autograd_against_float64(gen, 64, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_eager_training_path_matches_the_operators(gen, causal):
    """flash_attn_func's eager gradient path (_autograd.DenseFunction: an autograd Function over
    the host fast paths, _torch._dense and _torch.fast_backward) against the same call through
    the custom operators and their registered autograd (what torch.compile traces): the same out
    and lse, and, deterministic, bit-identical dq, dk, dv. The losses: a weighted sum of out, one
    of out and the LSE (dlse), and out.sum() (a gradient of stride 0, which the fast path makes
    contiguous); a window beside the full rows. The float64 test above checks the values."""
    b, sq, sk, h, hk, d = 2, 77, 130, 4, 2, 128
    shapes = ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d))
    inputs = [randn(gen, shape, torch.bfloat16) for shape in shapes]
    w_out = randn(gen, (b, sq, h, d), torch.bfloat16)
    w_lse = torch.randn((b, h, sq), generator=gen, device="cuda")
    losses = {"out": lambda out, lse: (out * w_out).float().sum(),
              "out+lse": lambda out, lse: (out * w_out).float().sum() + (lse * w_lse).sum(),
              "sum": lambda out, lse: out.sum()}
    for window, loss in (((-1, -1), "out"), ((40, 7), "out+lse"), ((-1, -1), "sum")):
        runs = []
        for path in ("eager", "operators"):
            q, k, v = (x.clone().requires_grad_() for x in inputs)
            if path == "eager":
                out, lse = flash_attn_func(q, k, v, causal=causal, window_size=window,
                                           deterministic=True, return_lse=True)
                assert type(out.grad_fn).__name__ == "DenseFunctionBackward", out.grad_fn
            else:
                left, right = fs_torch._window_pair(window)
                out, lse = torch.ops.flashserve.fwd(q, k, v, None, causal, left, right, 0, True,
                                                    True)
            losses[loss](out, lse).backward()
            runs.append((out.detach(), lse.detach(), q.grad, k.grad, v.grad))
        for name, eager, ops in zip(("out", "lse", "dq", "dk", "dv"), *runs):
            assert torch.equal(eager, ops), (window, loss, name)
        assert all(torch.isfinite(g).all() and g.abs().max() > 0 for g in runs[0][2:])


@pytest.mark.parametrize("causal", [False, True])
def test_eager_varlen_training_path_matches_the_operators(gen, causal):
    """flash_attn_varlen_func's eager gradient path (_autograd.VarlenFunction) against the
    operators' (flashserve::varlen_fwd and its autograd), deterministic: the same out and lse and
    bit-identical gradients, with sequences of odd and empty lengths, a loss on the LSE and a
    seqused_k (keys past it get a zero gradient on both paths)."""
    q_lens, kv_lens = [1, 17, 0, 127, 40], [300, 17, 5, 127, 33]
    h, hk, d = 8, 4, 128
    q0, cu_q = pack(gen, q_lens, h, d, torch.bfloat16)
    k0, cu_k = pack(gen, kv_lens, hk, d, torch.bfloat16)
    v0 = randn(gen, tuple(k0.shape), torch.bfloat16)
    w_out = randn(gen, tuple(q0.shape), torch.bfloat16)
    w_lse = torch.randn((h, q0.shape[0]), generator=gen, device="cuda")
    used = torch.tensor([250, 17, 5, 100, 33], dtype=torch.int32, device="cuda")
    for seqused_k, with_lse in ((None, False), (used, True)):
        runs = []
        for path in ("eager", "operators"):
            q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
            if path == "eager":
                out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(kv_lens),
                                                  causal=causal, deterministic=True,
                                                  return_lse=True, seqused_k=seqused_k)
                assert type(out.grad_fn).__name__ == "VarlenFunctionBackward", out.grad_fn
            else:
                out, lse = torch.ops.flashserve.varlen_fwd(
                    q, k, v, cu_q, cu_k, max(q_lens), max(kv_lens), None, causal, -1,
                    0 if causal else -1, True, None, seqused_k, 0, True)
            loss = (out * w_out).float().sum()
            if with_lse:
                loss = loss + (torch.where(torch.isfinite(lse), lse, 0) * w_lse).sum()
            loss.backward()
            runs.append((out.detach(), lse.detach(), q.grad, k.grad, v.grad))
        for name, eager, ops in zip(("out", "lse", "dq", "dk", "dv"), *runs):
            assert torch.equal(eager, ops), (seqused_k is not None, name)
        assert all(torch.isfinite(g).all() and g.abs().max() > 0 for g in runs[0][2:])


def test_errors(gen):
    q, k, v = (randn(gen, (1, 16, 2, 64), torch.bfloat16) for _ in range(3))
    with pytest.raises(ValueError, match=r"^k: dtype float16 differs from q's bfloat16"):
        flash_attn_func(q, k.half(), v)
    with pytest.raises(ValueError, match=r"^k: must be on the same device as q"):
        flash_attn_func(q, k.cpu(), v)
    cu = torch.tensor([0, 16], dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: dtype int64 is not supported"):
        flash_attn_varlen_func(q[0], k[0], v[0], cu, cu.int(), 16, 16)
    with pytest.raises(NotImplementedError, match=r"^dropout_p"):
        flash_attn_func(q, k, v, dropout_p=0.1)



# Score modifiers (softcap, ALiBi) on the CUDA forward, against a float64 reference of the
# contract's definition (flashserve/attention.h): s = scale q.k; s = softcap tanh(s / softcap);
# s -= slope(b, h) |p - j| with p = sk - sq + t; then the mask. The kernel's tanh is within 1e-6
# relative (src/attention/sm80/score_mod.h), far below the inputs' bf16/fp16 rounding, so the
# bound is the one of every test here: 2 x the error of the same computation in the low precision
# (scores in float32 from the rounded inputs, probabilities rounded to the dtype as the kernel
# does) + one ulp of 0.3.

MODIFIERS = {  # name: (softcap, alibi slopes: None, "head" [h] or "batch" [b, h])
    "softcap": (5.0, None),
    "alibi": (0.0, "head"),
    "alibi_batch": (0.0, "batch"),
    "both": (30.0, "batch"),
}


def slopes_for(gen, kind, b, h):
    if kind is None:
        return None
    shape = (h,) if kind == "head" else (b, h)
    return 0.05 + 0.75 * torch.rand(shape, generator=gen, device="cuda", dtype=torch.float32)


def modified_reference(q, k, v, scale, causal, window, softcap, slopes):
    """One sequence, q [sq, h, d], k/v [sk, hk, d], slopes [h] or None: (float64 out, low-precision
    out, float64 lse [h, sq])."""
    sq, sk, h = q.shape[0], k.shape[0], q.shape[1]
    group = h // k.shape[1]
    mask = visible(sq, sk, causal, window)

    def run(qq, kk, vv, ftype, out_dtype):
        kk = kk.repeat_interleave(group, dim=1).to(ftype)
        vv = vv.repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", qq.to(ftype), kk) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        if slopes is not None:
            p = (sk - sq + torch.arange(sq, device=q.device))[:, None]
            dist = (p - torch.arange(sk, device=q.device)[None, :]).abs().to(ftype)
            s = s - slopes.to(ftype)[:, None, None] * dist[None]
        s = s.masked_fill(~mask[None], float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        prob = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows that see nothing: 0
        out = torch.einsum("hqk,khd->qhd", prob.to(out_dtype), vv.to(out_dtype))
        return out, lse

    exact, lse = run(q, k, v, torch.float64, torch.float64)
    low, _ = run(q, k, v, torch.float32, q.dtype)
    return exact, low, lse


DENSE_MODIFIED = [  # batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, window, splits
    (2, 128, 128, 8, 8, 64, False, (-1, -1), 1),  # no mask: the masked tiles all the same
    (2, 113, 203, 8, 2, 128, True, (-1, -1), 1),  # causal, seqlen_q < seqlen_k, GQA 4
    (1, 239, 113, 4, 1, 256, True, (-1, -1), 1),  # rows with no key; MQA
    (3, 1, 1000, 16, 2, 128, False, (-1, -1), 3),  # decode, GQA 8, split-KV
    (2, 256, 512, 8, 4, 64, True, (100, -1), 1),  # causal sliding window
    (2, 64, 1500, 8, 2, 256, True, (-1, -1), 3),  # a chunk split over its keys
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", DENSE_MODIFIED)
@pytest.mark.parametrize("modifier", sorted(MODIFIERS))
def test_score_modifier_dense(gen, dtype, shape, modifier):
    b, sq, sk, h, hk, d, causal, window, splits = shape
    softcap, kind = MODIFIERS[modifier]
    q, k, v = randn(gen, (b, sq, h, d), dtype), randn(gen, (b, sk, hk, d), dtype), \
        randn(gen, (b, sk, hk, d), dtype)
    slopes = slopes_for(gen, kind, b, h)
    with torch.no_grad():
        out, lse = flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                   alibi_slopes=slopes, num_splits=splits, return_lse=True)
    assert out.shape == q.shape and lse.shape == (b, h, sq)
    scale = 1 / math.sqrt(d)
    for i in range(b):
        s_i = None if slopes is None else (slopes if slopes.dim() == 1 else slopes[i])
        exact, low, lse_i = modified_reference(q[i], k[i], v[i], scale, causal, window, softcap,
                                               s_i)
        check(out[i], exact, low, dtype)
        check_lse(lse[i], lse_i)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("modifier", sorted(MODIFIERS))
def test_score_modifier_varlen_and_paged_cache(gen, dtype, modifier):
    """Varlen (with an empty sequence and a decode row: a decode launch beside a prefill launch),
    then a paged KV cache of 16-key pages through flash_attn_with_kvcache."""
    softcap, kind = MODIFIERS[modifier]
    lens_q, lens_k, h, hk, d = [33, 0, 1, 200], [33, 0, 513, 260], 8, 2, 128
    q, cu_q = pack(gen, lens_q, h, d, dtype)
    k, cu_k = pack(gen, lens_k, hk, d, dtype)
    v = randn(gen, k.shape, dtype)
    slopes = slopes_for(gen, kind, len(lens_q), h)
    with torch.no_grad():
        out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                          causal=True, softcap=softcap, alibi_slopes=slopes,
                                          return_lse=True)
    scale = 1 / math.sqrt(d)
    for i in range(len(lens_q)):
        qs, ks = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        s_i = None if slopes is None else (slopes if slopes.dim() == 1 else slopes[i])
        exact, low, lse_i = modified_reference(q[qs], k[ks], v[ks], scale, True, (-1, -1),
                                               softcap, s_i)
        check(out[qs], exact, low, dtype)
        check_lse(lse[:, qs], lse_i)

    # Paged cache: 3 sequences of cached keys, 16-key pages in shuffled order, 4 queries each.
    b, page, cached = 3, 16, [70, 5, 300]
    pages_per = [(n + page - 1) // page for n in cached]
    order = torch.randperm(sum(pages_per), generator=gen, device="cuda").int()
    table = torch.zeros(b, max(pages_per), dtype=torch.int32, device="cuda")
    at = 0
    for i, n in enumerate(pages_per):
        table[i, :n] = order[at:at + n]
        at += n
    k_cache = randn(gen, (sum(pages_per), page, hk, d), dtype)
    v_cache = randn(gen, (sum(pages_per), page, hk, d), dtype)
    qc = randn(gen, (b, 4, h, d), dtype)
    lengths = torch.tensor(cached, dtype=torch.int32, device="cuda")
    slopes = slopes_for(gen, kind, b, h)
    with torch.no_grad():
        out, lse = flashserve.flash_attn_with_kvcache(
            qc, k_cache, v_cache, cache_seqlens=lengths, block_table=table, causal=True,
            softcap=softcap, alibi_slopes=slopes, return_softmax_lse=True)
    for i in range(b):
        rows = table[i, :pages_per[i]].long()
        ks = k_cache[rows].reshape(-1, hk, d)[:cached[i]]
        vs = v_cache[rows].reshape(-1, hk, d)[:cached[i]]
        s_i = None if slopes is None else (slopes if slopes.dim() == 1 else slopes[i])
        exact, low, lse_i = modified_reference(qc[i], ks, vs, scale, True, (-1, -1), softcap,
                                               s_i)
        check(out[i], exact, low, dtype)
        check_lse(lse[i], lse_i)


def test_score_modifier_autograd_is_refused_on_cuda(gen):
    """The CUDA backward lacks softcap and ALiBi: a CUDA call that wants gradients is refused by
    the modifier's name before the forward runs, never differentiated without it."""
    q, k, v = (randn(gen, (1, 16, 2, 64), torch.bfloat16) for _ in range(3))
    slopes = torch.full((2,), 0.5, device="cuda")
    with pytest.raises(NotImplementedError, match=r"^softcap: .*no CUDA backward"):
        flash_attn_func(q.clone().requires_grad_(), k, v, softcap=30.0)
    with pytest.raises(NotImplementedError, match=r"^alibi_slopes: .*no CUDA backward"):
        flash_attn_func(q.clone().requires_grad_(), k, v, alibi_slopes=slopes)
    cu = torch.tensor([0, 16], dtype=torch.int32, device="cuda")
    with pytest.raises(NotImplementedError, match=r"^softcap: .*no CUDA backward"):
        flash_attn_varlen_func(q[0].clone().requires_grad_(), k[0], v[0], cu, cu, 16, 16,
                               softcap=30.0)
    # Without gradients the same calls run.
    with torch.no_grad():
        out = flash_attn_func(q.clone().requires_grad_(), k, v, softcap=30.0)
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 0, 3])
def test_nan_rows_like_pytorch(gen, dtype, num_splits):
    """Issue 9 on the GPU: a NaN in q, or in a key a row sees, makes that row (out and lse) NaN,
    through the sm80 softmax and, with splits, the combine kernel; rows that see no key stay zero
    with lse -inf; every other row is finite."""
    b, sq, sk, h, hk, d = 2, 40, 300, 4, 2, 64
    q, k, v = (randn(gen, (b, s, n, d), dtype) for s, n in ((sq, h), (sk, hk), (sk, hk)))
    q[0, 30, 3, 5] = float("nan")  # batch 0, row 30, head 3
    k[1, 280, 0, 7] = float("nan")  # batch 1, key 280 of KV head 0: causal rows 20.. see it
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True, num_splits=num_splits)
    torch.cuda.synchronize()
    expected = torch.zeros(b, sq, h, dtype=torch.bool, device="cuda")
    expected[0, 30, 3] = True
    expected[1, 280 - (sk - sq):, 0:2] = True  # query t sees key j iff j <= sk - sq + t
    nan_rows = out.isnan().all(dim=-1)
    assert torch.equal(nan_rows, expected)
    assert not out[~expected].isnan().any()
    assert torch.equal(lse.isnan(), expected.permute(0, 2, 1))
