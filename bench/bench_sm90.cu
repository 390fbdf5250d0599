// bench_sm90: the sm90 (Hopper) forward kernel beside the sm80 kernels and the default dispatch,
// in one run on the same inputs: TFLOP/s of attention forward (docs/architecture.md's count, halved
// when causal) at head dim 128 (or --head-dim 64), batch x seqlen = --total-tokens (16384), heads x
// head_dim = --hidden (2048), causal and not. Each figure is the median of --iters calls timed with
// CUDA events; each family is forced with FLASHSERVE_KERNEL=sm80|sm90, and "auto" (what a user
// gets) names the family the default dispatch chose. The max |difference| between the sm80 and
// sm90 outputs on the bench's inputs is printed as a sanity check (a few bf16 ulps expected).
// --window N: causal with a sliding window of N keys to the left (Mistral's), the FLOPs counted
// over the keys each row sees; --varlen: the same batch as varlen tensors ([total, heads, d] with
// cu_seqlens), the shape of packed training batches and of the engine's prefill.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
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

float to_float(uint16_t bits, bool bf16) {
  if (bf16) {
    uint32_t u = uint32_t{bits} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  __half_raw r;
  r.x = bits;
  return __half2float(__half(r));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> seqlens{4096, 8192};
  int head_dim = 128, total = 16384, hidden = 2048, iters = 20, warmup = 3, window = -1;
  bool fp16 = false, varlen = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has = i + 1 < argc;
    if (a == "--seqlens" && has) {
      seqlens = parse_int_list(argv[++i]);
    } else if (a == "--head-dim" && has) {
      head_dim = std::atoi(argv[++i]);
    } else if (a == "--total-tokens" && has) {
      total = std::atoi(argv[++i]);
    } else if (a == "--iters" && has) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--fp16") {
      fp16 = true;
    } else if (a == "--window" && has) {
      window = std::atoi(argv[++i]);
    } else if (a == "--varlen") {
      varlen = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_sm90 [--seqlens 4096,8192] [--head-dim 128] "
                   "[--total-tokens 16384] [--iters 20] [--fp16] [--window N] [--varlen]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  cudaDeviceProp prop{};
  if (!cuda_device_or_skip("bench_sm90", &prop)) return 0;
  std::printf("bench_sm90 on %s (%d SMs), %s, head dim %d, median of %d%s%s\n", prop.name,
              prop.multiProcessorCount, fp16 ? "fp16" : "bf16", head_dim, iters,
              varlen ? ", varlen" : "",
              window >= 0 ? (", causal window " + std::to_string(window)).c_str() : "");
  const auto dt = fp16 ? flashserve::DType::kFloat16 : flashserve::DType::kBFloat16;
  const size_t elems = size_t(total) * hidden;
  uint16_t *q, *k, *v, *out80, *out90, *out_auto;
  for (uint16_t** p : {&q, &k, &v, &out80, &out90, &out_auto}) CUDA_OK(cudaMalloc(p, elems * 2));
  fill_random<<<1024, 256>>>(q, elems, 1u, !fp16);
  fill_random<<<1024, 256>>>(k, elems, 2u, !fp16);
  fill_random<<<1024, 256>>>(v, elems, 3u, !fp16);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> h80(elems), h90(elems);
  int32_t* cu_seqlens = nullptr;  // --varlen: 0, s, 2s, ... (filled per seqlen)
  CUDA_OK(cudaMalloc(&cu_seqlens, (total + 1) * sizeof(int32_t)));

  std::printf("\n%-6s %-7s %-6s %-6s %10s %10s %10s %10s %-5s %12s\n", "causal", "seqlen", "batch",
              "heads", "sm80", "sm90", "sm90/sm80", "auto", "took", "max|diff|");
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  for (int causal : {0, 1})
    for (int s : seqlens) {
      if (window >= 0 && !causal) continue;  // the window is causal's
      const int b = std::max(1, total / s), h = hidden / head_dim, d = head_dim;
      if (varlen) {
        std::vector<int32_t> cu(b + 1);
        for (int i = 0; i <= b; ++i) cu[i] = i * s;
        CUDA_OK(cudaMemcpy(cu_seqlens, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
      }
      auto params = [&](uint16_t* out) {
        flashserve::AttentionParams p;
        const flashserve::Device dev{flashserve::DeviceType::kCUDA, 0};
        const auto view = [&](uint16_t* data) {
          return varlen ? flashserve::make_view(data, dt, {int64_t{b} * s, h, d}, dev)
                        : flashserve::make_view(data, dt, {b, s, h, d}, dev);
        };
        p.q = view(q);
        p.k = view(k);
        p.v = view(v);
        p.out = view(out);
        if (varlen) {
          p.cu_seqlens_q = p.cu_seqlens_k =
              flashserve::make_view(cu_seqlens, flashserve::DType::kInt32, {b + 1}, dev);
          p.max_seqlen_q = p.max_seqlen_k = s;
        }
        p.causal = causal != 0;
        p.window_left = window;
        return p;
      };
      // (query, key) pairs: all, half when causal (docs/architecture.md's count), and with a
      // window the keys each row sees (at most window + 1).
      double pairs = double(s) * s * (causal ? 0.5 : 1.0);
      if (window >= 0) {
        pairs = 0;
        for (int t = 0; t < s; ++t) pairs += std::min(t, window) + 1;
      }
      const double flops = 4.0 * b * h * pairs * d;
      float tflops[3] = {0, 0, 0};
      std::string err, took;
      for (int which = 0; which < 3; ++which) {
        setenv("FLASHSERVE_KERNEL", which == 0 ? "sm80" : which == 1 ? "sm90" : "auto", 1);
        flashserve::AttentionParams p = params(which == 0 ? out80 : which == 1 ? out90 : out_auto);
        // The workspace the call asks for, as flash_attn_func and the engine pass one (sm90
        // causal takes its tiles from a counter there; without one it runs a CTA per tile).
        try {
          p.workspace_bytes = flashserve::attention_workspace_size(p);
          if (p.workspace_bytes > workspace_bytes) {
            CUDA_OK(cudaFree(workspace));
            CUDA_OK(cudaMalloc(&workspace, p.workspace_bytes));
            workspace_bytes = p.workspace_bytes;
          }
          p.workspace = workspace;
          flashserve::attention_forward(p);
          CUDA_OK(cudaDeviceSynchronize());
        } catch (const std::exception& e) {
          err = e.what();
          continue;
        }
        const float ms = median_ms([&] { flashserve::attention_forward(p); }, warmup, iters, 200);
        tflops[which] = static_cast<float>(flops / (ms * 1e-3) / 1e12);
        if (which == 2)
          took = flashserve::plan_attention(p).summary().rfind("sm90", 0) == 0 ? "sm90" : "sm80";
      }
      unsetenv("FLASHSERVE_KERNEL");
      double max_diff = NAN;
      if (tflops[0] > 0 && tflops[1] > 0) {
        CUDA_OK(cudaMemcpy(h80.data(), out80, elems * 2, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(h90.data(), out90, elems * 2, cudaMemcpyDeviceToHost));
        max_diff = 0;
        const size_t n = size_t(b) * s * h * d;
        for (size_t i = 0; i < n; ++i)
          max_diff = std::max<double>(max_diff,
                                      std::fabs(to_float(h80[i], !fp16) - to_float(h90[i], !fp16)));
      }
      std::printf("%-6d %-7d %-6d %-6d %10.1f %10.1f %10.2f %10.1f %-5s %12.3g%s%s\n", causal, s, b,
                  h, tflops[0], tflops[1], tflops[0] > 0 ? tflops[1] / tflops[0] : 0.0, tflops[2],
                  took.c_str(), max_diff, err.empty() ? "" : "  error: ", err.c_str());
    }
  for (uint16_t* p : {q, k, v, out80, out90, out_auto}) CUDA_OK(cudaFree(p));
  CUDA_OK(cudaFree(cu_seqlens));
  CUDA_OK(cudaFree(workspace));
  return 0;
}
