#!/usr/bin/env python3
"""Sustained load: flashserve's flash_attn_func and SDPA's cuDNN, each replayed for --seconds in
CUDA graphs, with the SM clock, power and temperature sampled by nvidia-smi every 50 ms.

The question of docs/kernel-notes.md (runs 35-36): our d128 non-causal kernel measures ~12% faster
after a pause (bench_sm90) than under sustained graph replays (fa3_grid.py), while cuDNN's figure
hardly moves. If the GPU lowers its clock under our load more than under cuDNN's (power), the
table below shows it: per phase, TFLOP/s, mean SM clock, mean power and their ratio.

Usage (repo root, libflashserve_c built with CUDA; the GPU machine):
    PYTHONPATH=python FLASHSERVE_LIBRARY=.../libflashserve_c.so python3 bench/sustained_clock.py \
        [--shapes 128:16384:0,128:512:0] [--seconds 4]
"""
import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from flashserve import flash_attn_func  # noqa: E402
from python_host_cost import graphed  # noqa: E402


def sustained(fn, seconds):
    """Replays a graph of 10 calls until `seconds` have passed; returns (ms per call, start, end)."""
    replay = graphed(lambda: [fn() for _ in range(10)])
    replay()
    torch.cuda.synchronize()
    start = time.time()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = 0
    a.record()
    while time.time() - start < seconds:
        for _ in range(5):
            replay()
        n += 50
        torch.cuda.synchronize()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / n, start, time.time()


def smi_samples(path):
    rows = []
    with open(path) as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 4 or not parts[1][:1].isdigit():
                continue
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((t, float(parts[1].split()[0]), float(parts[2].split()[0]),
                         float(parts[3].split()[0])))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="128:16384:0,128:512:0", help="d:L:causal,...")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--total-tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    args = ap.parse_args()
    log = tempfile.NamedTemporaryFile(suffix=".csv", delete=False).name
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader", "-lms", "50", "-f", log])
    time.sleep(1.0)
    phases = []
    for spec in args.shapes.split(","):
        d, L, causal = (int(x) for x in spec.split(":"))
        b, h = max(1, args.total_tokens // L), args.hidden // d
        q, k, v = (torch.rand(b, L, h, d, device="cuda", dtype=torch.bfloat16) - 0.5 for _ in range(3))
        flops = 4.0 * b * h * L * L * d * (0.5 if causal else 1.0)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))

        for name, fn in (("flashserve", lambda: flash_attn_func(q, k, v, causal=bool(causal))),
                         ("cuDNN", cudnn)):
            time.sleep(1.0)  # idle between phases: each starts from the same cool state
            ms, t0, t1 = sustained(fn, args.seconds)
            phases.append((f"d{d} L{L} causal {causal}", name, flops / ms / 1e9, t0, t1))
    time.sleep(0.3)
    smi.terminate()
    smi.wait()
    samples = smi_samples(log)
    print("| shape | kernel | TFLOP/s | SM MHz (mean, last half) | W (mean, last half) | °C max | "
          "TFLOP/s per GHz |")
    print("|---|---|---|---|---|---|---|")
    for shape, name, tf, t0, t1 in phases:
        mid = (t0 + t1) / 2
        inside = [s for s in samples if mid <= s[0] <= t1]
        if not inside:
            print(f"| {shape} | {name} | {tf:.1f} | — | — | — | — |")
            continue
        mhz = sum(s[1] for s in inside) / len(inside)
        watts = sum(s[2] for s in inside) / len(inside)
        temp = max(s[3] for s in inside)
        print(f"| {shape} | {name} | {tf:.1f} | {mhz:.0f} | {watts:.0f} | {temp:.0f} | "
              f"{tf / (mhz / 1000):.1f} |", flush=True)


if __name__ == "__main__":
    main()
