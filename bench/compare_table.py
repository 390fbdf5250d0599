#!/usr/bin/env python3
"""Sets bench_attn's CSV beside sdpa_compare.py's (same run, same GPU) as one markdown table.

usage: compare_table.py OURS.csv SDPA.csv [--header TEXT]  -> markdown on stdout
"""
import argparse
import csv
import math


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ours")
    ap.add_argument("sdpa")
    ap.add_argument("--header", default="")
    a = ap.parse_args()
    ours, ref, copy_tbs = {}, {}, None
    with open(a.ours) as f:
        for r in csv.DictReader(f):
            if r["kind"] == "copy":
                copy_tbs = float(r["tflops_or_tbs"])
                continue
            key = (r["kind"], int(r["head_dim"]), int(r["causal"]), int(r["seqlen"]), int(r["batch"]))
            ours[key] = float(r["tflops_or_tbs"])
    with open(a.sdpa) as f:
        for r in csv.DictReader(f):
            key = (r["kind"], int(r["head_dim"]), int(r["causal"]), int(r["seqlen"]), int(r["batch"]))
            ref.setdefault(key, {})[r["backend"]] = float(r["tflops_or_tbs"])

    def fmt(x, nd=1):
        return "—" if x is None or math.isnan(x) else f"{x:.{nd}f}"

    def ratio(x, y):
        return "—" if x is None or y is None or math.isnan(x) or math.isnan(y) or y == 0 else f"{x / y:.2f}"

    if a.header:
        print(a.header + "\n")
    print("Prefill, TFLOP/s (ratio = flashserve / backend)\n")
    print("| head_dim | causal | seqlen | flashserve | flash | cudnn | vs flash | vs cudnn |")
    print("|---|---|---|---|---|---|---|---|")
    worst, below = None, []
    for key in sorted(k for k in ref if k[0] == "prefill"):
        _, d, c, s, b = key
        o, fl, cu = ours.get(key), ref[key].get("flash"), ref[key].get("cudnn")
        print(f"| {d} | {'yes' if c else 'no'} | {s} | {fmt(o)} | {fmt(fl)} | {fmt(cu)} | {ratio(o, fl)} | {ratio(o, cu)} |")
        if o is not None and fl is not None and not math.isnan(fl):
            worst = min(worst, o / fl) if worst is not None else o / fl
            if o < fl:
                below.append(f"d{d} {'causal' if c else 'non-causal'} {s}: {o / fl:.3f}")
    if worst is not None:
        # Three decimals: a two-decimal 1.00 can hide a shape just below the bar.
        print(f"\nLowest ratio to the flash backend over the grid: {worst:.3f}")
        print("Below the flash backend: " + ("; ".join(below) if below else "none"))
    dec = sorted(k for k in ref if k[0] == "decode")
    if dec:
        print(f"\nDecode (32 q heads / 8 kv heads, d=128), TB/s of K+V read; copy bandwidth in the same run: {fmt(copy_tbs, 2)} TB/s\n")
        print("| batch | kv_len | flashserve | flash | cudnn | vs flash | vs cudnn |")
        print("|---|---|---|---|---|---|---|")
        for key in sorted(dec, key=lambda k: k[4]):
            _, d, c, s, b = key
            o, fl, cu = ours.get(key), ref[key].get("flash"), ref[key].get("cudnn")
            print(f"| {b} | {s} | {fmt(o, 2)} | {fmt(fl, 2)} | {fmt(cu, 2)} | {ratio(o, fl)} | {ratio(o, cu)} |")


if __name__ == "__main__":
    main()
