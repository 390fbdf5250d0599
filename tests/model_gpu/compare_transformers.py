#!/usr/bin/env python3
"""Our CUDA model against Hugging Face transformers on the same checkpoint directories.

For three random configurations (Llama with GQA, head_dim 64; Qwen2-like with q/k/v bias and tied
embeddings; Llama 3 rope_scaling with head_dim 128), each written by our checkpoint writer
(model_logits --write-checkpoint, the code behind `flashserve make-checkpoint`) and loaded by both:

  * a batch of prompts is prefilled and then fed 32 tokens, one decode step at a time (the tokens
    transformers-fp32 picks greedily, so every step's logits are comparable); our logits at the 33
    sampled rows of each sequence against transformers in float32, beside transformers in bf16
    against the same float32 run: ours should be within bf16's error;
  * greedy tokens: our pick against float32's at every row; a disagreement where float32's gap
    between the two tokens is below bf16's error of that row is a near-tie, else a failure;
  * chunking: sequence 0 prefilled in chunks of 64, 128 and 512 tokens while the others decode in
    the same steps, against the whole prefill (differences within bf16 rounding);
  * CPU against GPU on `tiny` (flashserve make-checkpoint), and both against transformers-fp32.

  python3 tests/model_gpu/compare_transformers.py --build build/gpu [--work /tmp/cmp]
Exits non-zero when a check fails.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

D = 32  # decode steps

CONFIGS = {
    "llama-gqa": (dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=1024,
                       intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                       num_key_value_heads=4, head_dim=64, vocab_size=32000, rms_norm_eps=1e-5,
                       rope_theta=10000.0, max_position_embeddings=4096,
                       tie_word_embeddings=False, hidden_act="silu", bos_token_id=1,
                       eos_token_id=2, torch_dtype="float32"), "fp32"),
    "qwen2-bias-tied": (dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                             hidden_size=896, intermediate_size=4864, num_hidden_layers=4,
                             num_attention_heads=14, num_key_value_heads=2, head_dim=64,
                             vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1000000.0,
                             max_position_embeddings=32768, tie_word_embeddings=True,
                             use_sliding_window=False, hidden_act="silu", bos_token_id=151643,
                             eos_token_id=151643, torch_dtype="bfloat16"), "bf16"),
    "llama3-rope-d128": (dict(architectures=["LlamaForCausalLM"], model_type="llama",
                              hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
                              num_attention_heads=16, num_key_value_heads=4, head_dim=128,
                              vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0,
                              rope_scaling=dict(rope_type="llama3", factor=8.0,
                                                low_freq_factor=1.0, high_freq_factor=4.0,
                                                original_max_position_embeddings=8192),
                              max_position_embeddings=131072, tie_word_embeddings=False,
                              hidden_act="silu", bos_token_id=128000, eos_token_id=128001,
                              torch_dtype="float16"), "fp16"),
}
PROMPT_LENS = [700, 37, 256, 129]
CHUNKS = [64, 128, 512]


def log(*a):
    print(*a, flush=True)


def load_hf(path, dtype):
    from transformers import AutoModelForCausalLM
    try:
        m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except TypeError:
        m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype)
    return m.cuda().eval()


@torch.no_grad()
def hf_greedy(model, prompt, steps):
    ids = torch.tensor([prompt], device="cuda")
    out = model(input_ids=ids, use_cache=True)
    past, toks = out.past_key_values, []
    for _ in range(steps):
        nxt = int(out.logits[0, -1].float().argmax())
        toks.append(nxt)
        out = model(input_ids=torch.tensor([[nxt]], device="cuda"), past_key_values=past,
                    use_cache=True)
        past = out.past_key_values
    return toks


@torch.no_grad()
def hf_rows(model, seq, p):
    """Logits of the D + 1 sampled rows (positions p - 1 .. p + D - 1), float64 on the host."""
    out = model(input_ids=torch.tensor([seq], device="cuda"))
    return out.logits[0, p - 1:p + D].double().cpu().numpy()


def run_ours(args, model_dir, seqs, prompts, tag, device="cuda", chunk=0):
    inp = os.path.join(args.work, f"{tag}.in")
    with open(inp, "w") as f:
        f.write(f"{len(seqs)} {D}\n")
        for s, p in zip(seqs, prompts):
            f.write(" ".join(map(str, [p] + list(s))) + "\n")
    outp = os.path.join(args.work, f"{tag}.out")
    cmd = [os.path.join(args.build, "tests", "model_logits"), "--model", model_dir, "--input", inp,
           "--out", outp, "--device", device, "--chunk", str(chunk)]
    t0 = time.time()
    subprocess.run(cmd, check=True)
    dt = time.time() - t0
    vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    raw = np.fromfile(outp, dtype=np.uint8)
    n = (D + 1) * len(seqs)
    logits = raw[:n * vocab * 4].view(np.float32).reshape(D + 1, len(seqs), vocab)
    toks = raw[n * vocab * 4:].view(np.int32).reshape(D + 1, len(seqs))
    return logits.astype(np.float64), toks, dt


def write_checkpoint(args, name, cfg, dtype):
    d = os.path.join(args.work, name)
    os.makedirs(d, exist_ok=True)
    cfg_path = os.path.join(args.work, name + ".config.json")
    json.dump(cfg, open(cfg_path, "w"), indent=1)
    subprocess.run([os.path.join(args.build, "tests", "model_logits"), "--write-checkpoint",
                    "--config", cfg_path, "--out", d, "--seed", "7", "--dtype", dtype], check=True)
    return d


def compare_config(args, name, model_dir, rng, failures):
    vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    prompts = PROMPT_LENS
    m32 = load_hf(model_dir, torch.float32)
    rope = getattr(m32.config, "rope_parameters", None) or getattr(m32.config, "rope_scaling", None)
    log(f"[{name}] transformers {type(m32).__name__}, rope {rope}")
    seqs = []
    for p in prompts:
        prompt = [int(x) for x in rng.integers(0, vocab, size=p)]
        seqs.append(prompt + hf_greedy(m32, prompt, D))
    ref = np.stack([hf_rows(m32, s, p) for s, p in zip(seqs, prompts)], axis=1)  # [D+1, N, V]
    del m32
    torch.cuda.empty_cache()
    m16 = load_hf(model_dir, torch.bfloat16)
    bf = np.stack([hf_rows(m16, s, p) for s, p in zip(seqs, prompts)], axis=1)
    del m16
    torch.cuda.empty_cache()
    ours, toks, dt = run_ours(args, model_dir, seqs, prompts, name)

    e_ours, e_bf = np.abs(ours - ref), np.abs(bf - ref)
    rms = lambda e: float(np.sqrt((e ** 2).mean()))
    r_rms, r_max = rms(e_ours) / rms(e_bf), e_ours.max() / e_bf.max()
    log(f"[{name}] logits scale (rms of fp32) {rms(ref):.3f}; {len(prompts)} prompts {prompts}, "
        f"prefill + {D} decode steps, ours {dt:.1f} s")
    log(f"[{name}]   error vs transformers-fp32   ours: max {e_ours.max():.4f} rms {rms(e_ours):.5f}"
        f"   transformers-bf16: max {e_bf.max():.4f} rms {rms(e_bf):.5f}"
        f"   ratio rms {r_rms:.2f} max {r_max:.2f}")
    per_step = [(e_ours[k].max(), e_bf[k].max()) for k in range(D + 1)]
    log(f"[{name}]   after prefill: ours max {per_step[0][0]:.4f} bf16 {per_step[0][1]:.4f};"
        f" decode steps 1..{D}: ours max {max(x[0] for x in per_step[1:]):.4f}"
        f" bf16 {max(x[1] for x in per_step[1:]):.4f};"
        f" steps where ours > bf16: {sum(1 for a, b in per_step if a > b)}/{D + 1}")
    if r_rms > 1.0 or r_max > 1.5:
        failures.append(f"{name}: error ratio rms {r_rms:.2f} max {r_max:.2f}")

    # Greedy agreement against float32, with near-ties (gap below bf16's error of the row).
    a32 = ref.argmax(-1)
    ours_arg = ours.argmax(-1)
    if not (toks == ours_arg).all():
        failures.append(f"{name}: GPU greedy sampler differs from argmax of our logits "
                        f"at {(toks != ours_arg).sum()} rows")
    mism = near = 0
    for k in range(D + 1):
        for i in range(len(prompts)):
            if toks[k, i] != a32[k, i]:
                mism += 1
                gap = ref[k, i, a32[k, i]] - ref[k, i, toks[k, i]]
                if gap < e_bf[k, i].max():
                    near += 1
    log(f"[{name}]   greedy tokens: {(D + 1) * len(prompts)} rows, {mism} differ from fp32's"
        f" ({near} near-ties, {mism - near} real)")
    if mism - near > 0:
        failures.append(f"{name}: {mism - near} greedy disagreements that are not near-ties")

    # Chunked prefill mixed with decodes against the whole prefill.
    for c in CHUNKS:
        ch, ctoks, _ = run_ours(args, model_dir, seqs, prompts, f"{name}-chunk{c}", chunk=c)
        diff = np.abs(ch - ours)
        log(f"[{name}]   chunk {c}: max |chunked - whole| {diff.max():.4f} (bf16 error max"
            f" {e_bf.max():.4f}), tokens equal {int((ctoks == toks).sum())}/{toks.size}")
        if diff.max() > e_bf.max():
            failures.append(f"{name}: chunk {c} differs by {diff.max():.4f}")


def compare_tiny(args, rng, failures):
    d = os.path.join(args.work, "tiny")
    subprocess.run([os.path.join(args.build, "src", "flashserve"), "make-checkpoint", "--shape",
                    "tiny", "--out", d], check=True, stdout=subprocess.DEVNULL)
    vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
    prompts = [100, 7, 33]
    seqs = [[int(x) for x in rng.integers(0, vocab, size=p + D)] for p in prompts]
    gpu, gt, _ = run_ours(args, d, seqs, prompts, "tiny-gpu")
    cpu, ct, _ = run_ours(args, d, seqs, prompts, "tiny-cpu", device="cpu")
    m32 = load_hf(d, torch.float32)
    ref = np.stack([hf_rows(m32, s, p) for s, p in zip(seqs, prompts)], axis=1)
    m16 = load_hf(d, torch.bfloat16)
    bf = np.stack([hf_rows(m16, s, p) for s, p in zip(seqs, prompts)], axis=1)
    e_gpu, e_cpu, e_bf = (np.abs(x - ref).max() for x in (gpu, cpu, bf))
    log(f"[tiny] CPU vs GPU: max |cpu - gpu| {np.abs(cpu - gpu).max():.4f}; vs transformers-fp32:"
        f" cpu {e_cpu:.2e}, gpu {e_gpu:.4f}, transformers-bf16 {e_bf:.4f};"
        f" greedy equal cpu/gpu {int((gt == ct).sum())}/{gt.size}")
    if e_gpu > 1.5 * e_bf or e_cpu > 1e-2 * max(e_bf, 1e-3):
        failures.append(f"tiny: cpu {e_cpu:.2e} gpu {e_gpu:.4f} vs bf16 {e_bf:.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build/gpu")
    ap.add_argument("--work", default="/tmp/flashserve-compare")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import transformers
    log(f"torch {torch.__version__}, transformers {transformers.__version__},"
        f" {torch.cuda.get_device_name()}")
    rng = np.random.default_rng(0)
    failures = []
    for name, (cfg, dtype) in CONFIGS.items():
        if args.only and name != args.only:
            continue
        try:
            d = write_checkpoint(args, name, cfg, dtype)
            compare_config(args, name, d, rng, failures)
        except Exception as e:  # report and go on to the next configuration
            failures.append(f"{name}: {type(e).__name__}: {e}")
            log(f"[{name}] ERROR {type(e).__name__}: {e}")
    if not args.only:
        try:
            compare_tiny(args, rng, failures)
        except Exception as e:
            failures.append(f"tiny: {type(e).__name__}: {e}")
            log(f"[tiny] ERROR {type(e).__name__}: {e}")
    log("FAILURES:\n  " + "\n  ".join(failures) if failures else "all comparisons passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
