#!/usr/bin/env python3
"""The CPU path through the public call, beside PyTorch's CPU scaled_dot_product_attention.

GFLOP/s of flashserve.flash_attn_func on torch CPU tensors (and on NumPy arrays, float32), and of
torch.nn.functional.scaled_dot_product_attention on CPU (torch.set_num_threads(nproc)), measured
in the same run, with the ratio ours / SDPA. Grid: float32 and bfloat16, head dims 64 and 128,
causal and not, L = 1k..8k, 16 heads, batch = max(1, --tokens / L). FLOPs = 4 * batch * heads *
L^2 * d, half when causal. Each figure is the median of the calls made in --min-seconds (at least
--min-calls) after one warm-up call. Without torch (a machine without PyPI) only our NumPy float32
figures are printed. Each configuration's two outputs are also compared (max abs difference) so a
fast wrong answer cannot pass. About 30 s on a 16-core Xeon for the default grid.

  python3 bench/cpu_sdpa_compare.py [--quick] [--csv out.csv]
"""
import argparse
import csv
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from flashserve import flash_attn_func  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the build machine has no PyTorch
    torch = None


def median_s(fn, min_s, min_calls):
    t0 = time.perf_counter()
    fn()  # warm-up
    if time.perf_counter() - t0 > 2 * min_s:
        min_calls = 1  # a long call (L = 8k) is timed once more, not three times: the grid's budget
    times = []
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < min_s:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 20:
            break
    return statistics.median(times)


def ints(s):
    return [int(x) for x in s.split(",") if x]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--head-dims", type=ints, default=[64, 128])
    ap.add_argument("--seqlens", type=ints, default=[1024, 2048, 4096, 8192])
    ap.add_argument("--causal", type=ints, default=[0, 1])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=2048, help="batch = max(1, tokens / L)")
    ap.add_argument("--min-seconds", type=float, default=0.15)
    ap.add_argument("--min-calls", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="L = 1k, 2k only")
    ap.add_argument("--csv")
    a = ap.parse_args()
    if a.quick:
        a.seqlens = [s for s in a.seqlens if s <= 2048]
    nproc = len(os.sched_getaffinity(0))
    if torch is not None:
        torch.set_num_threads(nproc)
        cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "?")()
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; CPU capability {cap}")
    else:
        print("torch not installed: our NumPy float32 figures only (no SDPA, no bfloat16)")
    print(f"{nproc} CPUs; FLASHSERVE_CPU_AMX={os.environ.get('FLASHSERVE_CPU_AMX', '(default: on)')}, "
          f"FLASHSERVE_CPU_BF16_PAIRS={os.environ.get('FLASHSERVE_CPU_BF16_PAIRS', '0')}")
    hdr = f"{'dtype':8} {'d':>4} {'causal':>6} {'L':>5} {'batch':>5} {'ours':>8} {'numpy':>8} {'sdpa':>8} {'ratio':>6} {'maxdiff':>8}"
    print(hdr + "   (GFLOP/s)")
    rows = []
    rng = np.random.default_rng(0)
    t_start = time.perf_counter()
    for dtname in a.dtypes.split(","):
        if torch is None and dtname != "float32":
            print(f"{dtname}: skipped (needs torch)")
            continue
        for d in a.head_dims:
            for causal in a.causal:
                for L in a.seqlens:
                    b, h = max(1, a.tokens // L), a.heads
                    flops = 4.0 * b * h * L * L * d * (0.5 if causal else 1.0)
                    shape = (b, L, h, d)
                    qn, kn, vn = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
                    ours = numpy_g = sdpa = None
                    diff = float("nan")
                    if dtname == "float32" and (torch is None or L <= 2048):  # same path as torch
                        s = median_s(lambda: flash_attn_func(qn, kn, vn, causal=bool(causal)),
                                     a.min_seconds, a.min_calls)
                        numpy_g = flops / s / 1e9
                    if torch is not None:
                        tdt = getattr(torch, dtname)
                        q, k, v = (torch.from_numpy(x).to(tdt) for x in (qn, kn, vn))
                        # SDPA in its own layout (batch, heads, L, d), contiguous.
                        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                        s = median_s(lambda: flash_attn_func(q, k, v, causal=bool(causal)),
                                     a.min_seconds, a.min_calls)
                        ours = flops / s / 1e9
                        with torch.inference_mode():
                            s = median_s(lambda: F.scaled_dot_product_attention(
                                qt, kt, vt, is_causal=bool(causal)), a.min_seconds, a.min_calls)
                            sdpa = flops / s / 1e9
                            ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
                        out = flash_attn_func(q, k, v, causal=bool(causal))
                        diff = (out.float() - ref.transpose(1, 2).float()).abs().max().item()
                    ratio = ours / sdpa if ours and sdpa else None
                    fmt = lambda x, w=8: f"{x:{w}.1f}" if x is not None else f"{'-':>{w}}"
                    print(f"{dtname:8} {d:4} {causal:6} {L:5} {b:5} {fmt(ours)} {fmt(numpy_g)} "
                          f"{fmt(sdpa)} {fmt(ratio, 6) if ratio is None else f'{ratio:6.2f}'} "
                          f"{diff:8.1e}", flush=True)
                    rows.append(dict(dtype=dtname, d=d, causal=causal, L=L, batch=b, heads=h,
                                     ours_gflops=ours, numpy_gflops=numpy_g, sdpa_gflops=sdpa,
                                     ratio=ratio, max_abs_diff=diff))
    print(f"grid: {time.perf_counter() - t_start:.1f} s")
    # The done-when line of issue 14: the worst ratio per dtype.
    for dtname in a.dtypes.split(","):
        rs = [r["ratio"] for r in rows if r["dtype"] == dtname and r["ratio"] is not None]
        if rs:
            print(f"{dtname}: ours/SDPA min {min(rs):.2f}, median {statistics.median(rs):.2f}, "
                  f"max {max(rs):.2f}")
    bad = [r for r in rows if r["max_abs_diff"] == r["max_abs_diff"] and
           r["max_abs_diff"] > (2e-3 if r["dtype"] == "float32" else 3e-2)]
    if bad:
        print(f"MISMATCH against SDPA in {len(bad)} configurations")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else ["dtype"])
            w.writeheader()
            w.writerows(rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
