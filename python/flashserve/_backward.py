"""The backward of attention through the C API (fs_attention_backward_v3): dq, dk, dv of the call
flash_attn_func / flash_attn_varlen_func made, given the forward's out and lse and the gradient
dout of out (and optionally dlse of lse).

Framework-neutral like attention._forward (tensors described through DLPack or the array
interfaces, outputs allocated with _tensor.empty in q's framework); the PyTorch custom operators
of _torch.py call it from their autograd formulas.
"""

import ctypes

from . import _capi, _tensor
from . import attention as _attention


def backward(dout, q, k, v, out, lse, dlse=None, *, varlen, cu_seqlens_q=None, cu_seqlens_k=None,
             max_seqlen_q=0, max_seqlen_k=0, seqused_k=None, softmax_scale=None, causal=False,
             window_size=(-1, -1), deterministic=False, softcap=0.0, alibi_slopes=None):
    """(dq, dk, dv) shaped like q, k, v, in their dtype, framework and device."""
    framework = _tensor.framework_of(q)
    dout, q, k, v, out = (_tensor.last_dim_contiguous(x, _tensor.framework_of(x))
                          for x in (dout, q, k, v, out))
    device = _tensor.device_of(q)
    stream = _tensor.current_stream(q, framework, device)

    def describe(x, name, raw=False):
        return _tensor.describe(x, name, stream=stream, raw=raw)

    dq_, dk_, dv_ = describe(q, "q"), describe(k, "k"), describe(v, "v")
    if varlen:
        _attention._check_rank(dq_, "q", 3, "(total_q, nheads, headdim)")
    else:
        _attention._check_rank(dq_, "q", 4, "(batch, seqlen_q, nheads, headdim)")
    grads = tuple(_tensor.empty(x, framework, device, d.shape)
                  for x, d in ((q, dq_), (k, dk_), (v, dv_)))

    described = [dq_, dk_, dv_, describe(out, "out"), describe(lse, "lse"),
                 describe(cu_seqlens_q, "cu_seqlens_q"), describe(cu_seqlens_k, "cu_seqlens_k"),
                 describe(seqused_k, "seqused_k"), describe(alibi_slopes, "alibi_slopes")]
    grad_described = [describe(dout, "dout"), describe(dlse, "dlse"),
                      describe(grads[0], "dq"), describe(grads[1], "dk"),
                      describe(grads[2], "dv")]
    params = _capi.default_backward_params()
    attn = params.attn
    for d in described:
        setattr(attn, d.name, d.struct)
    for d in grad_described:
        setattr(params, d.name, d.struct)
    attn.max_seqlen_q = _attention._int(max_seqlen_q, "max_seqlen_q", _attention._INT64)
    attn.max_seqlen_k = _attention._int(max_seqlen_k, "max_seqlen_k", _attention._INT64)
    attn.softmax_scale = _attention._scale(softmax_scale)
    attn.softcap = _attention._softcap(softcap)
    attn.causal = 1 if causal else 0
    attn.window_left, attn.window_right = _attention._window(window_size, causal)
    attn.stream = stream or None
    params.deterministic = 1 if _attention._flag(deterministic, "deterministic") else 0

    lib = _capi.lib()
    workspace = None
    if device[0] == "cuda":
        size = lib.fs_attention_backward_workspace_size_v3(ctypes.byref(params))
        if size == ctypes.c_size_t(-1).value:
            _capi.raise_last()
        if size:
            workspace = _tensor.empty(q, framework, device, (size,), "uint8")
            dw = describe(workspace, "workspace", raw=True)
            described.append(dw)
            attn.workspace, attn.workspace_bytes = dw.struct.data, size
    _capi.raise_for(lib.fs_attention_backward_v3(ctypes.byref(params)))
    if _tensor.needs_sync(framework, device):
        _capi.raise_for(lib.fs_cuda_stream_synchronize(attn.stream))
    del described, grad_described, workspace  # borrowed DLPack capsules released only now
    return grads
