// bench_attn: times flashserve's attention forward on CUDA tensors through the public API.
//
// Prefill grid (the FlashAttention-3 paper's): batch x seqlen = total tokens (16384), heads x
// head_dim = hidden (2048), seqlen 512..16384, head dims 64/128/256, causal and not. TFLOP/s by
// docs/architecture.md's count: 4 * batch * heads * seqlen_q * seqlen_k * head_dim, halved when
// causal. Decode grid: one query token per sequence, 32 query heads over 8 KV heads, head_dim 128:
// TB/s of K and V read, against the device-to-device copy bandwidth measured in the same run.
//
// Each figure is the median of --iters timed calls (CUDA events) after --warmup calls, on inputs
// drawn at random on the device (never zeros). Output: a table on stdout and, with --csv, one row
// per shape for bench/compare_table.py to set beside PyTorch SDPA.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "flashserve/attention.h"

namespace {

struct Options {
  std::vector<int> head_dims{64, 128, 256};
  std::vector<int> seqlens{512, 1024, 2048, 4096, 8192, 16384};
  std::vector<int> causal{0, 1};
  int total_tokens = 16384;
  int hidden = 2048;
  int iters = 30;
  int warmup = 5;
  bool fp16 = false;
  bool prefill = true;
  bool decode = true;
  // Prefill calls pass the workspace attention_workspace_size asks for (as flash_attn_func
  // does); --no-workspace leaves it out, as a bare C++ call does (the run then allocates what its
  // plan needs, stream-ordered).
  bool prefill_workspace = true;
  int pause_ms = 300;                 // idle time before each shape (median_ms)
  std::vector<int> decode_splits{0};  // num_splits per decode call; 0: automatic
  std::string csv;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_attn: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--head-dims")
      o.head_dims = parse_int_list(next());
    else if (a == "--seqlens")
      o.seqlens = parse_int_list(next());
    else if (a == "--causal")
      o.causal = parse_int_list(next());
    else if (a == "--total-tokens")
      o.total_tokens = std::atoi(next());
    else if (a == "--hidden")
      o.hidden = std::atoi(next());
    else if (a == "--iters")
      o.iters = std::atoi(next());
    else if (a == "--warmup")
      o.warmup = std::atoi(next());
    else if (a == "--fp16")
      o.fp16 = true;
    else if (a == "--prefill-only")
      o.decode = false;
    else if (a == "--decode-only")
      o.prefill = false;
    else if (a == "--no-workspace")
      o.prefill_workspace = false;
    else if (a == "--pause-ms")
      o.pause_ms = std::atoi(next());
    else if (a == "--decode-splits")
      o.decode_splits = parse_int_list(next());
    else if (a == "--csv")
      o.csv = next();
    else {
      std::fprintf(stderr,
                   "usage: bench_attn [--head-dims 64,128,256] [--seqlens 512,...] [--causal 0,1]\n"
                   "  [--total-tokens 16384] [--hidden 2048] [--iters 30] [--warmup 5] [--fp16]\n"
                   "  [--prefill-only | --decode-only] [--decode-splits 0,8,...] [--pause-ms 300]\n"
                   "  [--no-workspace (prefill)]\n"
                   "  [--csv FILE]\n");
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  if (o.iters < 1 || o.warmup < 0 || o.pause_ms < 0) {
    std::fprintf(stderr, "bench_attn: --iters must be >= 1, --warmup and --pause-ms >= 0\n");
    std::exit(2);
  }
  for (int sl : o.seqlens)
    if (sl < 1 || sl > o.total_tokens) {
      std::fprintf(stderr, "bench_attn: seqlen %d must be in [1, --total-tokens %d]\n", sl,
                   o.total_tokens);
      std::exit(2);
    }
  for (int d : o.head_dims)
    if (d < 1 || o.hidden % d != 0) {
      std::fprintf(stderr, "bench_attn: head dim %d must divide --hidden %d\n", d, o.hidden);
      std::exit(2);
    }
  return o;
}

flashserve::TensorView device_view(void* p, flashserve::DType dt,
                                   std::initializer_list<int64_t> s) {
  return flashserve::make_view(p, dt, s, {flashserve::DeviceType::kCUDA, 0});
}

// Runs attention_forward once, turning a library error into a message and a skipped row.
bool run_once(const flashserve::AttentionParams& p, std::string* error) {
  try {
    flashserve::attention_forward(p);
    return true;
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
}

// Allocates the device workspace attention_workspace_size asks for into p (none where it asks
// none); false, with the library's message, where the call is refused. The caller frees
// p.workspace.
bool give_workspace(flashserve::AttentionParams& p, std::string* error) {
  try {
    p.workspace_bytes = flashserve::attention_workspace_size(p);
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
  if (p.workspace_bytes) CUDA_OK(cudaMalloc(&p.workspace, p.workspace_bytes));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  cudaDeviceProp prop{};
  if (!cuda_device_or_skip("bench_attn", &prop)) return 0;
  const auto dt = o.fp16 ? flashserve::DType::kFloat16 : flashserve::DType::kBFloat16;
  std::printf("bench_attn on %s (%d SMs), %s, median of %d after %d warm-up\n", prop.name,
              prop.multiProcessorCount, o.fp16 ? "fp16" : "bf16", o.iters, o.warmup);
  FILE* csv = o.csv.empty() ? nullptr : std::fopen(o.csv.c_str(), "w");
  if (!o.csv.empty() && !csv) {
    std::fprintf(stderr, "bench_attn: cannot write %s\n", o.csv.c_str());
    return 1;
  }
  if (csv) std::fprintf(csv, "kind,head_dim,causal,seqlen,batch,heads,ms,tflops_or_tbs\n");

  // One allocation, reused: the largest prefill problem and the largest decode cache.
  const size_t prefill_elems = size_t(o.total_tokens) * o.hidden;
  const size_t decode_elems = size_t(64) * 4096 * 8 * 128;  // batch x kv_len x h_kv x d (largest)
  const size_t elems = std::max(prefill_elems, decode_elems);
  uint16_t *q, *k, *v, *out;
  CUDA_OK(cudaMalloc(&q, elems * 2));
  CUDA_OK(cudaMalloc(&k, elems * 2));
  CUDA_OK(cudaMalloc(&v, elems * 2));
  CUDA_OK(cudaMalloc(&out, elems * 2));
  fill_random<<<1024, 256>>>(q, elems, 1u, !o.fp16);
  fill_random<<<1024, 256>>>(k, elems, 2u, !o.fp16);
  fill_random<<<1024, 256>>>(v, elems, 3u, !o.fp16);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());

  if (o.prefill) {
    std::printf("\nprefill %s a workspace\n", o.prefill_workspace ? "with" : "without");
    std::printf("%-5s %-6s %-7s %-6s %-6s %10s %10s\n", "hdim", "causal", "seqlen", "batch",
                "heads", "ms", "TFLOP/s");
    for (int d : o.head_dims)
      for (int c : o.causal)
        for (int s : o.seqlens) {
          const int b = std::max(1, o.total_tokens / s), h = o.hidden / d;
          flashserve::AttentionParams p;
          p.q = device_view(q, dt, {b, s, h, d});
          p.k = device_view(k, dt, {b, s, h, d});
          p.v = device_view(v, dt, {b, s, h, d});
          p.out = device_view(out, dt, {b, s, h, d});
          p.causal = c != 0;
          std::string err;
          if ((o.prefill_workspace && !give_workspace(p, &err)) || !run_once(p, &err)) {
            std::printf("%-5d %-6d %-7d %-6d %-6d   unsupported: %s\n", d, c, s, b, h, err.c_str());
            CUDA_OK(cudaFree(p.workspace));
            continue;
          }
          const float ms =
              median_ms([&] { flashserve::attention_forward(p); }, o.warmup, o.iters, o.pause_ms);
          CUDA_OK(cudaFree(p.workspace));
          const double flops = 4.0 * b * h * double(s) * s * d * (c ? 0.5 : 1.0);
          const double tflops = flops / (ms * 1e-3) / 1e12;
          std::printf("%-5d %-6d %-7d %-6d %-6d %10.3f %10.1f\n", d, c, s, b, h, ms, tflops);
          if (csv)
            std::fprintf(csv, "prefill,%d,%d,%d,%d,%d,%.5f,%.2f\n", d, c, s, b, h, ms, tflops);
        }
  }

  if (o.decode) {
    // Copy bandwidth first: bytes read + written per second, as the anchors count it.
    const size_t copy_bytes = elems * 2;
    const float copy_ms =
        median_ms([&] { CUDA_OK(cudaMemcpyAsync(out, k, copy_bytes, cudaMemcpyDeviceToDevice)); },
                  o.warmup, o.iters, o.pause_ms);
    const double copy_tbs = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e12;
    std::printf("\ndevice-to-device copy: %.2f TB/s (read + write)\n", copy_tbs);
    if (csv) std::fprintf(csv, "copy,0,0,0,0,0,%.5f,%.3f\n", copy_ms, copy_tbs);
    std::printf("%-6s %-7s %-6s %10s %10s %12s\n", "batch", "kv_len", "splits", "ms", "KV TB/s",
                "of copy bw");
    const int decode_shapes[][2] = {{1, 32768}, {8, 8192}, {64, 4096}, {128, 2048}, {256, 1024}};
    for (const auto& bs : decode_shapes)
      for (int splits : o.decode_splits) {
        const int b = bs[0], kv = bs[1], hq = 32, hkv = 8, d = 128;
        if (size_t(b) * kv * hkv * d > elems) continue;
        flashserve::AttentionParams p;
        p.q = device_view(q, dt, {b, 1, hq, d});
        p.k = device_view(k, dt, {b, kv, hkv, d});
        p.v = device_view(v, dt, {b, kv, hkv, d});
        p.out = device_view(out, dt, {b, 1, hq, d});
        // Automatic split-KV (or the forced count), with the workspace the call asks for (without
        // one the automatic choice would not split).
        p.num_splits = splits;
        std::string err;
        if (!give_workspace(p, &err)) {
          std::printf("%-6d %-7d %-6d   unsupported: %s\n", b, kv, splits, err.c_str());
          continue;
        }
        // The workspace holds fp32 O and LSE per (split, row, head): it tells the automatic count.
        const size_t per_split = size_t(b) * hq * (d + 1) * 4;
        const std::string split_name =
            splits != 0 ? std::to_string(splits)
                        : "a" + std::to_string(std::max<size_t>(1, p.workspace_bytes / per_split));
        if (!run_once(p, &err)) {
          std::printf("%-6d %-7d %-6s   unsupported: %s\n", b, kv, split_name.c_str(), err.c_str());
          CUDA_OK(cudaFree(p.workspace));
          continue;
        }
        const float ms =
            median_ms([&] { flashserve::attention_forward(p); }, o.warmup, o.iters, o.pause_ms);
        const double bytes = 2.0 * b * kv * hkv * d * 2;  // K and V, 2 bytes each
        const double tbs = bytes / (ms * 1e-3) / 1e12;
        std::printf("%-6d %-7d %-6s %10.4f %10.2f %11.0f%%\n", b, kv, split_name.c_str(), ms, tbs,
                    100.0 * tbs / copy_tbs);
        if (csv && splits == 0)
          std::fprintf(csv, "decode,%d,0,%d,%d,%d,%.5f,%.3f\n", d, kv, b, hq, ms, tbs);
        CUDA_OK(cudaFree(p.workspace));
      }
  }
  if (csv) std::fclose(csv);
  CUDA_OK(cudaFree(q));
  CUDA_OK(cudaFree(k));
  CUDA_OK(cudaFree(v));
  CUDA_OK(cudaFree(out));
  return 0;
}
