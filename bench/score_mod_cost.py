#!/usr/bin/env python3
"""What softcap and ALiBi cost: flashserve.flash_attn_func with and without the score modifiers,
one run, one GPU (issue 24).

Per shape (bf16, batch x L = 16k tokens, heads x head dim = 2048, as bench/fa3_grid.py) four
calls: plain, softcap=50 (Gemma-2's value), alibi_slopes (the ALiBi paper's geometric slopes,
2^(-8 i / heads)), and both; each timed as fa3_grid.py times (--calls calls in one CUDA graph,
median of --reps replays). The modifier calls take the sm80 kernels (sm90 lacks the modifiers:
plan.cc's sm90_lacks), so the plain row is printed twice when FLASHSERVE_KERNEL=sm80 forces the
family: run it once plain and once forced to read both the modifiers' own cost (against plain
sm80) and what a user of them gives up (against the default dispatch).

Usage (repo root): PYTHONPATH=python FLASHSERVE_LIBRARY=.../libflashserve_c.so \
    python3 bench/score_mod_cost.py [--head-dims 64,128,256] [--seqlens 512,4096] [--csv F]
"""
import argparse
import csv
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from fa3_grid import graph_ms  # noqa: E402
from flashserve import flash_attn_func  # noqa: E402

VARIANTS = ("plain", "softcap", "alibi", "both")


def main():
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dims", type=ints, default=[64, 128, 256])
    ap.add_argument("--seqlens", type=ints, default=[512, 4096])
    ap.add_argument("--causal", type=ints, default=[0, 1])
    ap.add_argument("--total-tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--csv", default="")
    args = ap.parse_args()
    torch.manual_seed(0)
    forced = os.environ.get("FLASHSERVE_KERNEL", "")
    print(f"{torch.cuda.get_device_name()}, bf16, FLASHSERVE_KERNEL={forced or '(default)'}\n")
    print("| d | causal | L | plain | softcap | alibi | both | softcap/plain | alibi/plain | "
          "both/plain |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for d in args.head_dims:
        heads = args.hidden // d
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)],
                              device="cuda", dtype=torch.float32)
        for causal in args.causal:
            for L in args.seqlens:
                b = max(1, args.total_tokens // L)
                q, k, v = (torch.rand(b, L, heads, d, device="cuda", dtype=torch.bfloat16) - 0.5
                           for _ in range(3))
                flops = 4.0 * b * heads * L * L * d * (0.5 if causal else 1.0)
                kw = {"plain": {}, "softcap": {"softcap": 50.0}, "alibi": {"alibi_slopes": slopes},
                      "both": {"softcap": 50.0, "alibi_slopes": slopes}}
                tf = {}
                for name in VARIANTS:
                    fn = lambda: flash_attn_func(q, k, v, causal=bool(causal), **kw[name])  # noqa
                    tf[name] = flops / graph_ms(fn, args.calls, args.reps) / 1e9
                print(f"| {d} | {'yes' if causal else 'no'} | {L} | "
                      + " | ".join(f"{tf[n]:.1f}" for n in VARIANTS) + " | "
                      + " | ".join(f"{tf[n] / tf['plain']:.2f}" for n in VARIANTS[1:]) + " |",
                      flush=True)
                rows.append(dict(forced=forced, head_dim=d, causal=causal, seqlen=L, batch=b,
                                 **{f"{n}_tflops": f"{tf[n]:.2f}" for n in VARIANTS}))
                del q, k, v
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
