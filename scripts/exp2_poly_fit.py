#!/usr/bin/env python3
"""The coefficients of sm90/exp2_poly.h: 2^f on [-1/2, 1/2] as 1 + f (c1 + f (c2 + ... + f c5)),
minimax in relative error (Remez exchange, double precision), rounded to float.

  python3 scripts/exp2_poly_fit.py [--degree 6] [--c0 1.0]

The constant term is fixed (--c0; 1 so that integer x, f = 0, give 2^x exactly). The error is
e(f) = (c0 + f q(f)) / 2^f - 1 with q of degree n - 1; Remez levels e at n + 1 points (e(0) is
c0 - 1 whatever q is, so the reference avoids 0). exp2_poly.h takes --degree 6; degree 5 with
--c0 1 levels at 4.3e-7, and with the float above 1 (--c0 1.00000011920928955) at 1.2e-7, 3 ulp
once evaluated in float: above ex2.approx's 2. Pure Python: the error is ~1e-8, far above double's rounding.
tests/attention/exp2_poly_test.cc measures the float evaluation against std::exp2 in double.
"""
import argparse
import math
import struct


def solve(a, b):
    """Gaussian elimination with partial pivoting."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                k = m[r][c] / m[c][c]
                m[r] = [x - k * y for x, y in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def err(c, f, c0):
    q = 0.0
    for ck in reversed(c):
        q = q * f + ck
    return (c0 + f * q) / 2.0**f - 1.0


def remez(degree, c0=1.0, lo=-0.5, hi=0.5, iters=60, grid=40000):
    n = degree  # unknowns c1..cn, plus E: n + 1 reference points
    pts = [lo + (hi - lo) * (1 - math.cos(math.pi * (i + 0.5) / (n + 1))) / 2 for i in range(n + 1)]
    xs = [lo + (hi - lo) * i / grid for i in range(grid + 1)]
    for _ in range(iters):
        # (c0 + f q(f)) 2^-f - 1 = (-1)^i E at each reference point.
        a = [[f ** (k + 1) * 2.0**-f for k in range(n)] + [-((-1) ** i)] for i, f in enumerate(pts)]
        b = [1.0 - c0 * 2.0**-f for f in pts]
        sol = solve(a, b)
        c, e = sol[:n], sol[n]
        # New reference: the extremum of |e| in each run of one sign (runs split at e's zeros).
        es = [err(c, x, c0) for x in xs]
        runs, cur = [], [0]
        for i in range(1, len(xs)):
            if (es[i] >= 0) == (es[cur[0]] >= 0):
                cur.append(i)
            else:
                runs.append(cur)
                cur = [i]
        runs.append(cur)
        ext = [max(r, key=lambda i: abs(es[i])) for r in runs]
        # Keep the n + 1 largest consecutive alternating extrema (drop the smallest at the ends).
        while len(ext) > n + 1:
            if abs(es[ext[0]]) < abs(es[ext[-1]]):
                ext.pop(0)
            else:
                ext.pop()
        if len(ext) < n + 1:
            break
        pts = [xs[i] for i in ext]
    return c, abs(e), max(abs(v) for v in es)


def to_float(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--degree", type=int, default=6)
    ap.add_argument("--c0", type=float, default=1.0)
    args = ap.parse_args()
    c, e, emax = remez(args.degree, args.c0)
    print(f"degree {args.degree}: levelled error {e:.3e} (2^{math.log2(e):.2f}), "
          f"max on the grid {emax:.3e}")
    for k, ck in enumerate(c, 1):
        f = to_float(ck)
        print(f"  c{k} = {ck!r:24}  float {f.hex():24} {f!r}")


if __name__ == "__main__":
    main()
