"""Autograd for flashserve's PyTorch custom operators: flashserve::bwd and ::varlen_bwd (the
backward as operators of their own, so that torch.compile traces them and activation
checkpointing re-runs the forward through the dispatcher) and torch.library.register_autograd on
flashserve::fwd and ::varlen_fwd; beside them, DenseFunction and VarlenFunction, the same
autograd for eager CUDA calls without the dispatcher's host cost.

Imported by _torch.py only (PyTorch is imported then). A call that needs a gradient always runs
the forward with return_lse=True: the backward recomputes the probabilities from the LSE
(FlashAttention-2's algorithm, flashserve/attention_backward.h), and the forward's saved tensors
are q, k, v, out and lse. Gradients come back in q's, k's and v's shapes and dtypes.
"""

from typing import Optional, Tuple

import torch

from . import _backward
from . import attention as _attention

Tensor = torch.Tensor


def needs_grad(*tensors):
    """Whether autograd will want gradients of any of these tensors."""
    return torch.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad for t in tensors)


def require_ops(ops, q):
    """Refuses, before the forward runs, a gradient that could not be computed afterwards."""
    if ops is None:
        raise NotImplementedError(
            "q: requires grad, but flashserve's autograd goes through PyTorch custom operators "
            "(torch.library.custom_op and register_autograd, PyTorch >= 2.4), which this PyTorch "
            f"({getattr(torch, '__version__', 'unknown')}) lacks; run under torch.no_grad() or "
            "pass detached tensors")


def refuse_cuda_modifier_grad(q, softcap, alibi_slopes):
    """The CUDA forward has softcap and ALiBi, the CUDA backward not yet: a CUDA call that will
    want gradients is refused before the forward runs (the backward would refuse it too, after
    the forward's work), naming the modifier. The CPU path differentiates both."""
    if not (isinstance(q, Tensor) and q.is_cuda):
        return
    if softcap != 0.0:
        raise NotImplementedError(
            "softcap: logit soft-capping has no CUDA backward yet (the CUDA forward and the CPU "
            "path have it); run the forward under torch.no_grad() or on CPU tensors")
    if alibi_slopes is not None:
        raise NotImplementedError(
            "alibi_slopes: ALiBi has no CUDA backward yet (the CUDA forward and the CPU path "
            "have it); run the forward under torch.no_grad() or on CPU tensors")


def refuse_cuda_head_dim_grad(q, k, v):
    """The CUDA forward runs head dims that are multiples of 8 from 32 to 256, q/k's and v's equal
    or not; the CUDA backward runs the same head dims with q/k's and v's equal. A CUDA call with
    unequal dims that will want gradients is refused before the forward runs."""
    if not (isinstance(q, Tensor) and q.is_cuda):
        return
    d, dv = q.shape[-1], v.shape[-1]
    if d == dv:
        return
    raise NotImplementedError(
        f"q: head_dim {d} (v's {dv}) has no CUDA backward (q's and v's head dims must be equal; "
        "the CUDA forward and the CPU path have it); run the forward under torch.no_grad() or on "
        "CPU tensors")


def refuse_slope_grad(alibi_slopes):
    """No gradient flows to ALiBi slopes (as in FlashAttention): slopes that require one are
    refused, not given a silent zero."""
    if isinstance(alibi_slopes, Tensor) and alibi_slopes.requires_grad and \
            torch.is_grad_enabled():
        raise NotImplementedError("alibi_slopes: requires grad, but flashserve computes no "
                                  "gradient of the ALiBi slopes; detach them")


def grads_in(out, lse, grad_out, grad_lse):
    """dout (zeros when only the LSE was used) and dlse (None when it was not)."""
    if lse.numel() == 0 and out.numel() != 0:
        raise RuntimeError("flashserve: the forward operator ran with return_lse=False, so "
                           "it saved no LSE to differentiate with; call flash_attn_func / "
                           "flash_attn_varlen_func, which pass return_lse=True when a "
                           "gradient is needed")
    dout = grad_out if grad_out is not None else torch.zeros_like(out)
    return dout, grad_lse


# The eager training path of dense and varlen CUDA calls (set by define_backward_ops): _functions.
DenseFunction = VarlenFunction = None


def define_backward_ops():
    """Defines flashserve::bwd and ::varlen_bwd and registers the forward operators' autograd
    (called once, after flashserve::fwd and ::varlen_fwd are defined)."""

    @torch.library.custom_op("flashserve::bwd", mutates_args=())
    def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
            dlse: Optional[Tensor], softmax_scale: Optional[float], causal: bool,
            window_left: int, window_right: int, deterministic: bool, softcap: float = 0.0,
            alibi_slopes: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
        return _backward.backward(dout, q, k, v, out, lse, dlse, varlen=False,
                                  softmax_scale=softmax_scale, causal=causal,
                                  window_size=(window_left, window_right),
                                  deterministic=deterministic, softcap=softcap,
                                  alibi_slopes=alibi_slopes)

    @bwd.register_fake
    def _(dout, q, k, v, out, lse, dlse, softmax_scale, causal, window_left, window_right,
          deterministic, softcap=0.0, alibi_slopes=None):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    @torch.library.custom_op("flashserve::varlen_bwd", mutates_args=())
    def varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                   dlse: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
                   cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                   seqused_k: Optional[Tensor], softmax_scale: Optional[float], causal: bool,
                   window_left: int, window_right: int, deterministic: bool,
                   softcap: float = 0.0,
                   alibi_slopes: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
        return _backward.backward(dout, q, k, v, out, lse, dlse, varlen=True,
                                  cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                  max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                  seqused_k=seqused_k, softmax_scale=softmax_scale,
                                  causal=causal, window_size=(window_left, window_right),
                                  deterministic=deterministic, softcap=softcap,
                                  alibi_slopes=alibi_slopes)

    @varlen_bwd.register_fake
    def _(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
          seqused_k, softmax_scale, causal, window_left, window_right, deterministic, softcap=0.0,
          alibi_slopes=None):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    # flashserve::fwd(q, k, v, softmax_scale, causal, window_left, window_right, num_splits,
    #                 return_lse, deterministic, softcap, alibi_slopes, q_descale, k_descale,
    #                 v_descale); the descale factors belong to float8 calls, which are forward
    # only (refused before the forward when a gradient is needed, _torch.py _fp8_call).
    def fwd_setup(ctx, inputs, output):
        q, k, v, scale, causal, left, right, _, _, deterministic, softcap, alibi = inputs[:12]
        ctx.n_inputs = len(inputs)
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, alibi)
        ctx.args = (scale, causal, left, right, deterministic, softcap)

    def fwd_backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, alibi = ctx.saved_tensors
        dout, dlse = grads_in(out, lse, grad_out, grad_lse)
        dq, dk, dv = torch.ops.flashserve.bwd(dout, q, k, v, out, lse, dlse, *ctx.args, alibi)
        return (dq, dk, dv) + (None,) * (ctx.n_inputs - 3)

    torch.library.register_autograd("flashserve::fwd", fwd_backward, setup_context=fwd_setup)

    # flashserve::varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    #                        softmax_scale, causal, window_left, window_right, return_lse,
    #                        block_table, seqused_k, num_splits, deterministic, softcap,
    #                        alibi_slopes, q_descale, k_descale, v_descale)
    def varlen_setup(ctx, inputs, output):
        (q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, left, right, _, _, seqused_k, _,
         deterministic, softcap, alibi) = inputs[:18]
        ctx.n_inputs = len(inputs)
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seqused_k, alibi)
        ctx.args = (max_q, max_k, scale, causal, left, right, deterministic, softcap)

    def varlen_backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, cu_q, cu_k, seqused_k, alibi = ctx.saved_tensors
        dout, dlse = grads_in(out, lse, grad_out, grad_lse)
        max_q, max_k, scale, causal, left, right, deterministic, softcap = ctx.args
        dq, dk, dv = torch.ops.flashserve.varlen_bwd(dout, q, k, v, out, lse, dlse, cu_q, cu_k,
                                                     max_q, max_k, seqused_k, scale, causal,
                                                     left, right, deterministic, softcap, alibi)
        return (dq, dk, dv) + (None,) * (ctx.n_inputs - 3)

    torch.library.register_autograd("flashserve::varlen_fwd", varlen_backward,
                                    setup_context=varlen_setup)

    global DenseFunction, VarlenFunction
    DenseFunction, VarlenFunction = _functions()


def _functions():
    """flash_attn_func's and flash_attn_varlen_func's eager training path for plain CUDA tensors
    (dense K/V, no score modifiers): the same forward and backward as the operators' autograd
    above, as torch.autograd.Functions over the host fast paths (_torch._dense / _varlen_fast and
    _torch.fast_backward). Through the dispatcher, a training step's attention took ~1.8 ms of
    host time on the H200's host (the forward ~0.4, the backward ~1.4; SDPA 0.24 in all, session
    21), more than its kernels at 2k tokens. torch.compile and tensor subclasses still go through
    the operators."""
    from . import _torch

    def backward(ctx, grad_out, grad_lse, lengths):
        q, k, v, out, lse = ctx.saved_tensors[:5]
        dout, dlse = grads_in(out, lse, grad_out, grad_lse)
        if dout.stride(-1) != 1:  # an expanded gradient (of a sum, say) has stride 0
            dout = dout.contiguous()
        # q, k and v as saved (they require grad): the fast path reads only their pointers and
        # layouts, and the generic path's DLPack descriptions detach what requires grad.
        grads = _torch.fast_backward(dout, q, k, v, out, lse, dlse, *ctx.args, *lengths)
        if grads is None:  # a gradient tensor the fast path does not pack as it is
            scale, causal, left, right, deterministic = ctx.args
            cu_q, cu_k, max_q, max_k, seqused_k = lengths or (None, None, 0, 0, None)
            grads = _backward.backward(dout, q, k, v, out, lse, dlse, varlen=bool(lengths),
                                       cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                       max_seqlen_q=max_q, max_seqlen_k=max_k,
                                       seqused_k=seqused_k,
                                       softmax_scale=None if scale == 0.0 else scale,
                                       causal=causal, window_size=(left, right),
                                       deterministic=deterministic)
        return grads

    def remember(ctx, tensors, softmax_scale, causal, left, right, deterministic):
        ctx.save_for_backward(*tensors)
        left, right = _attention._window((left, right), causal)
        ctx.args = (_attention._scale(softmax_scale), causal, left, right, deterministic)
        ctx.set_materialize_grads(False)  # an unused lse's gradient stays None

    # forward(ctx, ...) rather than forward(...) with setup_context: Function.apply binds the
    # arguments to forward's signature (inspect.signature, every call) when setup_context is
    # defined, 23 us of host time a call with these nine (an H100's host, session 40; the
    # apply was 76 us of a 26 us forward). The old style has no functorch transforms, which
    # neither Function could run anyway (the fast paths read the tensors' data pointers).
    class DenseFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, softmax_scale, causal, left, right, num_splits, deterministic):
            # Detached: the fast path refuses tensors that require grad (autograd is this
            # Function's business, not the library call's).
            out, lse = _torch._dense(q.detach(), k.detach(), v.detach(), softmax_scale, causal,
                                     (left, right), num_splits, True)
            remember(ctx, (q, k, v, out, lse), softmax_scale, causal, left, right,
                     deterministic)
            return out, lse

        @staticmethod
        def backward(ctx, grad_out, grad_lse):
            return backward(ctx, grad_out, grad_lse, ()) + (None,) * 6

    class VarlenFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    softmax_scale, causal, left, right, seqused_k, num_splits, deterministic):
            out, lse = _torch._varlen_fast(q.detach(), k.detach(), v.detach(), cu_seqlens_q,
                                           cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                           softmax_scale, causal, (left, right), num_splits,
                                           True, seqused_k)
            remember(ctx, (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k),
                     softmax_scale, causal, left, right, deterministic)
            ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
            return out, lse

        @staticmethod
        def backward(ctx, grad_out, grad_lse):
            cu_q, cu_k, seqused_k = ctx.saved_tensors[5:]
            lengths = (cu_q, cu_k) + ctx.max_seqlens + (seqused_k,)
            return backward(ctx, grad_out, grad_lse, lengths) + (None,) * 11

    return DenseFunction, VarlenFunction
