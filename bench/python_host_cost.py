#!/usr/bin/env python3
"""What a Python caller gets from flashserve on one GPU, beside PyTorch's SDPA in the same run.

1. Host cost per call: 2000 back-to-back calls on a tiny decode shape (the kernel is a few
   microseconds, so the loop is host-bound), torch.cuda.synchronize() only outside the timed loop,
   time.perf_counter(). flashserve.flash_attn_func (the PyTorch fast path), the generic DLPack path
   (what every call cost before it), and F.scaled_dot_product_attention.
2. Eager vs CUDA-graph-captured time per call on FlashAttention-3's grid (batch x L = 16k tokens,
   hidden 2048, L 1k/4k/16k, head dim 64/128, causal and not): TFLOP/s both ways.
3. Decode with default arguments (num_splits=0, automatic) vs every forced num_splits (CUDA graph
   replays, so host cost is out of the picture): K/V bytes read per second, batch 1 x 32k and batch
   8 x 8k (32 query heads, 8 KV heads, d 128).

Usage (repo root, after building libflashserve_c with CUDA):
    PYTHONPATH=python python3 bench/python_host_cost.py
Runs in well under 60 s on an H200.
"""
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import flashserve  # noqa: E402
from flashserve import attention as fs_attention  # noqa: E402
from flashserve import flash_attn_func, flash_attn_with_kvcache  # noqa: E402

DT = torch.bfloat16


def rand(*shape):
    return torch.randn(*shape, device="cuda", dtype=DT)


def host_us(fn, calls=2000):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def event_ms(fn, iters):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def graphed(fn):
    """fn captured in a CUDA graph (after a warm-up on a side stream); returns graph.replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def host_cost():
    print("## Host cost per call (2000 calls, tiny decode: q 1x1x8x128, k/v 1x256x8x128 bf16)")
    q, k, v = rand(1, 1, 8, 128), rand(1, 256, 8, 128), rand(1, 256, 8, 128)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    # A decode step on a cache: no new token (the cache does not fill up over 2000 calls).
    lens = torch.full((1,), 255, dtype=torch.int32, device="cuda")
    rows = [
        ("flashserve.flash_attn_func (PyTorch path)", lambda: flash_attn_func(q, k, v)),
        ("flashserve generic path (DLPack + ctypes)",
         lambda: fs_attention._forward(q, k, v, varlen=False)),
        ("flashserve.flash_attn_with_kvcache (PyTorch)",
         lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)),
        ("flashserve kvcache generic path (DLPack)",
         lambda: fs_attention._with_kvcache(q, k, v, None, None, None, None, lens, None, None,
                                            None, False, (-1, -1), True, 0, False)),
        ("F.scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(qt, kt, vt)),
    ]
    with torch.inference_mode():
        results = [(name, host_us(fn)) for name, fn in rows]
    sdpa = results[-1][1]
    print(f"{'call':<46} {'us/call':>8} {'x SDPA':>7}")
    for name, us in results:
        print(f"{name:<46} {us:8.1f} {us / sdpa:7.2f}")
    print()


def eager_vs_graph():
    print("## Eager vs CUDA graph, FA3 grid (16k tokens, hidden 2048, bf16): TFLOP/s")
    print(f"{'L':>6} {'d':>4} {'causal':>6} {'eager':>8} {'graph':>8} {'graph/eager':>11} "
          f"{'SDPA eager':>10}")
    for L in (1024, 4096, 16384):
        for d in (64, 128):
            b, h = 16384 // L, 2048 // d
            q, k, v = rand(b, L, h, d), rand(b, L, h, d), rand(b, L, h, d)
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            for causal in (False, True):
                flops = 4 * b * h * L * L * d / (2 if causal else 1)
                iters = max(3, int(2e13 / flops))  # about 20 TFLOP of work per measurement
                with torch.inference_mode():
                    call = lambda: flash_attn_func(q, k, v, causal=causal)  # noqa: E731
                    eager = event_ms(call, iters)
                    graph = event_ms(graphed(call), iters)
                    sdpa = event_ms(lambda: F.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=causal), iters)
                tf = lambda ms: flops / ms / 1e9  # noqa: E731
                print(f"{L:6d} {d:4d} {int(causal):6d} {tf(eager):8.1f} {tf(graph):8.1f} "
                      f"{eager / graph:11.2f} {tf(sdpa):10.1f}")
    print()


def decode_splits():
    print("## Decode: default arguments vs forced num_splits (CUDA graph replays): K/V TB/s")
    splits = (1, 2, 4, 8, 16, 32, 64, 128)
    for b, sk in ((1, 32768), (8, 8192)):
        q, k, v = rand(b, 1, 32, 128), rand(b, sk, 8, 128), rand(b, sk, 8, 128)
        kv_bytes = 2 * k.numel() * k.element_size()
        with torch.inference_mode():
            default = event_ms(graphed(lambda: flash_attn_func(q, k, v)), 200)
            eager_default = event_ms(lambda: flash_attn_func(q, k, v), 200)
            forced = {n: event_ms(graphed(lambda n=n: flash_attn_func(q, k, v, num_splits=n)),
                                  200) for n in splits}
        best = min(forced, key=forced.get)
        tbs = lambda ms: kv_bytes / ms / 1e9  # noqa: E731
        line = " ".join(f"{n}:{tbs(ms):.2f}" for n, ms in forced.items())
        print(f"batch {b} x {sk}: default {tbs(default):.2f} TB/s (eager {tbs(eager_default):.2f}),"
              f" best num_splits={best} {tbs(forced[best]):.2f} TB/s, default/best "
              f"{forced[best] / default:.2f}")
        print(f"    forced: {line}")
    # The copy bandwidth in the same run, for scale.
    x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = event_ms(lambda: y.copy_(x), 50)
    print(f"device-to-device copy: {2 * x.numel() / ms / 1e9:.2f} TB/s (read + write)")
    print()


def main():
    if not torch.cuda.is_available() or not flashserve.cuda_available():
        print("python_host_cost: skipped: no CUDA device (or a library built without CUDA)")
        return 0
    t0 = time.perf_counter()
    print(f"# flashserve {flashserve.version()} ({flashserve.library_path()}), torch "
          f"{torch.__version__}, {torch.cuda.get_device_name()}")
    host_cost()
    eager_vs_graph()
    decode_splits()
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
