#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention on bench_attn's grid, flash (FA2) and cuDNN backends.

Same shapes, dtype, FLOP count and timing method as bench/bench_attn.cu (median of --iters calls,
each between its own pair of CUDA events, after --warmup calls; uniform random inputs), so the two
CSVs can be set side by side by bench/compare_table.py in one run on one GPU.
"""
import argparse
import csv
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def median_ms(fn, warmup, iters, pause_ms):
    # Idle time first, as bench_attn does: the GPU runs at its power cap during the grid, and a
    # pause gives every shape a comparable start.
    time.sleep(pause_ms / 1000.0)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    ms = sorted(a.elapsed_time(b) for a, b in ev)
    return ms[iters // 2]


def ints(s):
    return [int(x) for x in s.split(",") if x]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dims", type=ints, default=[64, 128, 256])
    ap.add_argument("--seqlens", type=ints, default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--causal", type=ints, default=[0, 1])
    ap.add_argument("--total-tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--pause-ms", type=int, default=300)
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--prefill-only", action="store_true")
    ap.add_argument("--decode-only", action="store_true")
    ap.add_argument("--csv", required=True)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("sdpa_compare: skipped: no CUDA device")
        return 0
    dt = torch.float16 if a.fp16 else torch.bfloat16
    dev = "cuda"
    rows = []
    print(f"sdpa_compare on {torch.cuda.get_device_name()} torch {torch.__version__} "
          f"cudnn {torch.backends.cudnn.version()}")
    for d in ([] if a.decode_only else a.head_dims):
        for c in a.causal:
            for s in a.seqlens:
                b, h = max(1, a.total_tokens // s), a.hidden // d
                # SDPA takes (batch, heads, seqlen, head_dim); transpose views of the
                # (batch, seqlen, heads, head_dim) layout flashserve uses, as FA users have them.
                q, k, v = (torch.empty(b, s, h, d, device=dev, dtype=dt).uniform_(-1, 1).transpose(1, 2)
                           for _ in range(3))
                flops = 4.0 * b * h * s * s * d * (0.5 if c else 1.0)
                for name, be in BACKENDS.items():
                    try:
                        with sdpa_kernel([be]):
                            fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(c))
                            ms = median_ms(fn, a.warmup, a.iters, a.pause_ms)
                        tf = flops / (ms * 1e-3) / 1e12
                    except RuntimeError as e:  # backend refuses this shape
                        print(f"  {name} d={d} causal={c} s={s}: unavailable ({str(e).splitlines()[0]})")
                        ms, tf = float("nan"), float("nan")
                    rows.append(("prefill", name, d, c, s, b, h, ms, tf))
                    print(f"  {name:5s} d={d:3d} causal={c} s={s:5d}: {ms:8.3f} ms {tf:7.1f} TFLOP/s", flush=True)
                del q, k, v
    if not a.prefill_only:
        hq, hkv, d = 32, 8, 128
        for b, kv in [(1, 32768), (8, 8192), (64, 4096), (128, 2048), (256, 1024)]:
            q = torch.empty(b, hq, 1, d, device=dev, dtype=dt).uniform_(-1, 1)
            k = torch.empty(b, hkv, kv, d, device=dev, dtype=dt).uniform_(-1, 1)
            v = torch.empty_like(k).uniform_(-1, 1)
            byts = 2.0 * b * kv * hkv * d * 2
            for name, be in BACKENDS.items():
                try:
                    with sdpa_kernel([be]):
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                        ms = median_ms(fn, a.warmup, a.iters, a.pause_ms)
                    tbs = byts / (ms * 1e-3) / 1e12
                except RuntimeError as e:
                    print(f"  {name} decode b={b} kv={kv}: unavailable ({str(e).splitlines()[0]})")
                    ms, tbs = float("nan"), float("nan")
                rows.append(("decode", name, d, 0, kv, b, hq, ms, tbs))
                print(f"  {name:5s} decode b={b:3d} kv={kv:5d}: {ms:8.4f} ms {tbs:6.2f} TB/s", flush=True)
            del q, k, v
    with open(a.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kind", "backend", "head_dim", "causal", "seqlen", "batch", "heads", "ms", "tflops_or_tbs"])
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
