#!/usr/bin/env python3
"""flashserve.flash_attn_func beside PyTorch SDPA (cuDNN and flash/FA2 backends), one run, one GPU.

The measurement of issue 19 and of shared/anchors/h200-2026-12-01.md: bf16, the FlashAttention-3
paper's grid (batch x L = 16k tokens, heads x head dim = 2048, L 512..16k, head dims 64/128/256,
causal and not) plus long context (batch 1, causal, GQA 32/8, d128, L 32k/64k/128k). Each figure
is --calls calls captured in one CUDA graph (the kernels alone, host cost out), median of --reps
replays, uniform random inputs; TFLOP/s by docs/architecture.md's count (halved when causal). Default
arguments for flashserve (what a user gets).

--ab-env NAME times flashserve with the environment switch NAME=0 and NAME=1 (alternated, the better
of two graphs each, in the same process: the plan reads its switches per call), e.g.
FLASHSERVE_SM90_EPILOGUE; "flashserve" is then the =1 figure, and the table adds =0 and 1/0.

Usage (repo root, libflashserve_c built with CUDA):
    PYTHONPATH=python FLASHSERVE_LIBRARY=.../libflashserve_c.so python3 bench/fa3_grid.py [--csv F]
"""
import argparse
import csv
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from flashserve import flash_attn_func  # noqa: E402
from python_host_cost import graphed  # noqa: E402  (the capture helper of the Python benchmarks)

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def graph_ms(fn, calls, reps):
    """Median time of one call: `calls` calls captured in one graph, replayed `reps` times."""
    replay = graphed(lambda: [fn() for _ in range(calls)])
    replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return sorted(times)[reps // 2]


def shapes(args):
    for d in args.head_dims:
        for causal in args.causal:
            for L in args.seqlens:
                yield ("grid", d, causal, L, max(1, args.total_tokens // L), args.hidden // d,
                       args.hidden // d)
    for L in args.long:
        yield ("long", 128, 1, L, 1, 32, 8)


def main():
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dims", type=ints, default=[64, 128, 256])
    ap.add_argument("--seqlens", type=ints, default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--causal", type=ints, default=[0, 1])
    ap.add_argument("--long", type=ints, default=[32768, 65536, 131072])
    ap.add_argument("--total-tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--csv", default="")
    ap.add_argument("--ab-env", default="", help="an on/off switch to time flashserve with both ways")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}, bf16, {args.calls} calls per graph\n")
    ab = f" | {args.ab_env}=0 | 1/0" if args.ab_env else ""
    print(f"| kind | d | causal | L | batch | heads q/kv | flashserve | cuDNN | FA2 | vs cuDNN | vs FA2{ab} |")
    print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if args.ab_env else ""))
    rows = []
    for kind, d, causal, L, b, hq, hkv in shapes(args):
        q = torch.rand(b, L, hq, d, device="cuda", dtype=torch.bfloat16) - 0.5
        k = torch.rand(b, L, hkv, d, device="cuda", dtype=torch.bfloat16) - 0.5
        v = torch.rand(b, L, hkv, d, device="cuda", dtype=torch.bfloat16) - 0.5
        flops = 4.0 * b * hq * L * L * d * (0.5 if causal else 1.0)
        tf = {}
        # Long calls (over 10 TFLOP: 64k and 128k context) are timed one per graph, 3 replays.
        calls, reps = (args.calls, args.reps) if flops < 1e13 else (1, 3)
        call = lambda: flash_attn_func(q, k, v, causal=bool(causal))  # noqa: E731
        if args.ab_env:
            best = {"0": 0.0, "1": 0.0}
            for value in ("0", "1", "0", "1"):
                os.environ[args.ab_env] = value
                best[value] = max(best[value], flops / graph_ms(call, calls, reps) / 1e9)
            del os.environ[args.ab_env]
            tf["flashserve"], tf["flashserve_off"] = best["1"], best["0"]
        else:
            tf["flashserve"] = flops / graph_ms(call, calls, reps) / 1e9
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        for name, backend in BACKENDS.items():
            try:
                with sdpa_kernel(backend):
                    fn = lambda: F.scaled_dot_product_attention(  # noqa: E731
                        qt, kt, vt, is_causal=bool(causal), enable_gqa=hq != hkv)
                    tf[name] = flops / graph_ms(fn, calls, reps) / 1e9
            except RuntimeError as e:  # a backend that does not take the shape
                print(f"  ({name} refused {kind} d{d} L{L}: {str(e).splitlines()[0][:80]})")
                tf[name] = float("nan")
        r = lambda x, y: f"{x / y:.2f}" if y == y and y > 0 else "—"  # noqa: E731
        print(f"| {kind} | {d} | {'yes' if causal else 'no'} | {L} | {b} | {hq}/{hkv} | "
              f"{tf['flashserve']:.1f} | {tf['cudnn']:.1f} | {tf['flash']:.1f} | "
              f"{r(tf['flashserve'], tf['cudnn'])} | {r(tf['flashserve'], tf['flash'])} |"
              + (f" {tf['flashserve_off']:.1f} | {r(tf['flashserve'], tf['flashserve_off'])} |"
                 if args.ab_env else ""), flush=True)
        rows.append(dict(kind=kind, head_dim=d, causal=causal, seqlen=L, batch=b, heads_q=hq,
                         heads_kv=hkv, **{f"{n}_tflops": f"{x:.2f}" for n, x in tf.items()}))
        del q, k, v, qt, kt, vt
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
