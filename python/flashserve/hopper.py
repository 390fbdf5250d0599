"""FlashAttention-3's Python API (flash-attention's hopper/flash_attn_interface.py, imported there
as `flash_attn_interface`) over flashserve: its functions with its parameters, in its order and
with its defaults, so that

    from flashserve.hopper import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

replaces `from flash_attn_interface import ...`. The parameters that mean something here are
passed on to flashserve's FlashAttention-2 functions (flashserve/attention.py); FA3's
page_table is FA2's block_table. FP8 as FA3 has it: q, k, v float8_e4m3fn with q_descale,
k_descale, v_descale float32 (batch, nheads_k) or None (1), a bfloat16 out, forward only, in
flash_attn_func, flash_attn_qkvpacked_func and flash_attn_varlen_func (on CUDA the sm90 kernel,
on by default; FLASHSERVE_FP8_ATTENTION=0 turns it off), and in flash_attn_with_kvcache over
float8_e4m3fn caches (q e4m3 or 16-bit; new k and v as e4m3 codes; no rotary). The others are
refused by name (NotImplementedError) unless left at their defaults: qv (MLA's extra q.v product),
seqused_q,
attention_chunk (chunked local attention), sm_margin (SMs kept free: the kernels cannot honour
it), scheduler_metadata, and flash_attn_with_kvcache's varlen q (cu_seqlens_q, cu_seqlens_k_new,
max_seqlen_q) and rotary_seqlens. pack_gqa (None, True, False) is accepted: it chooses how FA3
lays out a tile, never the result, and flashserve's dispatch packs the GQA heads of decodes
itself. flash_attn_combine and get_scheduler_metadata are not provided. See docs/python.md.
"""

import operator

from . import attention as _fa2


def _refuse_unless_default(**given):
    """Each keyword is (value, default, what it is): a value other than the default is refused by
    name, in the order given."""
    for name, (value, default, what) in given.items():
        if default is None:
            changed = value is not None
        else:
            changed = isinstance(value, bool) or value != default
        if changed:
            shown = "a tensor" if hasattr(value, "shape") else repr(value)
            raise NotImplementedError(f"{name}: {what} is not supported by flashserve; got "
                                      f"{shown}, pass {default!r}")


def _check_pack_gqa(pack_gqa):
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise TypeError(f"pack_gqa: expected None or a bool, got {type(pack_gqa).__name__}")


_CHUNK = "chunked local attention"
_MARGIN = "keeping SMs free for other kernels"
_QV = "the extra q.v product of MLA decoding"


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                    k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0,
                    softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0,
                    return_attn_probs=False):
    """FlashAttention-3's flash_attn_func: flashserve.flash_attn_func with softmax_scale 4th,
    num_splits 1 by default, and (out, softmax_lse) with return_attn_probs (FA3 returns no
    S_dmask). Layouts, masks and softcap as there. FP8: q, k, v float8_e4m3fn, q_descale,
    k_descale, v_descale float32 (batch, nheads_k) or None (1); out bfloat16; forward only."""
    _refuse_unless_default(qv=(qv, None, _QV), attention_chunk=(attention_chunk, 0, _CHUNK),
                           sm_margin=(sm_margin, 0, _MARGIN))
    _check_pack_gqa(pack_gqa)
    return _fa2.flash_attn_func(q, k, v, 0.0, softmax_scale, causal, window_size, softcap, None,
                                deterministic, return_lse=return_attn_probs,
                                num_splits=num_splits, q_descale=q_descale, k_descale=k_descale,
                                v_descale=v_descale)


def flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, q_descale=None,
                              k_descale=None, v_descale=None, window_size=(-1, -1),
                              attention_chunk=0, softcap=0.0, deterministic=False,
                              num_heads_q=None, sm_margin=0, return_attn_probs=False):
    """FlashAttention-3's flash_attn_qkvpacked_func: qkv (batch, seqlen, 3, nheads, headdim), or
    (batch, seqlen, num_heads_q + 2 * nheads_k, headdim) with num_heads_q (GQA: q's heads, then
    k's, then v's). Views, no copy. FP8 as in flash_attn_func."""
    _refuse_unless_default(attention_chunk=(attention_chunk, 0, _CHUNK),
                           sm_margin=(sm_margin, 0, _MARGIN))
    rank = len(qkv.shape)
    if rank == 5:
        if qkv.shape[2] != 3:
            raise ValueError(f"qkv: expected (batch, seqlen, 3, nheads, headdim), got shape "
                             f"{tuple(qkv.shape)}")
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    elif rank == 4:
        if num_heads_q is None:
            raise ValueError("num_heads_q: is required with a 4-D qkv (batch, seqlen, "
                             "num_heads_q + 2 * nheads_k, headdim)")
        hq = operator.index(num_heads_q)
        hk, odd = divmod(qkv.shape[2] - hq, 2)
        if hq <= 0 or hk <= 0 or odd:
            raise ValueError(f"num_heads_q: {hq} does not split {qkv.shape[2]} heads into "
                             f"num_heads_q + 2 * nheads_k")
        q, k, v = qkv[:, :, :hq], qkv[:, :, hq:hq + hk], qkv[:, :, hq + hk:]
    else:
        raise ValueError(f"qkv: expected rank 5 or 4, got shape {tuple(qkv.shape)}")
    return _fa2.flash_attn_func(q, k, v, 0.0, softmax_scale, causal, window_size, softcap, None,
                                deterministic, return_lse=return_attn_probs, num_splits=1,
                                q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_q=None, seqused_k=None, softmax_scale=None, causal=False,
                           qv=None, q_descale=None, k_descale=None, v_descale=None,
                           window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0,
                           return_attn_probs=False):
    """FlashAttention-3's flash_attn_varlen_func: flashserve.flash_attn_varlen_func with
    seqused_k (sequence b uses its first seqused_k[b] keys) in FA3's place; (out, softmax_lse)
    with return_attn_probs. FP8 as in flash_attn_func, batch = len(cu_seqlens_q) - 1."""
    _refuse_unless_default(seqused_q=(seqused_q, None, "seqused_q (a query count per sequence "
                                      "below cu_seqlens_q's)"),
                           qv=(qv, None, _QV), attention_chunk=(attention_chunk, 0, _CHUNK),
                           sm_margin=(sm_margin, 0, _MARGIN))
    _check_pack_gqa(pack_gqa)
    return _fa2.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                       max_seqlen_k, 0.0, softmax_scale, causal, window_size,
                                       softcap, None, deterministic, seqused_k=seqused_k,
                                       return_lse=return_attn_probs, num_splits=num_splits,
                                       q_descale=q_descale, k_descale=k_descale,
                                       v_descale=v_descale)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=0,
                            pack_gqa=None, sm_margin=0, return_softmax_lse=False):
    """FlashAttention-3's flash_attn_with_kvcache: flashserve.flash_attn_with_kvcache with
    page_table as the block table; (out, softmax_lse) with return_softmax_lse. FP8: k_cache and
    v_cache float8_e4m3fn beside a float8_e4m3fn q (out bfloat16) or a 16-bit one (an fp8 KV
    cache), new k and v as e4m3 codes (copied into the cache as they are), q_descale, k_descale,
    v_descale float32 (batch, nheads_k) or None (1); no rotary into an e4m3 cache."""
    _refuse_unless_default(qv=(qv, None, _QV),
                           cu_seqlens_q=(cu_seqlens_q, None, "a varlen q in the KV-cache call"),
                           cu_seqlens_k_new=(cu_seqlens_k_new, None, "varlen new keys"),
                           max_seqlen_q=(max_seqlen_q, None, "a varlen q in the KV-cache call"),
                           rotary_seqlens=(rotary_seqlens, None, "rotary positions apart from "
                                           "cache_seqlens"),
                           attention_chunk=(attention_chunk, 0, _CHUNK),
                           scheduler_metadata=(scheduler_metadata, None,
                                               "get_scheduler_metadata's precomputed schedule"),
                           sm_margin=(sm_margin, 0, _MARGIN))
    _check_pack_gqa(pack_gqa)
    return _fa2.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                        cache_seqlens, cache_batch_idx, cache_leftpad,
                                        page_table, softmax_scale, causal, window_size, softcap,
                                        rotary_interleaved, None, num_splits, return_softmax_lse,
                                        q_descale=q_descale, k_descale=k_descale,
                                        v_descale=v_descale)


__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache"]
