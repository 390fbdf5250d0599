#!/usr/bin/env python3
"""What head dims off 64/128/256 cost (issue 24): flashserve.flash_attn_func at head dims that run
on a padded sm80 kernel (96 on d128's; 160, 192 and DeepSeek's 192/128 on d256's) beside the same
call at the padded kernel's own head dim (FLASHSERVE_KERNEL=sm80, the same kernel family, and the
default dispatch, which takes sm90 there) and beside PyTorch SDPA (cuDNN, flash = FA2, and the
memory-efficient backend) at the call's own head dims, one run, one GPU.

Prefill: bf16, batch x L = 16k tokens, heads = 2048 / head dim (rounded), L 512 and 4096, causal
and not; decode: batch 32, one query over 4096 keys, GQA 16/2. Each figure is --calls calls in one
CUDA graph, median of --reps replays (fa3_grid.py's timing). TFLOP/s count the real head dims:
2 b h L_q L_k (d_qk + d_v), halved when causal. "own/K" is the time of the call over the time of
the same shape at the kernel's head dim K on sm80: the padded kernel's overhead beyond its FLOPs
(a d96 call doing d128's work costs 1.0 by this measure, at 75% of d128's TFLOP/s).

Usage (repo root): PYTHONPATH=python FLASHSERVE_LIBRARY=.../libflashserve_c.so \
    python3 bench/head_dim_cost.py [--csv F]
"""
import argparse
import csv
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from fa3_grid import graph_ms  # noqa: E402
from flashserve import flash_attn_func  # noqa: E402

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def kernel_dim(d, dv):
    m = max(d, dv)
    return 64 if m <= 64 else 128 if m <= 128 else 256


def timed(fn, calls, reps, family=None):
    """Milliseconds per call; FLASHSERVE_KERNEL=family while the graph is captured (the plan reads
    it then); NaN when the call is refused."""
    old = os.environ.get("FLASHSERVE_KERNEL")
    if family:
        os.environ["FLASHSERVE_KERNEL"] = family
    try:
        return graph_ms(fn, calls, reps)
    except (RuntimeError, NotImplementedError, ValueError) as e:
        print(f"  (refused: {str(e).splitlines()[0][:100]})")
        return float("nan")
    finally:
        if family:
            if old is None:
                del os.environ["FLASHSERVE_KERNEL"]
            else:
                os.environ["FLASHSERVE_KERNEL"] = old


def main():
    # The padded kernels are off by default until their first device run (cuda/plan.h).
    os.environ.setdefault("FLASHSERVE_PADDED_HEAD_DIMS", "1")
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="96/96,160/160,192/192,192/128")
    ap.add_argument("--seqlens", type=ints, default=[512, 4096])
    ap.add_argument("--total-tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--csv", default="")
    args = ap.parse_args()
    dims = [tuple(int(x) for x in p.split("/")) for p in args.dims.split(",")]
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}, bf16, {args.calls} calls per graph\n")
    print("| d/dv | K | shape | causal | ours TF/s | K sm80 TF/s | K default TF/s | cuDNN | "
          "flash | efficient | own/K (time) | ours/cuDNN | ours/flash |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    r = lambda x, y: f"{x / y:.2f}" if y == y and y > 0 and x == x else "—"  # noqa: E731
    for d, dv in dims:
        K = kernel_dim(d, dv)
        heads = max(1, round(args.hidden / d))
        shapes = [(f"L{L} b{max(1, args.total_tokens // L)}", max(1, args.total_tokens // L), L, L,
                   heads, heads, causal) for L in args.seqlens for causal in (0, 1)]
        shapes.append(("decode b32 4k", 32, 1, 4096, 16, 2, 0))
        for name, b, sq, sk, hq, hkv, causal in shapes:
            mk = lambda s, h, dim: torch.rand(b, s, h, dim, device="cuda",  # noqa: E731
                                               dtype=torch.bfloat16) - 0.5
            q, k, v = mk(sq, hq, d), mk(sk, hkv, d), mk(sk, hkv, dv)
            qK, kK, vK = mk(sq, hq, K), mk(sk, hkv, K), mk(sk, hkv, K)
            pairs = sq * sk if not causal else sq * sk / 2
            flops = 2.0 * b * hq * pairs * (d + dv)
            ms = {}
            ms["ours"] = timed(lambda: flash_attn_func(q, k, v, causal=bool(causal)), args.calls,
                               args.reps)
            ms["K_sm80"] = timed(lambda: flash_attn_func(qK, kK, vK, causal=bool(causal)),
                                 args.calls, args.reps, "sm80")
            ms["K_default"] = timed(lambda: flash_attn_func(qK, kK, vK, causal=bool(causal)),
                                    args.calls, args.reps)
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            for bname, backend in BACKENDS.items():
                try:
                    with sdpa_kernel(backend):
                        fn = lambda: F.scaled_dot_product_attention(  # noqa: E731
                            qt, kt, vt, is_causal=bool(causal), enable_gqa=hq != hkv)
                        ms[bname] = graph_ms(fn, args.calls, args.reps)
                except RuntimeError as e:
                    print(f"  ({bname} refused {d}/{dv} {name}: {str(e).splitlines()[0][:80]})")
                    ms[bname] = float("nan")
            flopsK = 4.0 * b * hq * pairs * K
            tf = {n: (flops if n in ("ours", "cudnn", "flash", "efficient") else flopsK) / x / 1e9
                  for n, x in ms.items()}
            f = lambda x: f"{x:.1f}" if x == x else "—"  # noqa: E731
            print(f"| {d}/{dv} | {K} | {name} | {'yes' if causal else 'no'} | {f(tf['ours'])} | "
                  f"{f(tf['K_sm80'])} | {f(tf['K_default'])} | {f(tf['cudnn'])} | "
                  f"{f(tf['flash'])} | {f(tf['efficient'])} | {r(ms['ours'], ms['K_sm80'])} | "
                  f"{r(ms['cudnn'], ms['ours'])} | {r(ms['flash'], ms['ours'])} |", flush=True)
            rows.append(dict(head_dim=d, head_dim_v=dv, kernel_dim=K, shape=name, causal=causal,
                             **{f"{n}_ms": f"{x:.4f}" for n, x in ms.items()}))
            del q, k, v, qK, kK, vK
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
