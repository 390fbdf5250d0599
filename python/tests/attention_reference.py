"""An independent NumPy reference of the attention contract, per sequence: materialise S (with
FlashAttention's softcap and ALiBi), apply the bottom-right mask, softmax, multiply by V. `float64` is the truth; `low_precision` is what a naive
kernel in the input dtype computes (S and softmax in float32, P rounded to the input dtype before
P @ V, the output rounded to it), whose error sets the tolerance as in FlashAttention's tests."""

import numpy as np


def visible(q_len, kv_len, causal, window):
    """[q_len, kv_len] bool: query t (at position kv_len - q_len + t) sees key j."""
    left, right = window
    if causal:
        right = 0
    t = np.arange(q_len)[:, None]
    j = np.arange(kv_len)[None, :]
    p = kv_len - q_len + t
    mask = np.ones((q_len, kv_len), dtype=bool)
    if left >= 0:
        mask &= j >= p - left
    if right >= 0:
        mask &= j <= p + right
    return mask


def scores(qh, kh, scale, softcap=0.0, slope=None):
    """The scores of one head, [q_len, kv_len]: scale q.k, then softcap * tanh(s / softcap) when
    softcap > 0, then minus slope * |p - j| (ALiBi, p = kv_len - q_len + t) when slope is given."""
    work = qh.dtype.type
    s = (qh @ kh.T) * work(scale)
    if softcap > 0:
        s = work(softcap) * np.tanh(s / work(softcap))
    if slope is not None:
        q_len, kv_len = s.shape
        p = kv_len - q_len + np.arange(q_len)[:, None]
        s = s - work(slope) * np.abs(p - np.arange(kv_len)[None, :]).astype(work)
    return s


def attention(q, k, v, scale, causal=False, window=(-1, -1), low_precision=None, softcap=0.0,
              slopes=None):
    """q [q_len, h_q, d], k [kv_len, h_kv, d], v [kv_len, h_kv, dv] of one sequence; softcap and
    slopes (ALiBi, [h_q] or None) as in scores(). Returns out [q_len, h_q, dv] and lse [h_q, q_len]
    (-inf, and a zero row, where nothing is visible). low_precision: None (float64) or a NumPy
    dtype to emulate a naive kernel in."""
    q_len, h_q, _ = q.shape
    kv_len, h_kv, dv = v.shape
    group = h_q // h_kv
    work = np.float64 if low_precision is None else np.float32
    mask = visible(q_len, kv_len, causal, window)
    seen = mask.any(axis=1)
    out = np.zeros((q_len, h_q, dv), dtype=work)
    lse = np.full((h_q, q_len), -np.inf)
    for h in range(h_q):
        qh = q[:, h].astype(work)
        kh = k[:, h // group].astype(work)
        vh = v[:, h // group].astype(work)
        s = scores(qh, kh, scale, softcap, None if slopes is None else slopes[h])
        s = np.where(mask, s, -np.inf)
        m = np.where(seen, s.max(axis=1, initial=-np.inf), 0.0).astype(work)
        e = np.exp(s - m[:, None])
        total = e.sum(axis=1)
        p = e / np.where(seen, total, 1.0)[:, None]
        if low_precision is not None:
            p = p.astype(low_precision).astype(work)
        out[:, h] = p @ vh
        with np.errstate(divide="ignore"):
            lse[h] = np.where(seen, m + np.log(np.where(seen, total, 1.0)), -np.inf)
    if low_precision is not None:
        out = out.astype(low_precision)
    return out.astype(np.float64), lse


def check_close(out, ref, naive, floor, what="out"):
    """FlashAttention's criterion: max |out - ref| <= 2 * max |naive - ref| + floor, where naive is
    the same computation done naively in the low precision. NaN anywhere fails."""
    out = np.asarray(out, dtype=np.float64)
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    assert not np.isnan(out).any(), f"{what}: {int(np.isnan(out).sum())} NaN (unwritten?) elements"
    err = np.abs(out - ref).max(initial=0.0)
    base = np.abs(np.asarray(naive, dtype=np.float64) - ref).max(initial=0.0)
    assert err <= 2 * base + floor, f"{what}: error {err:.3g} > 2 * {base:.3g} + {floor:g}"


def check_lse(lse, ref, rtol=1e-5, atol=1e-4):
    """lse in float32 against float64: -inf exactly where the reference has it, close elsewhere."""
    lse = np.asarray(lse, dtype=np.float64)
    assert lse.shape == ref.shape, f"lse: shape {lse.shape} != {ref.shape}"
    masked = np.isneginf(ref)
    assert np.array_equal(np.isneginf(lse), masked), "lse: -inf where a row sees no key, only there"
    assert np.allclose(lse[~masked], ref[~masked], rtol=rtol, atol=atol), \
        f"lse: max error {np.abs(lse[~masked] - ref[~masked]).max(initial=0.0):.3g}"
