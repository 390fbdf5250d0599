#!/usr/bin/env python3
"""transformers' prefill of one long prompt at a real model's shape, random bf16 weights, SDPA:
the comparison bench_model prints beside ours (run both in the same device call).

  python3 bench/hf_model_bench.py [--tokens 4096] [--reps 10]
Mistral-7B's shape (MistralForCausalLM, 32 layers, 32/8 heads, hidden 4096, MLP 14336, vocab 32000),
without its 4096-token sliding window (a prompt of 4096 never reaches it; without it SDPA takes its
flash path). Logits of the last token only, as a serving engine asks for.
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    import transformers
    from transformers import MistralConfig, MistralForCausalLM
    cfg = MistralConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                        vocab_size=32000, max_position_embeddings=32768, sliding_window=None)
    try:
        cfg._attn_implementation = "sdpa"
    except Exception:  # the default is SDPA where it is available
        pass
    torch.set_default_dtype(torch.bfloat16)
    t0 = time.time()
    with torch.device("cuda"):
        model = MistralForCausalLM(cfg).eval()
    torch.cuda.synchronize()
    params = sum(p.numel() for p in model.parameters())
    print(f"transformers {transformers.__version__}, torch {torch.__version__},"
          f" {torch.cuda.get_device_name()}; {params / 1e9:.3f} B parameters, init"
          f" {time.time() - t0:.1f} s", flush=True)
    ids = torch.randint(0, cfg.vocab_size, (1, args.tokens), device="cuda")
    with torch.no_grad():
        for _ in range(3):
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        torch.cuda.synchronize()
        t0 = time.time()
        for _ in range(args.reps):
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        torch.cuda.synchronize()
    ms = (time.time() - t0) / args.reps * 1e3
    n = args.tokens
    flops = 2.0 * params * n + 2.0 * cfg.num_hidden_layers * cfg.num_attention_heads * n * n * 128
    print(f"| transformers prefill {n} tokens | {ms:.2f} ms = {flops / ms / 1e9:.0f} TFLOP/s |",
          flush=True)


if __name__ == "__main__":
    main()
