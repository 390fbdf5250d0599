#!/usr/bin/env python3
"""Summarise `flashserve bench-serve --step-log` files: where a run's GPU time went, step by step.

Per log (one policy and seed each, or every (policy, seed) in a log that holds several): steps,
GPU-busy seconds against the run's span, tokens, the share of busy time at each token budget, the
mean microseconds a token of the steps that filled their budget (a deployment's speed at that
budget: compare runs of one call, as calls may land on GPUs a few percent apart), the mixed steps'
median / p90 / p99 / max milliseconds per budget, the decode-weighted p99 step (what the P99 TBT
sees when every running request decodes each step), the windows of 32 mixed steps that --budget
auto adjusts by (each one's slowest step), the steps past an SLO, the CUDA graph
captures and their steps' times, and (logs of runs with --profile) the profile's cost of the
run's own batches against what they took, by kind of step, decode-only steps by batch size (with
the spread of their keys, max / mean, in logs that have the batch columns) and mixed steps by size
(64-token bins): where the calibrated simulator is off.

    python3 bench/step_log_summary.py steps-auto.csv steps-1024.csv [--slo-ms 46.2]

Only the Python standard library; the logs' columns: policy, seed, step, end_s, seconds, tokens,
decodes, budget, graph_captures, predicted_s, decode_kv_mean, decode_kv_max, chunks,
chunk_cached_max (src/cli/bench_serve.cc; logs written before predicted_s existed lack it, and
before session 27 the last four).
"""
import argparse
import csv
import statistics
import sys
from collections import defaultdict


def quantile(sorted_xs, q):
    return sorted_xs[min(len(sorted_xs) - 1, int(q * len(sorted_xs)))]


def summarise(name, rows, slo_s):
    sec = [float(r["seconds"]) for r in rows]
    tok = [int(r["tokens"]) for r in rows]
    dec = [int(r["decodes"]) for r in rows]
    bud = [int(r["budget"]) for r in rows]
    cap = [int(r["graph_captures"]) for r in rows]
    busy, span = sum(sec), float(rows[-1]["end_s"])
    print(f"## {name}: {len(rows)} steps, GPU busy {busy:.1f} s of {span:.1f}, {sum(tok)} tokens")
    share = defaultdict(float)
    for s, b in zip(sec, bud):
        share[b] += s
    print("budget share of busy time: " +
          ", ".join(f"{b} {v / busy:.0%}" for b, v in sorted(share.items())))
    print("| budget | mixed steps | full | us a token (full) | median ms | p90 | p99 | max |")
    print("|---|---|---|---|---|---|---|---|")
    mixed = defaultdict(list)
    for s, t, d, b in zip(sec, tok, dec, bud):
        if t > d:
            mixed[b].append((s, t))
    for b in sorted(mixed):
        xs = sorted(s for s, _ in mixed[b])
        full = [s / t for s, t in mixed[b] if t >= b]
        us = f"{statistics.mean(full) * 1e6:.1f}" if full else "-"
        print(f"| {b} | {len(xs)} | {len(full)} | {us} | {statistics.median(xs) * 1e3:.1f} | "
              f"{quantile(xs, 0.9) * 1e3:.1f} | {quantile(xs, 0.99) * 1e3:.1f} | {xs[-1] * 1e3:.1f} |")
    weighted = sorted(s for s, d in zip(sec, dec) for _ in range(d))
    if weighted:
        print(f"decode-weighted p99 step: {quantile(weighted, 0.99) * 1e3:.1f} ms")
    # --budget auto's view: windows of 32 mixed steps in run order, each window's slowest step
    # (graph captures and stalls included). A run's P99 step sits ~1 ms above its median window's
    # slowest (session 28), which is what the auto budget's margin is measured against.
    order = [s for s, t, d in zip(sec, tok, dec) if t > d]
    slowest = sorted(max(order[i:i + 32]) for i in range(0, len(order) - 31, 32))
    if slowest:
        print(f"windows of 32 mixed steps: {len(slowest)}, slowest step median "
              f"{statistics.median(slowest) * 1e3:.1f} ms, p90 {quantile(slowest, 0.9) * 1e3:.1f}; "
              f"past 95% of the SLO {sum(x > 0.95 * slo_s for x in slowest) / len(slowest):.0%}, "
              f"past the SLO {sum(x > slo_s for x in slowest) / len(slowest):.0%}")
    captured = [i for i in range(len(rows)) if cap[i] > (cap[i - 1] if i else 0)]
    over = [i for i in range(len(rows)) if sec[i] > slo_s]
    print(f"steps past {slo_s * 1e3:.1f} ms: {len(over)} ({sum(dec[i] for i in over)} decode "
          f"tokens), {len(set(over) & set(captured))} of them captures")
    if captured:
        cs = sorted(sec[i] for i in captured)
        print(f"CUDA graph captures: {cap[-1]}; their steps median {statistics.median(cs) * 1e3:.1f} "
              f"ms, max {cs[-1] * 1e3:.1f}")
    if all(r.get("predicted_s") for r in rows):
        compare_with_profile(rows, sec, tok, dec, bud)
    print()


def compare_with_profile(rows, sec, tok, dec, bud):
    """The profile's cost of each batch (predicted_s) against its measured time, by kind."""
    pred = [float(r["predicted_s"]) for r in rows]
    kinds = defaultdict(list)
    for i in range(len(rows)):
        kind = ("decode-only" if tok[i] == dec[i] else
                "mixed, full budget" if tok[i] >= bud[i] else "mixed, under budget")
        kinds[kind].append(i)
    print(f"profile's cost of these batches: {sum(pred):.2f} s against {sum(sec):.2f} s measured "
          f"({sum(pred) / sum(sec) - 1:+.1%})")
    print("| steps | count | measured s | predicted s | predicted / measured | median step ratio |")
    print("|---|---|---|---|---|---|")
    for kind in ("decode-only", "mixed, under budget", "mixed, full budget"):
        ix = kinds.get(kind)
        if not ix:
            continue
        m, p = sum(sec[i] for i in ix), sum(pred[i] for i in ix)
        med = statistics.median(pred[i] / sec[i] for i in ix if sec[i] > 0)
        print(f"| {kind} | {len(ix)} | {m:.2f} | {p:.2f} | {p / m - 1:+.1%} | {med:.3f} |")
    # By size: a cliff the profile's grid misses (the CUDA runner's mixed steps run padded to
    # their token bucket, model/step_graphs.h) shows as a bin whose ratio drops from its
    # neighbours'. Bins of 64 tokens, those with at least 10 mixed steps.
    bins = defaultdict(list)
    for i in range(len(rows)):
        if tok[i] > dec[i] and sec[i] > 0:
            bins[tok[i] // 64 * 64].append(i)
    # Decode-only steps by batch size; with the batch columns (logs since session 27) also how
    # uneven the decodes' keys were (max / mean): the profile's decode tables were measured with
    # every decode at one length and cost a batch at its mean.
    uneven = "decode_kv_max" in rows[0]
    by_batch = defaultdict(list)
    for i in kinds.get("decode-only", []):
        if sec[i] > 0:
            by_batch[1 << max(0, dec[i] - 1).bit_length()].append(i)
    print("| decode-only steps of decodes | count | median measured ms | "
          "median predicted / measured |" + (" median max / mean keys |" if uneven else ""))
    print("|---|---|---|---|" + ("---|" if uneven else ""))
    for b in sorted(by_batch):
        ix = by_batch[b]
        line = (f"| {b // 2 + 1 if b > 1 else 1}-{b} | {len(ix)} | "
                f"{statistics.median(sec[i] for i in ix) * 1e3:.1f} | "
                f"{statistics.median(pred[i] / sec[i] for i in ix):.3f} |")
        if uneven:
            spread = [float(rows[i]["decode_kv_max"]) / float(rows[i]["decode_kv_mean"]) for i in ix]
            line += f" {statistics.median(spread):.2f} |"
        print(line)
    print("| mixed steps of tokens | count | median measured ms | median predicted ms | "
          "median predicted / measured |")
    print("|---|---|---|---|---|")
    for lo in sorted(bins):
        ix = bins[lo]
        if len(ix) < 10:
            continue
        print(f"| {lo}-{lo + 63} | {len(ix)} | {statistics.median(sec[i] for i in ix) * 1e3:.1f} | "
              f"{statistics.median(pred[i] for i in ix) * 1e3:.1f} | "
              f"{statistics.median(pred[i] / sec[i] for i in ix):.3f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--slo-ms", type=float, default=46.2, help="the P99 TBT SLO (strict: 46.2)")
    args = ap.parse_args()
    for path in args.logs:
        runs = defaultdict(list)
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                runs[(r["policy"], r["seed"])].append(r)
        if not runs:
            sys.exit(f"{path}: no steps")
        for (policy, seed), rows in runs.items():
            summarise(f"{path} ({policy}, seed {seed})", rows, args.slo_ms / 1e3)


if __name__ == "__main__":
    main()
