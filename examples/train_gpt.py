"""Trains a tiny GPT-style model twice from the same seed, once with flashserve's attention
(flash_attn_func, forward and backward) and once with PyTorch's scaled_dot_product_attention, and
prints the two loss curves side by side. The data are random tokens: a fixed set of random
sequences the model learns to memorise, so the loss falls and the curves have something to agree
on.

    python3 examples/train_gpt.py --device cpu --steps 300
    python3 examples/train_gpt.py --device cuda --dtype bfloat16

Needs PyTorch (2.4 or newer for flashserve's autograd) and the flashserve package (or this
checkout's python/ on PYTHONPATH with libflashserve_c.so built).
"""

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

try:
    import flashserve
except ImportError:  # run from a checkout: python/ beside this folder
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import flashserve


def attention_flashserve(q, k, v):
    """q [b, s, h, d], k/v [b, s, h_kv, d]: causal attention, GQA by flashserve itself."""
    return flashserve.flash_attn_func(q, k, v, causal=True)


def attention_sdpa(q, k, v):
    group = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(group, dim=2) for x in (k, v))
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=True)
    return out.transpose(1, 2)


ATTENTION = {"flashserve": attention_flashserve, "sdpa": attention_sdpa}


class Block(torch.nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        d, self.h, self.h_kv = cfg.d_model, cfg.heads, cfg.kv_heads
        self.hd = d // cfg.heads
        self.attention = attention
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, (self.h + 2 * self.h_kv) * self.hd, bias=False)
        self.proj = torch.nn.Linear(d, d, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(
            [self.h * self.hd, self.h_kv * self.hd, self.h_kv * self.hd], dim=-1)
        q = q.view(b, s, self.h, self.hd)
        k, v = (t.view(b, s, self.h_kv, self.hd) for t in (k, v))
        x = x + self.proj(self.attention(q, k, v).reshape(b, s, -1))
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.tok = torch.nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = torch.nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = torch.nn.ModuleList(Block(cfg, attention) for _ in range(cfg.layers))
        self.ln = torch.nn.LayerNorm(cfg.d_model)
        self.head = torch.nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def train(cfg, backend):
    """The loss of every step, training with `backend`'s attention from cfg.seed."""
    device, dtype = torch.device(cfg.device), getattr(torch, cfg.dtype)
    torch.manual_seed(cfg.seed)
    model = GPT(cfg, ATTENTION[backend]).to(device=device, dtype=dtype)
    data_gen = torch.Generator().manual_seed(cfg.seed + 1)
    data = torch.randint(0, cfg.vocab, (cfg.sequences, cfg.seq + 1), generator=data_gen)
    order_gen = torch.Generator().manual_seed(cfg.seed + 2)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    losses = []
    for _ in range(cfg.steps):
        batch = data[torch.randint(0, cfg.sequences, (cfg.batch,), generator=order_gen)].to(device)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=256,
                   help="--heads x the head dim (the CUDA kernels take head dims 64, 128, 256)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2, help="GQA: a divisor of --heads")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--sequences", type=int, default=64, help="the random sequences to memorise")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--print-every", type=int, default=10)
    return p


def check(cfg):
    if cfg.heads % cfg.kv_heads or cfg.d_model % cfg.heads:
        raise SystemExit("--kv-heads must divide --heads, and --heads must divide --d-model")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")


def main(argv=None):
    cfg = parser().parse_args(argv)
    check(cfg)
    curves = {backend: train(cfg, backend) for backend in ATTENTION}
    fs, sdpa = curves["flashserve"], curves["sdpa"]
    print(f"{'step':>6} {'flashserve':>12} {'sdpa':>12} {'|diff|':>10}")
    for i in range(cfg.steps):
        if i % cfg.print_every == 0 or i == cfg.steps - 1:
            print(f"{i:>6} {fs[i]:>12.5f} {sdpa[i]:>12.5f} {abs(fs[i] - sdpa[i]):>10.2e}")
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(fs, sdpa))
    print(f"loss {fs[0]:.4f} -> {fs[-1]:.4f} (flashserve), {sdpa[0]:.4f} -> {sdpa[-1]:.4f} "
          f"(sdpa); largest relative difference {worst:.2e} (ln vocab = {math.log(cfg.vocab):.3f})")
    return curves


if __name__ == "__main__":
    main()
