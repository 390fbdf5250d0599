"""flashserve's functions have flash_attn's signatures: FlashAttention-2 (flash_attn 2.8,
flash_attn/flash_attn_interface.py) in `flashserve`, FlashAttention-3 (hopper/
flash_attn_interface.py) in `flashserve.hopper`. The parameter lists below are the documented ones
(docs/python.md) written out by hand: checked by introspection (names, order, defaults, and which
are positional), then by calls that rely on the positional order, and FA3's refusals by name."""

import inspect

import numpy as np
import pytest

import flashserve
from flashserve import hopper
from attention_reference import attention, check_close

WINDOW = (-1, -1)
# flash_attn 2.8's parameters, in order, with their defaults (inspect.Parameter.empty: none).
E = inspect.Parameter.empty
_FA2_TAIL = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
             ("window_size", WINDOW), ("softcap", 0.0), ("alibi_slopes", None),
             ("deterministic", False), ("return_attn_probs", False)]
FA2 = {
    "flash_attn_func": [("q", E), ("k", E), ("v", E)] + _FA2_TAIL,
    "flash_attn_qkvpacked_func": [("qkv", E)] + _FA2_TAIL,
    "flash_attn_kvpacked_func": [("q", E), ("kv", E)] + _FA2_TAIL,
    "flash_attn_varlen_func": [("q", E), ("k", E), ("v", E), ("cu_seqlens_q", E),
                               ("cu_seqlens_k", E), ("max_seqlen_q", E), ("max_seqlen_k", E)]
    + _FA2_TAIL + [("block_table", None)],
    "flash_attn_varlen_qkvpacked_func": [("qkv", E), ("cu_seqlens", E), ("max_seqlen", E)]
    + _FA2_TAIL,
    "flash_attn_varlen_kvpacked_func": [("q", E), ("kv", E), ("cu_seqlens_q", E),
                                        ("cu_seqlens_k", E), ("max_seqlen_q", E),
                                        ("max_seqlen_k", E)] + _FA2_TAIL,
    "flash_attn_with_kvcache": [
        ("q", E), ("k_cache", E), ("v_cache", E), ("k", None), ("v", None), ("rotary_cos", None),
        ("rotary_sin", None), ("cache_seqlens", None), ("cache_batch_idx", None),
        ("cache_leftpad", None), ("block_table", None), ("softmax_scale", None),
        ("causal", False), ("window_size", WINDOW), ("softcap", 0.0),
        ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
        ("return_softmax_lse", False)],
}
# flashserve's own keyword-only additions (documented in docs/python.md).
FA2_EXTRAS = {"return_lse": False, "num_splits": 0}
# FlashAttention-3's fp8 descale factors, keyword-only in flashserve's FA2 functions.
_FP8_EXTRAS = {"q_descale": None, "k_descale": None, "v_descale": None}
FA2_EXTRAS_OF = {"flash_attn_func": dict(FA2_EXTRAS, **_FP8_EXTRAS),
                 "flash_attn_varlen_func": dict(FA2_EXTRAS, seqused_k=None, **_FP8_EXTRAS),
                 "flash_attn_with_kvcache": dict(_FP8_EXTRAS)}

_DESCALES = [("q_descale", None), ("k_descale", None), ("v_descale", None)]
FA3 = {
    "flash_attn_func": [("q", E), ("k", E), ("v", E), ("softmax_scale", None), ("causal", False),
                        ("qv", None)] + _DESCALES + [
        ("window_size", WINDOW), ("attention_chunk", 0), ("softcap", 0.0), ("num_splits", 1),
        ("pack_gqa", None), ("deterministic", False), ("sm_margin", 0),
        ("return_attn_probs", False)],
    "flash_attn_qkvpacked_func": [("qkv", E), ("softmax_scale", None), ("causal", False)]
    + _DESCALES + [("window_size", WINDOW), ("attention_chunk", 0), ("softcap", 0.0),
                   ("deterministic", False), ("num_heads_q", None), ("sm_margin", 0),
                   ("return_attn_probs", False)],
    "flash_attn_varlen_func": [
        ("q", E), ("k", E), ("v", E), ("cu_seqlens_q", E), ("cu_seqlens_k", E),
        ("max_seqlen_q", E), ("max_seqlen_k", E), ("seqused_q", None), ("seqused_k", None),
        ("softmax_scale", None), ("causal", False), ("qv", None)] + _DESCALES + [
        ("window_size", WINDOW), ("attention_chunk", 0), ("softcap", 0.0), ("num_splits", 1),
        ("pack_gqa", None), ("deterministic", False), ("sm_margin", 0),
        ("return_attn_probs", False)],
    "flash_attn_with_kvcache": [
        ("q", E), ("k_cache", E), ("v_cache", E), ("k", None), ("v", None), ("qv", None),
        ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
        ("cache_batch_idx", None), ("cache_leftpad", None), ("page_table", None),
        ("cu_seqlens_q", None), ("cu_seqlens_k_new", None), ("max_seqlen_q", None),
        ("rotary_seqlens", None)] + _DESCALES + [
        ("softmax_scale", None), ("causal", False), ("window_size", WINDOW),
        ("attention_chunk", 0), ("softcap", 0.0), ("rotary_interleaved", True),
        ("scheduler_metadata", None), ("num_splits", 0), ("pack_gqa", None), ("sm_margin", 0),
        ("return_softmax_lse", False)],
}


def split(fn):
    params = inspect.signature(fn).parameters.values()
    positional = [(p.name, p.default) for p in params
                  if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keyword_only = {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    others = [p.name for p in params if p.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                       inspect.Parameter.KEYWORD_ONLY)]
    return positional, keyword_only, others


@pytest.mark.parametrize("name", sorted(FA2))
def test_fa2_signatures(name):
    positional, keyword_only, others = split(getattr(flashserve, name))
    assert positional == FA2[name]
    assert keyword_only == FA2_EXTRAS_OF.get(name, FA2_EXTRAS)
    assert others == []
    assert name in flashserve.__all__


@pytest.mark.parametrize("name", sorted(FA3))
def test_fa3_signatures(name):
    positional, keyword_only, others = split(getattr(hopper, name))
    assert positional == FA3[name]
    assert keyword_only == {} and others == []
    assert name in hopper.__all__


def randn(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def qkv(rng, b=2, sq=9, sk=13, h=4, hk=2, d=16):
    return randn(rng, (b, sq, h, d)), randn(rng, (b, sk, hk, d)), randn(rng, (b, sk, hk, d))


def test_fa2_positional_order_reaches_the_right_parameters(seed):
    """Every FA2 parameter passed positionally lands where flash_attn puts it: the result equals
    the same call by keyword, and softcap (8th) changes the result as the reference says."""
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng)
    slopes = rng.uniform(0.1, 0.6, 4).astype(np.float32)
    by_position = flashserve.flash_attn_func(q, k, v, 0.0, 0.7, True, (3, -1), 1.1, slopes,
                                             True, True)
    by_name = flashserve.flash_attn_func(q, k, v, softmax_scale=0.7, causal=True,
                                         window_size=(3, -1), softcap=1.1, alibi_slopes=slopes,
                                         deterministic=True, return_attn_probs=True)
    assert len(by_position) == 3
    for a, b in zip(by_position, by_name):
        assert np.array_equal(a, b)
    for i in range(2):
        exact, _ = attention(q[i], k[i], v[i], 0.7, True, (3, -1), softcap=1.1, slopes=slopes)
        naive, _ = attention(q[i], k[i], v[i], 0.7, True, (3, -1), low_precision=np.float32,
                             softcap=1.1, slopes=slopes)
        check_close(by_position[0][i], exact, naive, 2e-6)


def test_return_attn_probs_returns_what_fa2_returns_without_dropout(seed):
    """(out, softmax_lse, S_dmask): S_dmask is the empty tensor FlashAttention-2 returns when
    dropout is off, in q's dtype."""
    rng = np.random.default_rng(seed)
    q, k, v = (x.astype(np.float16) for x in qkv(rng))
    out, lse, s_dmask = flashserve.flash_attn_func(q, k, v, return_attn_probs=True)
    plain, plain_lse = flashserve.flash_attn_func(q, k, v, return_lse=True)
    assert np.array_equal(out, plain) and np.array_equal(lse, plain_lse)
    assert lse.shape == (2, 4, 9) and lse.dtype == np.float32
    assert s_dmask.shape == (0,) and s_dmask.dtype == np.float16
    cu = np.array([0, 9, 18], np.int32)
    flat = [np.ascontiguousarray(x.reshape(-1, *x.shape[2:])) for x in (q, k[:, :9], v[:, :9])]
    result = flashserve.flash_attn_varlen_func(*flat, cu, cu, 9, 9, return_attn_probs=True)
    assert len(result) == 3 and result[1].shape == (4, 18) and result[2].shape == (0,)
    result = flashserve.flash_attn_qkvpacked_func(np.stack([q, q, q], axis=2),
                                                  return_attn_probs=True)
    assert len(result) == 3 and result[2].shape == (0,)


def test_fa3_positional_order_and_results(seed):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng)
    # softmax_scale 4th, causal 5th, window_size 10th, softcap 12th, num_splits 13th.
    out, lse = hopper.flash_attn_func(q, k, v, 0.6, True, None, None, None, None, (4, -1), 0,
                                      0.9, 1, None, False, 0, True)
    want, want_lse = flashserve.flash_attn_func(q, k, v, softmax_scale=0.6, causal=True,
                                                window_size=(4, -1), softcap=0.9,
                                                return_lse=True)
    assert np.array_equal(out, want) and np.array_equal(lse, want_lse)
    assert isinstance(hopper.flash_attn_func(q, k, v), np.ndarray)
    for pack_gqa in (None, True, False):  # a layout choice of FA3's: never the result
        assert np.array_equal(hopper.flash_attn_func(q, k, v, 0.6, True, pack_gqa=pack_gqa,
                                                     softcap=0.9, window_size=(4, -1)), want)


def test_fa3_varlen_with_seqused_k(seed):
    rng = np.random.default_rng(seed)
    q = randn(rng, (7, 2, 16))
    k, v = randn(rng, (20, 2, 16)), randn(rng, (20, 2, 16))
    cu_q, cu_k = np.array([0, 3, 7], np.int32), np.array([0, 12, 20], np.int32)
    used = np.array([9, 5], np.int32)
    out = hopper.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 12, None, used, None, True)
    want = flashserve.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 12, causal=True,
                                             seqused_k=used)
    assert np.array_equal(out, want)
    for b in range(2):
        ks = slice(cu_k[b], cu_k[b] + used[b])
        exact, _ = attention(q[cu_q[b]:cu_q[b + 1]], k[ks], v[ks], 0.25, True)
        check_close(out[cu_q[b]:cu_q[b + 1]], exact, exact, 2e-6)


def test_fa3_qkvpacked_both_layouts(seed):
    rng = np.random.default_rng(seed)
    packed5 = randn(rng, (2, 11, 3, 4, 16))
    want = flashserve.flash_attn_func(packed5[:, :, 0], packed5[:, :, 1], packed5[:, :, 2],
                                      causal=True)
    assert np.array_equal(hopper.flash_attn_qkvpacked_func(packed5, None, True), want)
    # GQA layout: 4 query heads, then 2 key heads, then 2 value heads along one axis.
    packed4 = randn(rng, (2, 11, 8, 16))
    got = hopper.flash_attn_qkvpacked_func(packed4, causal=True, num_heads_q=4)
    want = flashserve.flash_attn_func(packed4[:, :, :4], packed4[:, :, 4:6], packed4[:, :, 6:],
                                      causal=True)
    assert np.array_equal(got, want)
    with pytest.raises(ValueError, match=r"^num_heads_q: is required"):
        hopper.flash_attn_qkvpacked_func(packed4)
    with pytest.raises(ValueError, match=r"^num_heads_q: 3 does not split 8 heads"):
        hopper.flash_attn_qkvpacked_func(packed4, num_heads_q=3)


def test_fa3_kvcache_page_table_is_the_block_table(seed):
    rng = np.random.default_rng(seed)
    pages, page, hk, d = 6, 4, 2, 16
    k_cache, v_cache = randn(rng, (pages, page, hk, d)), randn(rng, (pages, page, hk, d))
    table = np.array([[3, 0, 5], [1, 4, 2]], np.int32)
    lens = np.array([9, 6], np.int32)
    q = randn(rng, (2, 1, 4, d))
    out, lse = hopper.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                              page_table=table, softcap=2.0,
                                              return_softmax_lse=True)
    want, want_lse = flashserve.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens,
                                                        block_table=table, softcap=2.0,
                                                        return_softmax_lse=True)
    assert np.array_equal(out, want) and np.array_equal(lse, want_lse)


FA3_REFUSED = [  # function, keyword, value, message
    ("flash_attn_func", "qv", "tensor", r"^qv: the extra q\.v product"),
    ("flash_attn_func", "attention_chunk", 128, r"^attention_chunk: chunked local attention"),
    ("flash_attn_func", "sm_margin", 4, r"^sm_margin: keeping SMs free"),
    ("flash_attn_qkvpacked_func", "attention_chunk", 64, r"^attention_chunk: "),
    ("flash_attn_varlen_func", "seqused_q", "tensor", r"^seqused_q: "),
    ("flash_attn_varlen_func", "qv", "tensor", r"^qv: "),
    ("flash_attn_varlen_func", "sm_margin", 1, r"^sm_margin: "),
    ("flash_attn_with_kvcache", "qv", "tensor", r"^qv: "),
    ("flash_attn_with_kvcache", "cu_seqlens_q", "tensor", r"^cu_seqlens_q: a varlen q"),
    ("flash_attn_with_kvcache", "cu_seqlens_k_new", "tensor", r"^cu_seqlens_k_new: "),
    ("flash_attn_with_kvcache", "max_seqlen_q", 4, r"^max_seqlen_q: "),
    ("flash_attn_with_kvcache", "rotary_seqlens", "tensor", r"^rotary_seqlens: "),
    ("flash_attn_with_kvcache", "scheduler_metadata", "tensor", r"^scheduler_metadata: "),
    ("flash_attn_with_kvcache", "attention_chunk", 8, r"^attention_chunk: "),
    ("flash_attn_with_kvcache", "cache_leftpad", "tensor", r"^cache_leftpad: "),
]


@pytest.mark.parametrize("name,keyword,value,match", FA3_REFUSED)
def test_fa3_parameters_without_meaning_here_are_refused_by_name(seed, name, keyword, value,
                                                                 match):
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, sq=4, sk=4, h=2, hk=2)
    if value == "tensor":
        value = np.ones(2, np.float32)
    if name == "flash_attn_qkvpacked_func":
        args = (np.stack([q, k, v], axis=2),)
    elif name == "flash_attn_varlen_func":
        cu = np.array([0, 4, 8], np.int32)
        args = tuple(np.ascontiguousarray(x.reshape(8, 2, 16)) for x in (q, k, v)) + \
            (cu, cu, 4, 4)
    else:
        args = (q, k, v)
    with pytest.raises(NotImplementedError, match=match):
        getattr(hopper, name)(*args, **{keyword: value})
    with pytest.raises(TypeError, match=r"^pack_gqa: expected None or a bool"):
        hopper.flash_attn_func(q, k, v, pack_gqa="yes")

