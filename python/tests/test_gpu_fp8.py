"""FlashAttention-3's fp8 calls through flashserve.hopper on the sm90 fp8 kernel (PyTorch on an
sm_90 GPU): q, k, v float8_e4m3fn quantised per (sequence, KV head) with descale = amax / 448, a
bfloat16 out, against float64 attention of the dequantised inputs, per element within the bound
of tests/gpu/sm90_fp8_attention_test.cc (the rounding of P to e4m3, the tensor cores' scores,
bfloat16's out; docs/fp8.md) and by RMS. Skipped, with the reason shown, without CUDA or an
sm_90 device. FLASHSERVE_FP8_ATTENTION=1 is set for every test until the kernel's default flips.
Also flash_attn_with_kvcache over float8_e4m3fn caches: FA3's all-e4m3 call on a dense cache
(the sm90 fp8 forward), a bfloat16 q over a paged e4m3 cache (sm80's fp8 KV kernels, with
FLASHSERVE_CUDA_FP8_KV=1), the appended codes checked byte for byte, the refusals by name, and
torch.compile / CUDA graphs. The argument checks that need no GPU: test_fp8_cpu.py and
test_kvcache_fp8_cpu.py."""

import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
if torch.cuda.get_device_capability() != (9, 0):
    pytest.skip(f"the fp8 kernel is sm90's; this device is sm_"
                f"{''.join(map(str, torch.cuda.get_device_capability()))}",
                allow_module_level=True)
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this PyTorch has no float8_e4m3fn", allow_module_level=True)

from flashserve import hopper  # noqa: E402

FP8 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def fp8_on(monkeypatch):
    monkeypatch.setenv("FLASHSERVE_FP8_ATTENTION", "1")


def quantise(x, descale):
    """x [b, s, h, d] float32 as e4m3 codes of x / descale of each (sequence, KV head) (descale
    [b, h_kv]; query head h belongs to KV head h // (h / h_kv))."""
    group = x.shape[-2] // descale.shape[1]
    return (x / descale.repeat_interleave(group, dim=1)[:, None, :, None]).to(FP8)


def fp8_inputs(g, shape, group_rows, hk, with_descale):
    """N(0, 1) values with 0.1% N(0, 10^2) outliers; codes and descale (rows, hk) = amax / 448 per
    (sequence, KV head), or the values rounded as they are and descale None."""
    x = torch.randn(shape, generator=g, device="cuda")
    x = torch.where(torch.rand(shape, generator=g, device="cuda") < 1e-3, 10 * x, x)
    if not with_descale:
        return x.to(FP8), None
    h = shape[-2]
    amax = group_rows(x.abs().amax(dim=-1)).reshape(-1, hk, h // hk).amax(dim=-1)
    descale = (amax / 448).clamp_min(2.0**-20).float()
    return x, descale


def dense_rows(a):  # [b, s, h] -> [b, h] of maxima over s
    return a.amax(dim=1)


def check_bound(out, lse, q, k, v, qd, kd, vd, scale, causal, window, label):
    """One sequence: q [sq, h, d], k, v [sk, hk, d] codes; descales per KV head [hk] (None: 1).
    FlashAttention-style bottom-right masks."""
    sq, h, d = q.shape
    sk, hk = k.shape[0], k.shape[1]
    group = h // hk
    ones = torch.ones(hk, dtype=torch.float64, device=q.device)
    qd, kd, vd = (ones if x is None else x.double() for x in (qd, kd, vd))
    qc, kc, vc = q.double(), k.double(), v.double()
    qf = qc * qd.repeat_interleave(group)[None, :, None]
    kf, vf = kc * kd[None, :, None], vc * vd[None, :, None]
    kx, vx = kf.repeat_interleave(group, dim=1), vf.repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", qf, kx) * scale
    t = torch.arange(sq, device=q.device)[:, None] + sk - sq
    j = torch.arange(sk, device=q.device)[None, :]
    mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    left, right = window
    if causal:
        right = 0
    if left >= 0:
        mask &= j >= t - left
    if right >= 0:
        mask &= j <= t + right
    s = s.masked_fill(~mask, -math.inf)
    seen = mask.any(dim=1)
    exact_lse = torch.logsumexp(s, dim=-1)  # [h, sq]
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    exact = torch.einsum("hqk,khd->qhd", p, vx)
    # The bound (sm90_fp8_attention_test.cc's): D = max_j sum_d |scale q_d k_jd| over the row's
    # keys, gamma_D widened by 2^-9 for the tensor cores' accumulation.
    gamma = d * 2.0**-24 / (1 - d * 2.0**-24) + 2.0**-9
    dot_abs = torch.einsum("qhd,khd->hqk", qc.abs(), kc.abs().repeat_interleave(group, dim=1))
    dot_abs = (dot_abs * scale * (qd * kd).repeat_interleave(group)[:, None, None]).amax(dim=-1)
    vmax = vf.abs().amax(dim=(0, 2)).repeat_interleave(group)[:, None, None]  # [h, 1, 1]
    score_err = torch.expm1(2 * gamma * dot_abs)[..., None]  # [h, sq, 1]
    x = exact.permute(1, 0, 2)  # [h, sq, d]
    bound = (2.0**-4 + 2.0**-18 * sk + score_err) * vmax + 2.0**-8 * x.abs() + \
        (2 * sk * 2.0**-24 + 1e-6) * vmax
    got = out.double().permute(1, 0, 2)
    rows = seen[None, :].expand(h, sq)
    assert not torch.isnan(got).any(), f"{label}: NaN (unwritten?) out"
    assert (got[~rows] == 0).all(), f"{label}: a row that sees no key is not 0"
    err = (got - x).abs()
    worst = (err / bound)[rows].max().item() if rows.any() else 0.0
    assert worst <= 1.0, f"{label}: error / bound {worst:.3g}"
    # A wrong key or column order errs by the output's own size: the RMS error must stay a small
    # share of the output's RMS (the kernel's measured ratio to its emulation is ~1, and the
    # emulation's RMS error is 1-2% of bf16-sized outputs: docs/fp8.md).
    if rows.any():
        rms_err = err[rows].pow(2).mean().sqrt().item()
        rms = x[rows].pow(2).mean().sqrt().item()
        assert rms_err <= 0.125 * rms + 1e-6, f"{label}: RMS error {rms_err:.3g} of {rms:.3g}"
    print(f"{label}: error / bound {worst:.3g}")
    if lse is not None:
        lse = lse.double()
        assert torch.isneginf(lse[~rows]).all(), f"{label}: lse of a row without keys"
        lb = 2.0**-9 * (dot_abs + 1) + 1e-5 * exact_lse.abs()
        lw = ((lse - exact_lse).abs() / lb)[rows].max().item() if rows.any() else 0.0
        assert lw <= 1.0, f"{label}: lse error / bound {lw:.3g}"


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 129, 129, 4, 1), (1, 1000, 7, 8, 8), (3, 17, 300, 8, 2)])
def test_dense_within_the_bound(seed, d, causal, shape):
    b, sq, sk, h, hk = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    qx, qd = fp8_inputs(g, (b, sq, h, d), dense_rows, hk, True)
    kx, kd = fp8_inputs(g, (b, sk, hk, d), dense_rows, hk, True)
    vx, vd = fp8_inputs(g, (b, sk, hk, d), dense_rows, hk, True)
    q, k, v = quantise(qx, qd), quantise(kx, kd), quantise(vx, vd)
    out, lse = hopper.flash_attn_func(q, k, v, causal=causal, q_descale=qd, k_descale=kd,
                                      v_descale=vd, return_attn_probs=True)
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, h, d)
    assert lse.dtype == torch.float32 and lse.shape == (b, h, sq)
    for i in range(b):
        check_bound(out[i], lse[i], q[i], k[i], v[i], qd[i], kd[i], vd[i], d**-0.5, causal,
                    (-1, -1), f"d{d} causal={causal} {shape} seq {i}")


@pytest.mark.parametrize("d", [64, 128])
def test_descales_none_mean_one(seed, d):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(2, 33, 4, d, generator=g, device="cuda").to(FP8)
    k = torch.randn(2, 65, 2, d, generator=g, device="cuda").to(FP8)
    v = torch.randn(2, 65, 2, d, generator=g, device="cuda").to(FP8)
    out = hopper.flash_attn_func(q, k, v, causal=True)
    ones = torch.ones(2, 2, device="cuda")
    same = hopper.flash_attn_func(q, k, v, causal=True, q_descale=ones, k_descale=ones,
                                  v_descale=ones)
    assert torch.equal(out, same)
    for i in range(2):
        check_bound(out[i], None, q[i], k[i], v[i], None, None, None, d**-0.5, True, (-1, -1),
                    f"d{d} no descales seq {i}")


@pytest.mark.parametrize("d", [64, 128, 256])
def test_varlen_gqa_causal_window_and_seqused_k(seed, d):
    """FA3's varlen layout with an empty and a one-query sequence; descales (batch, nheads_k)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    lens_q, lens_k, h, hk = [70, 0, 1, 200], [90, 5, 300, 200], 8, 2
    cu_q = torch.tensor([0] + lens_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + lens_k, device="cuda").cumsum(0).int()
    q = torch.randn(int(cu_q[-1]), h, d, generator=g, device="cuda").to(FP8)
    k = torch.randn(int(cu_k[-1]), hk, d, generator=g, device="cuda").to(FP8)
    v = torch.randn(int(cu_k[-1]), hk, d, generator=g, device="cuda").to(FP8)
    ds = [torch.rand(4, hk, generator=g, device="cuda") + 0.5 for _ in range(3)]
    used = torch.tensor([90, 5, 123, 200], dtype=torch.int32, device="cuda")
    for window in [(-1, -1), (37, 0)]:
        out, lse = hopper.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), seqused_k=used, causal=True,
            window_size=window, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2],
            return_attn_probs=True)
        assert out.dtype == torch.bfloat16 and lse.shape == (h, int(cu_q[-1]))
        for i in range(4):
            a, b = int(cu_q[i]), int(cu_q[i + 1])
            ka = int(cu_k[i])
            kb = ka + int(used[i])
            if a == b:
                continue
            check_bound(out[a:b], lse[:, a:b], q[a:b], k[ka:kb], v[ka:kb], ds[0][i], ds[1][i],
                        ds[2][i], d**-0.5, True, window, f"d{d} varlen {window} seq {i}")


def test_qkvpacked_and_expanded_descales(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(2, 100, 3, 4, 128, generator=g, device="cuda").to(FP8)
    scale = torch.tensor([0.5], device="cuda")
    packed = hopper.flash_attn_qkvpacked_func(qkv, causal=True, q_descale=scale.expand(2, 4),
                                              k_descale=scale.expand(2, 4),
                                              v_descale=scale.expand(2, 4))
    full = torch.full((2, 4), 0.5, device="cuda")
    plain = hopper.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True,
                                   q_descale=full, k_descale=full, v_descale=full)
    assert torch.equal(packed, plain)


def test_unsupported_options_are_refused_by_name(seed, monkeypatch):
    """What the sm90 fp8 kernel does not take, the library refuses naming it."""
    # 128/64 is a padded pair: with the padded kernels off, that refusal (naming q) would come
    # first; on, the fp8 forward's own (naming v) is what this checks.
    monkeypatch.setenv("FLASHSERVE_PADDED_HEAD_DIMS", "1")
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(1, 64, 2, 128, generator=g, device="cuda").to(FP8) for _ in range(3))
    with pytest.raises(NotImplementedError, match=r"^softcap: "):
        hopper.flash_attn_func(q, k, v, softcap=5.0)
    with pytest.raises(NotImplementedError, match=r"^num_splits: "):
        hopper.flash_attn_func(q, k, v, num_splits=2)
    with pytest.raises(NotImplementedError, match=r"^v: "):  # head_dim_v != head_dim
        hopper.flash_attn_func(q, k, v[..., :64].contiguous())
    import flashserve
    with pytest.raises(NotImplementedError, match=r"^alibi_slopes: "):
        flashserve.flash_attn_func(q, k, v, alibi_slopes=torch.ones(2, device="cuda"))
    cpu = torch.ones(1, 2)
    with pytest.raises(ValueError, match=r"^k_descale: must be on the same device as q"):
        hopper.flash_attn_func(q, k, v, k_descale=cpu)


def test_off_switch_is_named(seed, monkeypatch):
    monkeypatch.setenv("FLASHSERVE_FP8_ATTENTION", "0")
    q = torch.randn(1, 8, 2, 64, device="cuda").to(FP8)
    try:
        hopper.flash_attn_func(q, q, q)
    except NotImplementedError as e:  # off by default until the lead flips it
        assert str(e).startswith("q: ") and "FLASHSERVE_FP8_ATTENTION" in str(e)


def test_fp8_under_torch_compile_and_cuda_graphs(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(2, 128, 4, 128, generator=g, device="cuda").to(FP8) for _ in range(3))
    ds = torch.rand(2, 4, generator=g, device="cuda") + 0.5
    eager = hopper.flash_attn_func(q, k, v, causal=True, q_descale=ds, k_descale=ds,
                                   v_descale=ds)
    compiled = torch.compile(lambda *a: hopper.flash_attn_func(*a[:3], causal=True,
                                                               q_descale=a[3], k_descale=a[3],
                                                               v_descale=a[3]), fullgraph=True)
    assert torch.equal(compiled(q, k, v, ds), eager)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        hopper.flash_attn_func(q, k, v, causal=True, q_descale=ds, k_descale=ds, v_descale=ds)
        with torch.cuda.graph(graph, stream=stream):
            captured = hopper.flash_attn_func(q, k, v, causal=True, q_descale=ds, k_descale=ds,
                                              v_descale=ds)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


# ---------------------------------------------------------------- flash_attn_with_kvcache

def e4m3_codes(g, shape):
    """e4m3 codes of N(0, 1.5^2) values (the descales scale them)."""
    return (1.5 * torch.randn(shape, generator=g, device="cuda")).to(FP8)


def paged_cache(g, b, page, pages_per_seq, hk, d):
    """Pages in random order (two spare), as in the serving path's pool."""
    pages = b * pages_per_seq + 2
    kc, vc = e4m3_codes(g, (pages, page, hk, d)), e4m3_codes(g, (pages, page, hk, d))
    order = torch.randperm(pages, generator=g, device="cuda").int()
    return kc, vc, order[:b * pages_per_seq].reshape(b, pages_per_seq).contiguous()


def slots_of(table, page, b, positions):
    """(page, row) index tensors of positions of sequence b (table None: a dense cache row b)."""
    if table is None:
        return torch.full_like(positions, b), positions
    return table[b, positions // page].long(), positions % page


def check_append(before, after, new, table, page, lens):
    """The new codes at cache_seqlens[b] + i, bit for bit; every other byte unchanged."""
    before, after, new = before.view(torch.uint8), after.view(torch.uint8), new.view(torch.uint8)
    written = torch.zeros(after.shape[:2], dtype=torch.bool, device=after.device)
    for b in range(new.shape[0]):
        pos = int(lens[b]) + torch.arange(new.shape[1], device=after.device)
        slot = slots_of(table, page, b, pos)
        assert torch.equal(after[slot], new[b]), f"the new codes of sequence {b}"
        written[slot] = True
    assert torch.equal(after[~written], before[~written]), "the append wrote elsewhere"


def check_bf16_kernel(out, q, kc, vc, kd, vd, scale, causal, label):
    """One sequence of a bfloat16 q over dequantised e4m3 K/V [sk, hk, d] with descales [hk]:
    FlashAttention's criterion against float64, max|out - exact| <= 2 max|naive - exact| + 1e-3,
    naive being the computation in bfloat16 (P and out rounded to it): after the exact widening
    of the codes, the fp8 KV kernels' arithmetic is the bf16 kernels' (docs/fp8.md)."""
    sq, h, d = q.shape
    sk, hk = kc.shape[0], kc.shape[1]
    group = h // hk
    kf = (kc.double() * kd.double()[None, :, None]).repeat_interleave(group, dim=1)
    vf = (vc.double() * vd.double()[None, :, None]).repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kf) * scale
    if causal:
        t = torch.arange(sq, device=q.device)[:, None] + sk - sq
        s = s.masked_fill(torch.arange(sk, device=q.device)[None, :] > t, -math.inf)
    p = torch.softmax(s, dim=-1)
    exact = torch.einsum("hqk,khd->qhd", p, vf)
    naive = torch.einsum("hqk,khd->qhd", p.bfloat16().double(), vf).bfloat16().double()
    got = out.double()
    assert not torch.isnan(got).any(), f"{label}: NaN (unwritten?) out"
    err = (got - exact).abs().max().item()
    base = (naive - exact).abs().max().item()
    assert err <= 2 * base + 1e-3, f"{label}: error {err:.3g} > 2 * {base:.3g} + 1e-3"


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_fa3_fp8_dense_cache_within_the_bound(seed, d, causal):
    """FA3's fp8 KV-cache call: q, k_cache, v_cache, k, v float8_e4m3fn with descales, a dense
    cache with per-sequence lengths, new tokens appended; the sm90 fp8 forward reads the cache
    (dense K/V with seqused_k)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, sq, h, hk, cap = 3, 4, 8, 2, 300
    kc, vc = e4m3_codes(g, (b, cap, hk, d)), e4m3_codes(g, (b, cap, hk, d))
    q = e4m3_codes(g, (b, sq, h, d))
    kn, vn = e4m3_codes(g, (b, sq, hk, d)), e4m3_codes(g, (b, sq, hk, d))
    lens = torch.tensor([cap - sq, 0, 131], dtype=torch.int32, device="cuda")
    ds = [torch.rand(b, hk, generator=g, device="cuda") + 0.5 for _ in range(3)]
    k_before, v_before = kc.clone(), vc.clone()
    out, lse = hopper.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens,
                                              causal=causal, q_descale=ds[0], k_descale=ds[1],
                                              v_descale=ds[2], return_softmax_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, h, d)
    check_append(k_before, kc, kn, None, 0, lens)
    check_append(v_before, vc, vn, None, 0, lens)
    for i in range(b):
        n = int(lens[i]) + sq
        check_bound(out[i], lse[i], q[i], kc[i, :n], vc[i, :n], ds[0][i], ds[1][i], ds[2][i],
                    d**-0.5, causal, (-1, -1), f"kvcache d{d} causal={causal} seq {i}")


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("page", [16, 256])
def test_kvcache_bf16_q_over_an_e4m3_paged_cache(seed, d, page, monkeypatch):
    """An fp8 KV cache beside a bfloat16 q (the serving engine's): sm80's fp8 KV kernels, behind
    FLASHSERVE_CUDA_FP8_KV=1; a decode and a chunk, GQA 4, e4m3 tokens appended."""
    monkeypatch.setenv("FLASHSERVE_CUDA_FP8_KV", "1")
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, h, hk, pps = 3, 8, 2, -(-600 // page)
    for sq in (1, 7):
        kc, vc, table = paged_cache(g, b, page, pps, hk, d)
        q = torch.randn(b, sq, h, d, generator=g, device="cuda").bfloat16()
        kn, vn = e4m3_codes(g, (b, sq, hk, d)), e4m3_codes(g, (b, sq, hk, d))
        lens = torch.tensor([pps * page - sq, 0, 37], dtype=torch.int32, device="cuda")
        kd, vd = (torch.rand(b, hk, generator=g, device="cuda") + 0.5 for _ in range(2))
        k_before, v_before = kc.clone(), vc.clone()
        out, lse = flashserve_kvcache(q, kc, vc, kn, vn, lens, table, kd, vd)
        assert out.dtype == torch.bfloat16
        check_append(k_before, kc, kn, table, page, lens)
        check_append(v_before, vc, vn, table, page, lens)
        for i in range(b):
            n = int(lens[i]) + sq
            slot = slots_of(table, page, i, torch.arange(n, device="cuda"))
            k8 = kc.view(torch.uint8)[slot].view(FP8)
            v8 = vc.view(torch.uint8)[slot].view(FP8)
            check_bf16_kernel(out[i], q[i], k8, v8, kd[i], vd[i], d**-0.5, True,
                              f"fp8 KV d{d} page {page} sq {sq} seq {i}")


def flashserve_kvcache(q, kc, vc, kn, vn, lens, table, kd, vd):
    """flashserve's (FA2's) name, with the descales as keywords."""
    import flashserve
    return flashserve.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens,
                                              block_table=table, causal=True,
                                              return_softmax_lse=True, k_descale=kd,
                                              v_descale=vd)


def test_kvcache_fp8_refusals_by_name_leave_the_cache_unwritten(seed, monkeypatch):
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, hk, d, page = 2, 2, 128, 16
    kc, vc, table = paged_cache(g, b, page, 4, hk, d)
    q16 = torch.randn(b, 1, 4, d, generator=g, device="cuda").bfloat16()
    q8 = e4m3_codes(g, (b, 1, 4, d))
    kn, vn = e4m3_codes(g, (b, 1, hk, d)), e4m3_codes(g, (b, 1, hk, d))
    lens = torch.tensor([3, 17], dtype=torch.int32, device="cuda")
    ones = torch.ones(b, hk, device="cuda")
    before = kc.clone(), vc.clone()

    def refused(exception, match, q, k=kn, v=vn, **kwargs):
        with pytest.raises(exception, match=match):
            hopper.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True,
                                           **kwargs)
        torch.cuda.synchronize()
        assert torch.equal(kc.view(torch.uint8), before[0].view(torch.uint8))
        assert torch.equal(vc.view(torch.uint8), before[1].view(torch.uint8))

    monkeypatch.setenv("FLASHSERVE_CUDA_FP8_KV", "0")  # the switch off: named, with its name
    refused(NotImplementedError, r"^k_cache: .*FLASHSERVE_CUDA_FP8_KV=1", q16, page_table=table)
    monkeypatch.setenv("FLASHSERVE_CUDA_FP8_KV", "1")
    dense_k, dense_v = e4m3_codes(g, (b, 64, hk, d)), e4m3_codes(g, (b, 64, hk, d))
    with pytest.raises(NotImplementedError, match=r"^k_cache: the fp8 KV kernels read paged"):
        hopper.flash_attn_with_kvcache(q16, dense_k, dense_v, cache_seqlens=lens, causal=True)
    # FA3's all-e4m3 call: the sm90 fp8 forward reads dense K/V only.
    refused(NotImplementedError, r"^block_table: .*paged K/V is not supported yet", q8,
            page_table=table)
    refused(ValueError, r"^k_descale: must be on the same device as q", q16, page_table=table,
            k_descale=torch.ones(b, hk))
    refused(ValueError, r"^q_descale: applies to a float8_e4m3fn q, not a bfloat16 one", q16,
            page_table=table, q_descale=ones)
    refused(ValueError, r"^k: dtype bfloat16 differs from k_cache's float8_e4m3fn", q16,
            page_table=table, k=kn.bfloat16())
    cos = torch.ones(64, d // 2, device="cuda")
    refused(NotImplementedError, r"^rotary_cos: rotary embedding into a float8_e4m3fn cache",
            q16, page_table=table, rotary_cos=cos, rotary_sin=cos)


def test_kvcache_fp8_under_torch_compile_and_cuda_graphs(seed, monkeypatch):
    """The custom operator carries the descales: torch.compile(fullgraph=True) and a CUDA graph
    give the eager call's bits and append the same codes."""
    monkeypatch.setenv("FLASHSERVE_CUDA_FP8_KV", "1")
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, hk, d, page = 2, 2, 128, 16
    kc, vc, table = paged_cache(g, b, page, 8, hk, d)
    q = torch.randn(b, 1, 8, d, generator=g, device="cuda").bfloat16()
    kn, vn = e4m3_codes(g, (b, 1, hk, d)), e4m3_codes(g, (b, 1, hk, d))
    lens = torch.tensor([40, 77], dtype=torch.int32, device="cuda")
    kd, vd = (torch.rand(b, hk, generator=g, device="cuda") + 0.5 for _ in range(2))

    def step(q, kc, vc, kn, vn, lens, table, kd, vd):
        return hopper.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens,
                                              page_table=table, causal=True, k_descale=kd,
                                              v_descale=vd)

    caches = [(kc.clone(), vc.clone()) for _ in range(3)]
    eager = step(q, *caches[0], kn, vn, lens, table, kd, vd)
    compiled = torch.compile(step, fullgraph=True)(q, *caches[1], kn, vn, lens, table, kd, vd)
    assert torch.equal(compiled, eager)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    spare = (kc.clone(), vc.clone())
    with torch.cuda.stream(stream):
        step(q, *spare, kn, vn, lens, table, kd, vd)  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            captured = step(q, *caches[2], kn, vn, lens, table, kd, vd)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    for kc2, vc2 in caches[1:]:
        assert torch.equal(kc2.view(torch.uint8), caches[0][0].view(torch.uint8))
        assert torch.equal(vc2.view(torch.uint8), caches[0][1].view(torch.uint8))
