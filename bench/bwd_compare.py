#!/usr/bin/env python3
"""Attention backward through torch.autograd: flashserve.flash_attn_func beside PyTorch SDPA's
cuDNN and flash (FA2) backends, one run, one GPU (issue 22's measurement).

bf16, the FA3 grid (batch x L = 16k tokens, heads x head dim = 2048), causal and not. Each figure
is the median of --reps timed calls (CUDA events) of `out.backward(grad)` after the forward ran
outside the timing (so it times the backward alone), and of forward + backward together; the
inputs' .grad is None before each call (as after optimizer.zero_grad()), so no accumulation;
TFLOP/s by docs/architecture.md's count: backward 2.5 x the forward's FLOPs (halved when causal).

Our backward's kernel family is the library's default (FLASHSERVE_BWD_KERNEL unset: sm90 on an
H100/H200 build with 90a, sm80 elsewhere); --families sm80,sm90 times each forced family (the
variable is set around its calls, the forward left alone), one row per family and shape.
sm90-atomic and sm90-dq-bulk are sm90 with its dQ path forced too (FLASHSERVE_SM90_BWD_DQ_BULK=0
or 1: per-element atomics or the shared-memory tile's bulk reduce-add), for the A/B of one run;
sm90-overlap is sm90 with FLASHSERVE_SM90_BWD_OVERLAP=1 (the bulk path's step in FlashAttention-3's
order; the dQ path at its default), to set beside sm90 (the same with the switch at its default);
sm90-heavy-first is sm90 with FLASHSERVE_SM90_BWD_HEAVY_FIRST=1 (a masked call's CTAs launched
heaviest key blocks first; unmasked rows run as sm90: --causal 1 for its A/B). sm90-persistent is
sm90 with FLASHSERVE_SM90_BWD_PERSISTENT=1 (one CTA per multiprocessor taking tiles from a
counter; masked calls heaviest first). sm90-fused-dq is sm90 with FLASHSERVE_SM90_BWD_FUSED_DQ=1
(each unit's last CTA converts dq; no postprocess on dense calls at d64/d128). sm90-d256 is sm90
with FLASHSERVE_SM90_BWD_D256=1 (head dim 256 on sm90/bwd_swapped_kernel.h; the switch's default
since session 30, so auto runs it too; sm80 is sm80's padded kernels: --head-dims 256 --families
sm80,auto).
--rounds N times every column N times per shape, the columns in a rotated order each round, and
reports each column's median over the rounds: a clock that drifts during a shape's rounds then
weighs on every column alike (session 30's single passes moved cuDNN's own column by up to 17%).
--graph times the kernels alone: --calls forward + backward pairs captured in one CUDA graph
and the same number of forwards in another, each replayed --reps times (median); the backward is
the difference, so no column pays its host time (the eager columns include the wait of the device
on the host's autograd node, ~0.1 ms at 512 keys, which a training step with a full queue hides).
--profile adds, per shape and family, one call's device time per kernel (torch.profiler): the main
kernel's share of a row beside the zeroing, preprocess and postprocess around it.

Usage (repo root, libflashserve_c built with CUDA):
    PYTHONPATH=python FLASHSERVE_LIBRARY=.../libflashserve_c.so python3 bench/bwd_compare.py \
        [--families auto|sm80,sm90|sm90-atomic,sm90-dq-bulk|sm90,sm90-overlap|sm90,sm90-heavy-first]
"""
import argparse
import contextlib
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from flashserve import flash_attn_func  # noqa: E402
from python_host_cost import graphed  # noqa: E402  (the capture helper of the Python benchmarks)

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}

# The environment each --families name sets around our calls (None: the variable left as it is).
FAMILY_ENV = {
    "auto": {"FLASHSERVE_BWD_KERNEL": "auto"},
    "sm80": {"FLASHSERVE_BWD_KERNEL": "sm80"},
    "sm90": {"FLASHSERVE_BWD_KERNEL": "sm90"},
    "sm90-atomic": {"FLASHSERVE_BWD_KERNEL": "sm90", "FLASHSERVE_SM90_BWD_DQ_BULK": "0"},
    "sm90-dq-bulk": {"FLASHSERVE_BWD_KERNEL": "sm90", "FLASHSERVE_SM90_BWD_DQ_BULK": "1"},
    "sm90-overlap": {"FLASHSERVE_BWD_KERNEL": "sm90", "FLASHSERVE_SM90_BWD_OVERLAP": "1"},
    "sm90-heavy-first": {"FLASHSERVE_BWD_KERNEL": "sm90", "FLASHSERVE_SM90_BWD_HEAVY_FIRST": "1"},
    "sm90-d256": {"FLASHSERVE_BWD_KERNEL": "sm90", "FLASHSERVE_SM90_BWD_D256": "1"},
    "sm90-persistent": {"FLASHSERVE_BWD_KERNEL": "sm90", "FLASHSERVE_SM90_BWD_PERSISTENT": "1"},
    "sm90-fused-dq": {"FLASHSERVE_BWD_KERNEL": "sm90", "FLASHSERVE_SM90_BWD_FUSED_DQ": "1"},
}


@contextlib.contextmanager
def family_env(family):
    """Sets `family`'s variables (FAMILY_ENV) for the block and puts back what was there."""
    old = {k: os.environ.get(k) for k in FAMILY_ENV[family]}
    os.environ.update(FAMILY_ENV[family])
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def timed(fn, reps, before=None):
    """Median ms of fn() over `reps` calls after 3 warm-ups; `before` (if any) runs before each
    call, outside the timed region."""
    for _ in range(3):
        if before:
            before()
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if before:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[reps // 2]


def graph_ms(fn, calls, reps):
    """Median ms of one of `calls` fn() calls captured in one CUDA graph, replayed `reps` times."""
    replay = graphed(lambda: [fn() for _ in range(calls)])
    return timed(replay, reps) / calls


def run(which, q, k, v, causal, reps, family="auto", graph_calls=0):
    """(backward ms, forward + backward ms) through autograd; q, k, v are [b, L, h, d]. `family`
    is our backward's FAMILY_ENV name for which = "flashserve". graph_calls > 0: the kernels
    alone (--graph), the backward as forward + backward less the forward."""
    if which == "flashserve":
        with family_env(family):
            return run(which + "-forced", q, k, v, causal, reps, graph_calls=graph_calls)
    g = torch.randn_like(q)
    if which == "flashserve-forced":
        fwd = lambda: flash_attn_func(q, k, v, causal=causal)  # noqa: E731
        leaves = (q, k, v)
    else:
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        leaves = (qt, kt, vt)
        gt = g.transpose(1, 2)

        def fwd():
            with sdpa_kernel([BACKENDS[which]]):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        g = gt
    holder = {}

    def forward():
        # Gradients start from None, as after optimizer.zero_grad() (set_to_none, its default):
        # otherwise autograd adds each call's dq, dk, dv into .grad, three elementwise kernels
        # (0.14 ms at 2k, d128; session 23's profile) timed in both columns.
        for x in leaves:
            x.grad = None
        holder["out"] = fwd()

    def backward():
        holder["out"].backward(g)

    def forward_backward():
        forward()
        backward()

    if graph_calls:
        both = graph_ms(forward_backward, graph_calls, reps)
        return both - graph_ms(forward, graph_calls, reps), both
    return timed(backward, reps, before=forward), timed(forward_backward, reps)


def grad_diff(q, k, v, causal, family):
    """max |ours - FA2's| / max |FA2's| over dq, dk, dv (bf16, same inputs and dout): a check that
    the timed kernel computes the gradient, beside the tests against float64."""
    g = torch.randn_like(q)
    with family_env(family):
        xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        flash_attn_func(*xs, causal=causal).backward(g)
        ours = [x.grad for x in xs]
    ts = [x.detach().transpose(1, 2).clone().requires_grad_() for x in (q, k, v)]
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        F.scaled_dot_product_attention(*ts, is_causal=causal).backward(g.transpose(1, 2))
    return max(((a - b.grad.transpose(1, 2)).abs().max() / b.grad.abs().max()).item()
               for a, b in zip(ours, ts))


def profile_call(q, k, v, causal, family, timed_ms):
    """The device time of one backward call (`out.backward(grad)` after a warm-up) per kernel, by
    torch.profiler: the main kernel beside what the call runs around it (zeroing, preprocess,
    postprocess, copies), so that a figure of the table can be split into the kernel's share and
    the call's fixed cost; `timed_ms` (the table's median) less the kernels' sum is the time the
    device waited on the host. Prints one line per kernel name, longest first."""
    from torch.profiler import ProfilerActivity, profile
    g = torch.randn_like(q)
    with family_env(family):
        for _ in range(2):  # the first call warms the allocator and the module loads
            q.grad = k.grad = v.grad = None  # as run()'s forward
            out = flash_attn_func(q, k, v, causal=causal)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                out.backward(g)
                torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        # The attribute's name moved between torch versions (cuda_* became device_*).
        us = max(getattr(e, a, 0) or 0 for a in ("device_time_total", "self_device_time_total",
                                                 "cuda_time_total", "self_cuda_time_total"))
        if us > 0:
            rows.append((us, e.count, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"<!-- profile {family} d{q.shape[-1]} L{q.shape[1]} causal {int(causal)}: "
          f"{total / 1e3:.3f} ms of device time in {len(rows)} kernels, {timed_ms:.3f} ms timed -->")
    for us, count, key in rows[:8]:
        print(f"<!--   {us / 1e3:8.3f} ms  x{count}  {key[:110]} -->")


def main():
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dims", type=ints, default=[64, 128])
    ap.add_argument("--seqlens", type=ints, default=[512, 2048, 8192])
    ap.add_argument("--causal", type=ints, default=[0, 1])
    ap.add_argument("--total-tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every column this many times per shape, in a rotated order, and "
                    "report each column's median over the rounds")
    ap.add_argument("--graph", action="store_true",
                    help="the kernels alone: forward + backward and forward captured in CUDA "
                    "graphs of --calls calls each, the backward their difference")
    ap.add_argument("--calls", type=int, default=4, help="calls per graph with --graph")
    ap.add_argument("--profile", action="store_true",
                    help="per shape and family, one backward call's device time per kernel "
                    "(torch.profiler), as HTML comments under the table's rows")
    ap.add_argument("--families", default="auto",
                    help="our backward's kernel families, comma-separated: "
                    + ", ".join(FAMILY_ENV))
    args = ap.parse_args()
    families = [f for f in args.families.split(",") if f]
    graph_calls = args.calls if args.graph else 0
    for f in families:
        if f not in FAMILY_ENV:
            ap.error(f"unknown family {f!r} (one of {', '.join(FAMILY_ENV)})")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}, bf16; TFLOP/s of the backward (2.5 x forward FLOPs) "
          "and of forward + backward (3.5 x)"
          + (f"; kernels alone: {args.calls} calls per CUDA graph, backward = forward + backward "
             "less forward" if args.graph else "; eager, host time included") + "\n")
    print("| d | causal | L | batch | heads | kernel | flashserve bwd | cuDNN bwd | FA2 bwd | "
          "vs cuDNN | vs FA2 | flashserve fwd+bwd | cuDNN fwd+bwd | FA2 fwd+bwd | "
          "grad diff vs FA2 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d in args.head_dims:
        for causal in args.causal:
            for L in args.seqlens:
                b, h = max(1, args.total_tokens // L), args.hidden // d
                q, k, v = (torch.randn(b, L, h, d, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=True) for _ in range(3))
                fwd_flops = 4.0 * b * h * L * L * d / (2 if causal else 1)
                columns = ["cudnn", "flash"] + families
                rounds = {which: [] for which in columns}
                for r in range(args.rounds):
                    for which in columns[r % len(columns):] + columns[:r % len(columns)]:
                        try:
                            if which in ("cudnn", "flash"):
                                t = run(which, q, k, v, bool(causal), args.reps,
                                        graph_calls=graph_calls)
                            else:
                                t = run("flashserve", q, k, v, bool(causal), args.reps,
                                        family=which, graph_calls=graph_calls)
                        except Exception as e:  # a backend that cannot take the shape
                            if r == 0:
                                print(f"<!-- {which} d{d} L{L} causal {causal}: "
                                      f"{type(e).__name__}: {str(e)[:120]} -->")
                            t = (float("nan"), float("nan"))
                        rounds[which].append(t)
                res = {w: tuple(sorted(x[i] for x in ts)[len(ts) // 2] for i in range(2))
                       for w, ts in rounds.items()}
                tf = {w: (2.5 * fwd_flops / (r[0] * 1e-3) / 1e12,
                          3.5 * fwd_flops / (r[1] * 1e-3) / 1e12) for w, r in res.items()}
                for fam in families:
                    try:
                        diff = f"{grad_diff(q, k, v, bool(causal), fam):.2e}"
                    except Exception as e:
                        diff = type(e).__name__
                    print(f"| {d} | {'yes' if causal else 'no'} | {L} | {b} | {h} | {fam} | "
                          f"{tf[fam][0]:.1f} | {tf['cudnn'][0]:.1f} | {tf['flash'][0]:.1f} | "
                          f"{tf[fam][0] / tf['cudnn'][0]:.2f} | "
                          f"{tf[fam][0] / tf['flash'][0]:.2f} | {tf[fam][1]:.1f} | "
                          f"{tf['cudnn'][1]:.1f} | {tf['flash'][1]:.1f} | {diff} |", flush=True)
                if args.profile:
                    for fam in families:
                        profile_call(q, k, v, bool(causal), fam, res[fam][0])

if __name__ == "__main__":
    main()
