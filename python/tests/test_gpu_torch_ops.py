"""PyTorch on CUDA, beyond the plain calls of test_gpu_torch.py: flash_attn_with_kvcache (the in-
place append with rotary, checked against the same computation written in PyTorch), the custom
operators under torch.compile(fullgraph=True) and torch.library.opcheck, CUDA-graph capture and
replay, the host fast path against the generic DLPack path, and the num_splits default on a long
decode. Skipped without torch or without a CUDA device."""

import math

import pytest

torch = pytest.importorskip("torch")

import flashserve  # noqa: E402
import flashserve._torch as fs_torch  # noqa: E402
from flashserve import attention as fs_attention  # noqa: E402
from flashserve import (flash_attn_func, flash_attn_varlen_func,  # noqa: E402
                        flash_attn_with_kvcache)
from test_gpu_torch import check, check_lse, randn, reference  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no CUDA device"),
    pytest.mark.skipif(torch.cuda.is_available() and not flashserve.cuda_available(),
                       reason="skipped: libflashserve_c was built without CUDA"),
]

DTYPES = [torch.bfloat16, torch.float16]
# One rounding of a rotation computed in float32 (the reference rotates in float64).
ROUND = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


@pytest.fixture
def gen(seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def rope(x, pos, cos, sin, interleaved):
    """x [n, h, d] float64 rotated at positions pos [n] (long): the pairs as complex numbers."""
    rd = 2 * cos.shape[1]
    c, s = cos[pos][:, None, :].double(), sin[pos][:, None, :].double()
    rot = torch.complex(c, s)
    out = x.clone()
    if interleaved:
        z = torch.complex(x[..., 0:rd:2], x[..., 1:rd:2]) * rot
        out[..., 0:rd:2], out[..., 1:rd:2] = z.real, z.imag
    else:
        half = rd // 2
        z = torch.complex(x[..., :half], x[..., half:rd]) * rot
        out[..., :half], out[..., half:rd] = z.real, z.imag
    return out


def make_cache(gen, layout, batch, capacity, hk, d, dtype):
    """(k_cache, v_cache, cache_batch_idx, block_table, slots(b, n) -> index tuple)."""
    if layout in ("contiguous", "batch_idx"):
        rows = batch + 3 if layout == "batch_idx" else batch
        kc = randn(gen, (rows, capacity, hk, d), dtype)
        vc = randn(gen, (rows, capacity, hk, d), dtype)
        row = torch.randperm(rows, generator=gen, device="cuda")[:batch].int() \
            if layout == "batch_idx" else torch.arange(batch, device="cuda", dtype=torch.int32)

        def slots(b, n):
            return (torch.full((n,), int(row[b]), device="cuda"), torch.arange(n, device="cuda"))
        return kc, vc, (row if layout == "batch_idx" else None), None, slots
    page = int(layout[len("paged"):])
    per_seq = -(-capacity // page)
    pages = batch * per_seq + 2
    kc, vc = randn(gen, (pages, page, hk, d), dtype), randn(gen, (pages, page, hk, d), dtype)
    table = torch.randperm(pages, generator=gen, device="cuda")[:batch * per_seq].int()
    table = table.reshape(batch, per_seq).contiguous()

    def slots(b, n):
        j = torch.arange(n, device="cuda")
        return (table[b, j // page].long(), j % page)
    return kc, vc, None, table, slots


KV_CASES = [  # batch, s_q, s_new, h, hk, d, rotary_dim, causal, window, layout
    (4, 1, 1, 32, 8, 128, 128, True, (-1, -1), "contiguous"),  # decode, GQA 4
    (3, 1, 1, 16, 2, 64, 64, True, (-1, -1), "paged16"),  # paged decode, GQA 8
    (2, 17, 17, 8, 8, 128, 64, True, (-1, -1), "paged256"),  # prefill chunk, partial rotary
    (3, 4, 2, 8, 1, 64, 32, False, (-1, -1), "batch_idx"),  # s_q != s_new, MQA, non-causal
    (2, 5, 5, 8, 2, 128, 0, True, (64, -1), "contiguous"),  # no rotary, sliding window
    (2, 1, 0, 8, 2, 64, 64, True, (-1, -1), "paged16"),  # no new tokens (rotary on q only)
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("case", KV_CASES)
def test_kvcache_against_pytorch(gen, dtype, interleaved, case):
    b, sq, s_new, h, hk, d, rd, causal, window, layout = case
    capacity = 700
    kc, vc, batch_idx, table, slots = make_cache(gen, layout, b, capacity, hk, d, dtype)
    lens = torch.randint(0, capacity - s_new + 1, (b,), generator=gen, device="cuda",
                         dtype=torch.int32)
    lens[0] = capacity - s_new  # fills the cache to its last slot
    q = randn(gen, (b, sq, h, d), dtype)
    kn, vn = randn(gen, (b, s_new, hk, d), dtype), randn(gen, (b, s_new, hk, d), dtype)
    cos = sin = None
    if rd:
        angles = torch.rand(capacity + sq, rd // 2, generator=gen, device="cuda")
        angles = (angles * 2 - 1) * math.pi
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    k_before, v_before = kc.clone(), vc.clone()
    out, lse = flash_attn_with_kvcache(
        q, kc, vc, kn if s_new else None, vn if s_new else None, rotary_cos=cos, rotary_sin=sin,
        cache_seqlens=lens, cache_batch_idx=batch_idx, block_table=table, causal=causal,
        window_size=window, rotary_interleaved=interleaved, return_softmax_lse=True)
    torch.cuda.synchronize()
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (b, h, sq)
    written = torch.zeros(kc.shape[:2], dtype=torch.bool, device="cuda")
    per_token = causal or window != (-1, -1)
    for i in range(b):
        n = int(lens[i])
        new = slots(i, n + s_new)
        new = (new[0][n:], new[1][n:])
        written[new] = True
        pos = n + torch.arange(s_new, device="cuda")
        k_rot = rope(kn[i].double(), pos, cos, sin, interleaved) if rd else kn[i].double()
        got = kc[new].double()
        assert torch.allclose(got, k_rot, rtol=ROUND[dtype], atol=ROUND[dtype]), \
            f"k of sequence {i}: max error {(got - k_rot).abs().max().item():.3g}"
        assert torch.equal(vc[new], vn[i])
        q_pos = n + (torch.arange(sq, device="cuda") if per_token else
                     torch.zeros(sq, dtype=torch.long, device="cuda"))
        q_rot = (rope(q[i].double(), q_pos, cos, sin, interleaved) if rd else q[i].double())
        everything = slots(i, n + s_new)
        keys, values = kc[everything], vc[everything]  # the prefix as it was + the checked new rows
        exact, low, lse_i = reference(q_rot.to(dtype), keys, values, 1 / math.sqrt(d), causal,
                                      window)
        check(out[i], exact, low, dtype, f"out of sequence {i}")
        if rd:  # q is rotated in float32 by the library, in float64 here: an ulp apart at times
            masked = torch.isneginf(lse_i)
            assert torch.equal(torch.isneginf(lse[i]), masked)
            assert torch.allclose(lse[i].double()[~masked], lse_i[~masked], rtol=1e-3, atol=1e-2)
        else:
            check_lse(lse[i], lse_i)
    assert torch.equal(kc[~written], k_before[~written]), "a slot outside the append changed"
    assert torch.equal(vc[~written], v_before[~written]), "a slot outside the append changed"


def test_kvcache_overflow_with_host_lengths_is_an_error(gen):
    kc, vc = (randn(gen, (2, 16, 2, 64), torch.bfloat16) for _ in range(2))
    q = randn(gen, (2, 1, 4, 64), torch.bfloat16)
    kn, vn = (randn(gen, (2, 2, 2, 64), torch.bfloat16) for _ in range(2))
    before = kc.clone()
    with pytest.raises(ValueError, match=r"^cache_seqlens: sequence 0 holds 15 keys; appending 2"):
        flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=15)
    torch.cuda.synchronize()
    assert torch.equal(kc, before)


def test_kvcache_overflow_on_the_device_never_writes_out_of_bounds(gen, monkeypatch):
    """Device-resident lengths are trusted (no host sync); an overflowing token is dropped, not
    written past the cache (the slots of the next cache row stay as they were). With
    FLASHSERVE_CHECK_INDICES=1 the same call is a ValueError."""
    kc, vc = (randn(gen, (2, 16, 2, 64), torch.bfloat16) for _ in range(2))
    q = randn(gen, (2, 1, 4, 64), torch.bfloat16)
    kn, vn = (randn(gen, (2, 3, 2, 64), torch.bfloat16) for _ in range(2))
    lens = torch.tensor([15, 5], dtype=torch.int32, device="cuda")
    before = kc.clone()
    flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens)
    torch.cuda.synchronize()
    assert torch.equal(kc[0, :15], before[0, :15]) and torch.equal(kc[0, 15], kn[0, 0])
    # Positions 16 and 17 of sequence 0 would land, out of bounds, on rows 0 and 1 of sequence 1.
    assert torch.equal(kc[1, :5], before[1, :5]), "an overflowing token was written past the row"
    assert torch.equal(kc[1, 5:8], kn[1]) and torch.equal(kc[1, 8:], before[1, 8:])
    monkeypatch.setenv("FLASHSERVE_CHECK_INDICES", "1")
    with pytest.raises(ValueError, match=r"^cache_seqlens: sequence 0 holds 15 keys"):
        flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens)


# ---------------------------------------------------------------- custom operators

def test_ops_are_registered_and_pass_opcheck(gen):
    q, k, v = (randn(gen, (2, 33, 4, 64), torch.bfloat16) for _ in range(3))
    torch.library.opcheck(torch.ops.flashserve.fwd.default,
                          (q, k, v, None, True, -1, 0, 0, True),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.flashserve.fwd.default,
                          (q, k, v, 0.1, False, 8, 8, 1, False),
                          test_utils=("test_schema", "test_faketensor"))
    kc, vc = (randn(gen, (2, 64, 4, 64), torch.bfloat16) for _ in range(2))
    lens = torch.tensor([3, 40], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.flashserve.with_kvcache.default,
                          (q[:, :1], kc, vc, k[:, :1], v[:, :1], None, None, lens, -1, None, None,
                           None, True, -1, 0, True, 0, True),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph(gen):
    """One dtype, and no other operation in the graphs: what is tested is the tracing through the
    operators (a graph break fails fullgraph=True), not Inductor's code generation (time)."""
    dtype = torch.bfloat16
    q, k, v = randn(gen, (2, 100, 8, 128), dtype), randn(gen, (2, 300, 2, 128), dtype), \
        randn(gen, (2, 300, 2, 128), dtype)

    def f(q, k, v):
        return flash_attn_func(q, k, v, causal=True, return_lse=True)

    compiled = torch.compile(f, fullgraph=True)
    out, lse = compiled(q, k, v)
    ref, ref_lse = f(q, k, v)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)

    cu = torch.tensor([0, 100, 200], dtype=torch.int32, device="cuda")
    cuk = torch.tensor([0, 300, 600], dtype=torch.int32, device="cuda")

    def g(q, k, v):
        return flash_attn_varlen_func(q, k, v, cu, cuk, 100, 300, causal=True)

    qv, kv, vv = q.reshape(200, 8, 128), k.reshape(600, 2, 128), v.reshape(600, 2, 128)
    assert torch.equal(torch.compile(g, fullgraph=True)(qv, kv, vv), g(qv, kv, vv))


def test_torch_compile_kvcache_mutates_the_cache(gen):
    dtype = torch.bfloat16
    b, h, hk, d, cap = 3, 16, 4, 128, 256
    kc, vc = randn(gen, (b, cap, hk, d), dtype), randn(gen, (b, cap, hk, d), dtype)
    q, kn, vn = randn(gen, (b, 1, h, d), dtype), randn(gen, (b, 1, hk, d), dtype), \
        randn(gen, (b, 1, hk, d), dtype)
    lens = torch.tensor([0, 17, 255], dtype=torch.int32, device="cuda")
    angles = torch.rand(cap, d // 2, generator=gen, device="cuda") * 6.0
    cos, sin = angles.cos(), angles.sin()

    def step(q, kc, vc, kn, vn, lens):
        return flash_attn_with_kvcache(q, kc, vc, kn, vn, rotary_cos=cos, rotary_sin=sin,
                                       cache_seqlens=lens, causal=True)

    kc2, vc2 = kc.clone(), vc.clone()
    out = torch.compile(step, fullgraph=True)(q, kc, vc, kn, vn, lens)
    ref = step(q, kc2, vc2, kn, vn, lens)
    assert torch.equal(out, ref)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2), "the compiled call did not append"
    assert not torch.equal(kc[2, 255], kc[2, 254])  # it did write the last slot


def capture(fn):
    """fn() captured in a CUDA graph after a warm-up on a side stream; returns (graph, output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.parametrize("shape", [(2, 257, 1000, 8, 2, 128, True),  # prefill
                                   (4, 1, 8000, 32, 8, 128, False)])  # decode: default splits
def test_cuda_graph_capture_and_replay(gen, shape):
    b, sq, sk, h, hk, d, causal = shape
    dtype = torch.bfloat16
    q, k, v = randn(gen, (b, sq, h, d), dtype), randn(gen, (b, sk, hk, d), dtype), \
        randn(gen, (b, sk, hk, d), dtype)
    graph, out = capture(lambda: flash_attn_func(q, k, v, causal=causal))
    for _ in range(2):  # new inputs in the captured buffers, then replay
        for x in (q, k, v):
            x.copy_(randn(gen, tuple(x.shape), dtype))
        graph.replay()
        expected = flash_attn_func(q, k, v, causal=causal)
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
        exact, low, _ = reference(q[0], k[0], v[0], 1 / math.sqrt(d), causal, (-1, -1))
        check(out[0], exact, low, dtype)


def test_cuda_graph_kvcache_decode_steps(gen):
    """A decode step (append with rotary + attention over a paged cache) captured once and replayed
    with new tokens and lengths, against the same step run eagerly on a copy of the cache."""
    dtype = torch.bfloat16
    b, h, hk, d, cap = 4, 32, 8, 128, 1024
    kc, vc, _, table, _ = make_cache(gen, "paged16", b, cap, hk, d, dtype)
    q, kn, vn = randn(gen, (b, 1, h, d), dtype), randn(gen, (b, 1, hk, d), dtype), \
        randn(gen, (b, 1, hk, d), dtype)
    lens = torch.zeros(b, dtype=torch.int32, device="cuda")
    angles = torch.rand(cap, d // 2, generator=gen, device="cuda") * 6.0
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def step(kc, vc):
        return flash_attn_with_kvcache(q, kc, vc, kn, vn, rotary_cos=cos, rotary_sin=sin,
                                       cache_seqlens=lens, block_table=table, causal=True,
                                       rotary_interleaved=False)

    graph, out = capture(lambda: step(kc, vc))
    for _ in range(3):
        lens.copy_(torch.randint(0, cap, (b,), generator=gen, device="cuda", dtype=torch.int32))
        for x in (q, kn, vn):
            x.copy_(randn(gen, tuple(x.shape), dtype))
        kc2, vc2 = kc.clone(), vc.clone()
        expected = step(kc2, vc2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
        assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


# ---------------------------------------------------------------- the host fast path

@pytest.mark.parametrize("return_lse", [False, True])
def test_fast_path_equals_the_generic_path(gen, return_lse):
    f16 = torch.float16
    q, k, v = randn(gen, (3, 70, 8, 64), f16), randn(gen, (3, 90, 4, 64), f16), \
        randn(gen, (3, 90, 4, 64), f16)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # non-default strides, last one 1
    for kwargs in (dict(causal=True), dict(window_size=(10, 3)), dict(softmax_scale=0.3),
                   dict(num_splits=3)):
        fast = flash_attn_func(q, k, v, return_lse=return_lse, **kwargs)
        generic, generic_lse = fs_attention._forward(q, k, v, varlen=False,
                                                     return_lse=return_lse, **kwargs)
        if return_lse:
            assert torch.equal(fast[0], generic) and torch.equal(fast[1], generic_lse)
        else:
            assert torch.equal(fast, generic) and generic_lse is None


@pytest.mark.parametrize("layout", ["contiguous", "batch_idx", "paged16"])
def test_kvcache_fast_path_equals_the_generic_path(gen, layout):
    dtype = torch.bfloat16
    b, h, hk, d, cap = 3, 16, 4, 128, 300
    kc, vc, batch_idx, table, _ = make_cache(gen, layout, b, cap, hk, d, dtype)
    q, kn, vn = randn(gen, (b, 2, h, d), dtype), randn(gen, (b, 2, hk, d), dtype), \
        randn(gen, (b, 2, hk, d), dtype)
    lens = torch.tensor([0, 150, 298], dtype=torch.int32, device="cuda")
    angles = torch.rand(cap, d // 4, generator=gen, device="cuda") * 6.0
    cos, sin = angles.cos(), angles.sin()
    kc2, vc2 = kc.clone(), vc.clone()
    kwargs = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens, cache_batch_idx=batch_idx,
                  block_table=table, softmax_scale=None, causal=True, window_size=(-1, -1),
                  rotary_interleaved=False, num_splits=0)
    fast, fast_lse = flash_attn_with_kvcache(q, kc, vc, kn, vn, return_softmax_lse=True, **kwargs)
    generic, generic_lse = fs_attention._with_kvcache(q, kc2, vc2, kn, vn, return_lse=True,
                                                      **kwargs)
    assert torch.equal(fast, generic) and torch.equal(fast_lse, generic_lse)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


def test_fast_path_errors_name_the_argument(gen):
    q, k, v = (randn(gen, (1, 16, 2, 64), torch.bfloat16) for _ in range(3))
    with pytest.raises(ValueError, match=r"^k: dtype float16 differs from q's bfloat16"):
        flash_attn_func(q, k.half(), v)
    with pytest.raises(ValueError, match=r"^num_splits: 4294967299 is outside"):
        flash_attn_func(q, k, v, num_splits=2**32 + 3)
    with pytest.raises(ValueError, match=r"^softmax_scale: 0 is not supported"):
        flash_attn_func(q, k, v, softmax_scale=0.0)
    with pytest.raises(ValueError, match=r"^q: expected rank 4"):
        flash_attn_func(q[0], k, v)
    with pytest.raises(NotImplementedError, match=r"^q: head_dim 36 is not supported by the "
                                                  r"CUDA kernels \(a multiple of 8 from 32 to 256\)"):
        flash_attn_func(q[..., :36].contiguous(), k[..., :36].contiguous(),
                        v[..., :36].contiguous())


def test_default_num_splits_splits_a_long_decode(gen, monkeypatch):
    """Batch 1 x 32k decode with default arguments: the library splits (a workspace is allocated),
    and the result matches the reference."""
    workspace = []
    allocate = fs_torch.empty

    def recording(like, dims, kind=None):
        if kind == torch.uint8:
            workspace.append(dims[0])
        return allocate(like, dims, kind)

    monkeypatch.setattr(fs_torch, "empty", recording)
    dtype = torch.bfloat16
    q, k, v = randn(gen, (1, 1, 32, 128), dtype), randn(gen, (1, 32768, 8, 128), dtype), \
        randn(gen, (1, 32768, 8, 128), dtype)
    out = flash_attn_func(q, k, v)
    assert workspace and workspace[0] > 0, "the default call did not split"
    exact, low, _ = reference(q[0], k[0], v[0], 1 / math.sqrt(128), False, (-1, -1))
    check(out[0], exact, low, dtype)


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_interleaved_cache_from_one_tensor(gen, paged):
    """Issue 9: k_cache, v_cache = kv[:, :, 0], kv[:, :, 1] (FlashAttention accepts it; element-
    disjoint views) on the device: the append writes the same cache as with separate tensors, and
    the attention over the strided caches matches the one over contiguous copies."""
    dtype = torch.bfloat16
    b, h, hk, d, cap, page = 2, 8, 2, 128, 64, 16
    rows, seq = (b * cap // page + 1, page) if paged else (b, cap)
    kv = randn(gen, (rows, seq, 2, hk, d), dtype)
    kc, vc = kv[:, :, 0], kv[:, :, 1]
    kc2, vc2 = kc.clone(), vc.clone()
    q = randn(gen, (b, 1, h, d), dtype)
    kn, vn = randn(gen, (b, 1, hk, d), dtype), randn(gen, (b, 1, hk, d), dtype)
    lens = torch.tensor([5, 40], dtype=torch.int32, device="cuda")
    table = (torch.randperm(rows, generator=gen, device="cuda")[:b * cap // page].int()
             .reshape(b, cap // page) if paged else None)
    out = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, block_table=table,
                                  causal=True)
    ref = flash_attn_with_kvcache(q, kc2, vc2, kn, vn, cache_seqlens=lens, block_table=table,
                                  causal=True)
    torch.cuda.synchronize()
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2), "the append differs"
    assert (out.float() - ref.float()).abs().max().item() <= 2.0**-7 * ref.float().abs().max()


def test_kvcache_two_appends_to_one_slot_refused_with_check_indices(gen, monkeypatch):
    """Issue 9: device indices are trusted (a duplicate cache_batch_idx row would race); with
    FLASHSERVE_CHECK_INDICES=1 they are checked like the CPU path's, before anything is written."""
    monkeypatch.setenv("FLASHSERVE_CHECK_INDICES", "1")
    dtype = torch.float16
    q = randn(gen, (2, 1, 4, 64), dtype)
    kc, vc = randn(gen, (3, 10, 2, 64), dtype), randn(gen, (3, 10, 2, 64), dtype)
    kn, vn = randn(gen, (2, 1, 2, 64), dtype), randn(gen, (2, 1, 2, 64), dtype)
    before = kc.clone()
    idx = torch.tensor([2, 2], dtype=torch.int32, device="cuda")
    lens = torch.tensor([1, 4], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"^cache_batch_idx: entries 0 and 1 are both row 2"):
        flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, cache_batch_idx=idx)
    pages = randn(gen, (4, 4, 2, 64), dtype)
    table = torch.tensor([[0, 2], [2, 1]], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"^block_table: entries \[0, 1\] and \[1, 0\] are both "
                                         r"page 2"):
        flash_attn_with_kvcache(q, pages, pages.clone(), kn, vn,
                                cache_seqlens=torch.tensor([7, 3], dtype=torch.int32,
                                                           device="cuda"),
                                block_table=table)
    torch.cuda.synchronize()
    assert torch.equal(kc, before)
