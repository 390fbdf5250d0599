#!/usr/bin/env python3
"""The host cost of a training step's attention through flashserve's autograd, beside PyTorch
SDPA's flash and cuDNN backends in the same run (issue 22: at d128 2k, bwd_compare's timed
backward was ~1.1 ms longer than its kernels' device time, so the GPU waited on the host).

1. Host microseconds per call on a tiny shape (b 1, L 128, 4 heads, d 64: the kernels take a few
   microseconds, so a loop of calls is host-bound): the forward alone (inputs requiring grad),
   the forward + backward, and the backward's share (their difference); time.perf_counter()
   around 500 calls, torch.cuda.synchronize() only outside. `flashserve` is flash_attn_func
   (eager: the autograd Function over the host fast paths), `fs ops` the same call through the
   custom operators and their registered autograd (what torch.compile traces).
2. The same flashserve step under cProfile: the 30 functions of most own time, and the 20 of most
   cumulative time (what the Python side spends its microseconds on).
3. At bwd_compare's shape (b 8, L 2k, 16 heads, d 128): the host time to submit one backward
   (perf_counter around out.backward(g), no synchronize) beside its device time (CUDA events),
   flashserve and cuDNN: host > device means the GPU waits.

Usage (repo root, libflashserve_c built with CUDA):
    PYTHONPATH=python FLASHSERVE_LIBRARY=.../libflashserve_c.so python3 bench/bwd_host_cost.py
About 20 s on an H200.
"""
import cProfile
import io
import os
import pstats
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from flashserve import flash_attn_func  # noqa: E402
from python_host_cost import host_us  # noqa: E402  (bench/ is the script's own folder)

DT = torch.bfloat16


def leaves(b, L, h, d):
    return [torch.randn(b, L, h, d, device="cuda", dtype=DT).requires_grad_() for _ in range(3)]


def calls(b, L, h, d):
    """name -> (forward, forward + backward) closures on the same fresh inputs."""
    q, k, v = leaves(b, L, h, d)
    g = torch.randn(b, L, h, d, device="cuda", dtype=DT)
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    gt = g.transpose(1, 2)

    def ours():
        return flash_attn_func(q, k, v)

    def ours_ops():  # through the dispatcher: what every gradient call took before session 21
        return torch.ops.flashserve.fwd(q, k, v, None, False, -1, -1, 0, True)[0]

    def sdpa(backend):
        def fwd():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qt, kt, vt)
        return fwd

    rows = {"flashserve": (ours, g), "fs ops": (ours_ops, g),
            "sdpa flash": (sdpa(SDPBackend.FLASH_ATTENTION), gt),
            "sdpa cudnn": (sdpa(SDPBackend.CUDNN_ATTENTION), gt)}
    return {name: (fwd, (lambda fwd=fwd, g=g: fwd().backward(g))) for name, (fwd, g) in
            rows.items()}


def host_table():
    print("## Host us per call, tiny shape (b 1, L 128, h 4, d 64, bf16; 500 calls)")
    print(f"{'call':<12} {'fwd':>8} {'fwd+bwd':>8} {'bwd':>8}")
    for name, (fwd, step) in calls(1, 128, 4, 64).items():
        f, s = host_us(fwd, 500), host_us(step, 500)
        print(f"{name:<12} {f:8.1f} {s:8.1f} {s - f:8.1f}")
    print()


def profile():
    _, step = calls(1, 128, 4, 64)["flashserve"]
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        step()
    prof.disable()
    torch.cuda.synchronize()
    for key, n in (("tottime", 30), ("cumulative", 20)):
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats(key).print_stats(n)
        print(f"## cProfile, 300 flashserve forward + backward steps, by {key}")
        print(text.getvalue())


def submit_vs_device():
    print("## One backward at b 8, L 2048, h 16, d 128: host submit time vs device time (ms, "
          "median of 20)")
    for name, (fwd, _) in calls(8, 2048, 16, 128).items():
        g = torch.randn(8, 2048, 16, 128, device="cuda", dtype=DT)
        if name.startswith("sdpa"):
            g = g.transpose(1, 2)
        host, device = [], []
        for i in range(23):
            out = fwd()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            t0 = time.perf_counter()
            out.backward(g)
            t1 = time.perf_counter()
            b.record()
            torch.cuda.synchronize()
            if i >= 3:
                host.append((t1 - t0) * 1e3)
                device.append(a.elapsed_time(b))
        host.sort()
        device.sort()
        print(f"{name:<12} host {host[10]:7.3f}  device {device[10]:7.3f}")
    print()


if __name__ == "__main__":
    host_table()
    submit_vs_device()
    profile()
