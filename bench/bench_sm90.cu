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
// --fp8: the float8_e4m3fn forward (issue 23, FLASHSERVE_FP8_ATTENTION=1) beside the bf16 sm90
// kernel on the same values (bf16 inputs, and their e4m3 codes at 256 x the value with descale
// 1/256 per (sequence, KV head)): TFLOP/s of each, fp8/bf16, and the max |difference| of the
// outputs (e4m3's rounding of q, k, v and P: about 1e-2 of the output's scale), and the fp8 tile
// the plan chose (FLASHSERVE_FP8_BLOCK_N=192 asks for 128 x 192 at d128).
// --epilogue-ab: the sm90 kernel (forced) with FLASHSERVE_SM90_EPILOGUE=0 (register stores of O)
// and =1 (session 18's tile boundary: O by TMA store, the tile's work announced), alternated
// twice each (old, new, old, new; the better of each pair, so that a clock drift during the run
// does not pass for either), new/old, and whether the two outputs are bit-identical (they must be).
// --exp2-fma-ab: the same with FLASHSERVE_SM90_EXP2_FMA=0 (every softmax exponential on the MUFU)
// and =1 (one 8-column chunk in 8 by exp2_poly.h on the FMA pipe; d64 only, other head dims run
// the same kernel both ways), new/old, and the max |difference| of the two outputs (not the same
// bits: the polynomial and ex2.approx round differently; a bf16 ulp or two of the output).
// --fp8 --exp2-fma-ab: the same A/B on the fp8 forward (its Exp2Fma tiles at d64, d128, d256;
// the fp8 inputs of --fp8, the tile the plan chose): fma=0 / fma=1 alternated twice each,
// new/old, the max |difference| of the two outputs (P's e4m3 rounding can flip: up to ~2^-4 of
// a P, rarely), and the fp8 tile.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
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

// An A/B of one of the sm90 kernel's switches (--epilogue-ab, --exp2-fma-ab): the variable, the
// column label of its two values, and whether the two outputs must be the same bits (else the
// table shows their max |difference|).
struct SwitchAb {
  const char* variable;
  const char* label;
  bool same_bits;
};

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

// Runs p once with the workspace it asks for (grown as needed, as flash_attn_func and the engine
// pass one: sm90 causal takes its tiles from a counter there), then times it: TFLOP/s, or 0 with
// `err` set when the call is refused.
float tflops_of(flashserve::AttentionParams& p, double flops, void*& workspace,
                size_t& workspace_bytes, int warmup, int iters, std::string& err) {
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
    return 0;
  }
  const float ms = median_ms([&] { flashserve::attention_forward(p); }, warmup, iters, 200);
  return static_cast<float>(flops / (ms * 1e-3) / 1e12);
}

// The largest |a - b| over the first n elements of two device outputs (16-bit bits), through
// the host buffers ha and hb.
double max_abs_diff(const uint16_t* a, const uint16_t* b, std::vector<uint16_t>& ha,
                    std::vector<uint16_t>& hb, size_t n, bool bf16) {
  CUDA_OK(cudaMemcpy(ha.data(), a, n * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hb.data(), b, n * 2, cudaMemcpyDeviceToHost));
  double m = 0;
  for (size_t i = 0; i < n; ++i)
    m = std::max<double>(m, std::fabs(to_float(ha[i], bf16) - to_float(hb[i], bf16)));
  return m;
}

__global__ void fill_value(float* x, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = value;
}

// The tile of the plan's first launch (its summary's "tile MxN"), or "-".
std::string planned_tile(const flashserve::AttentionParams& p) {
  const std::string summary = flashserve::plan_attention(p).summary();
  const size_t at = summary.find(" tile ");
  return at == std::string::npos ? "-" : summary.substr(at + 6, summary.find(' ', at + 6) - at - 6);
}

// --fp8: bf16 sm90 (forced) beside the fp8 forward, per causal and seqlen; with `ab` (--fp8
// --exp2-fma-ab) the fp8 forward with the switch off and on instead.
int fp8_table(const cudaDeviceProp& prop, const std::vector<int>& seqlens, int head_dim, int total,
              int hidden, int warmup, int iters, const SwitchAb* ab) {
  using flashserve::DType;
  std::printf("bench_sm90 --fp8%s on %s (%d SMs), head dim %d, median of %d\n",
              ab ? (std::string(" A/B of ") + ab->variable).c_str() : "", prop.name,
              prop.multiProcessorCount, head_dim, iters);
  const size_t elems = size_t(total) * hidden;
  constexpr float kScale = 256.0f;  // codes = e4m3(256 x), descale 1/256
  uint16_t *q, *k, *v, *out16, *out8;
  uint8_t *q8, *k8, *v8;
  float* descale = nullptr;
  for (uint16_t** p : {&q, &k, &v, &out16, &out8}) CUDA_OK(cudaMalloc(p, elems * 2));
  for (uint8_t** p : {&q8, &k8, &v8}) CUDA_OK(cudaMalloc(p, elems));
  const int64_t max_descales = int64_t{total} * (hidden / head_dim);
  CUDA_OK(cudaMalloc(&descale, max_descales * sizeof(float)));
  fill_value<<<256, 256>>>(descale, max_descales, 1.0f / kScale);
  fill_random<<<1024, 256>>>(q, elems, 1u, true);
  fill_random<<<1024, 256>>>(k, elems, 2u, true);
  fill_random<<<1024, 256>>>(v, elems, 3u, true);
  to_e4m3<<<1024, 256>>>(q, q8, elems, kScale);
  to_e4m3<<<1024, 256>>>(k, k8, elems, kScale);
  to_e4m3<<<1024, 256>>>(v, v8, elems, kScale);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> h16(elems), h8(elems);
  if (ab)
    std::printf("\n%-6s %-7s %-6s %-6s %10s %10s %10s %-8s %12s\n", "causal", "seqlen", "batch",
                "heads", (std::string(ab->label) + "=0").c_str(),
                (std::string(ab->label) + "=1").c_str(), "new/old", "fp8 tile", "max|diff|");
  else
    std::printf("\n%-6s %-7s %-6s %-6s %10s %10s %10s %-8s %12s\n", "causal", "seqlen", "batch",
                "heads", "bf16 sm90", "fp8", "fp8/bf16", "fp8 tile", "max|diff|");
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  for (int causal : {0, 1})
    for (int s : seqlens) {
      const int b = std::max(1, total / s), h = hidden / head_dim, d = head_dim;
      const flashserve::Device dev{flashserve::DeviceType::kCUDA, 0};
      auto params = [&](bool fp8) {
        flashserve::AttentionParams p;
        const DType dt = fp8 ? DType::kFloat8E4M3 : DType::kBFloat16;
        p.q = flashserve::make_view(fp8 ? static_cast<void*>(q8) : q, dt, {b, s, h, d}, dev);
        p.k = flashserve::make_view(fp8 ? static_cast<void*>(k8) : k, dt, {b, s, h, d}, dev);
        p.v = flashserve::make_view(fp8 ? static_cast<void*>(v8) : v, dt, {b, s, h, d}, dev);
        p.out = flashserve::make_view(fp8 ? out8 : out16, DType::kBFloat16, {b, s, h, d}, dev);
        if (fp8)
          p.q_descale = p.k_descale = p.v_descale =
              flashserve::make_view(descale, DType::kFloat32, {b, h}, dev);
        p.causal = causal != 0;
        return p;
      };
      const double flops = 4.0 * b * h * double(s) * s * (causal ? 0.5 : 1.0) * d;
      const size_t n = size_t(b) * s * h * d;
      if (ab) {  // the fp8 forward with the switch at 0 (into out16) and 1 (into out8), twice
        float best[2] = {0, 0};
        std::string err, tile = "-";
        setenv("FLASHSERVE_FP8_ATTENTION", "1", 1);
        for (int round = 0; round < 4; ++round) {
          const int on = round % 2;
          setenv(ab->variable, on ? "1" : "0", 1);
          flashserve::AttentionParams p = params(true);
          p.out = flashserve::make_view(on ? out8 : out16, DType::kBFloat16, {b, s, h, d}, dev);
          best[on] = std::max(best[on],
                              tflops_of(p, flops, workspace, workspace_bytes, warmup, iters, err));
          if (round == 0 && best[0] > 0) tile = planned_tile(p);
        }
        unsetenv(ab->variable);
        unsetenv("FLASHSERVE_FP8_ATTENTION");
        const bool ran = best[0] > 0 && best[1] > 0;
        const double max_diff = ran ? max_abs_diff(out16, out8, h16, h8, n, true) : NAN;
        std::printf("%-6d %-7d %-6d %-6d %10.1f %10.1f %10.3f %-8s %12.3g%s%s\n", causal, s, b, h,
                    best[0], best[1], best[0] > 0 ? best[1] / best[0] : 0.0, tile.c_str(), max_diff,
                    err.empty() ? "" : "  error: ", err.c_str());
        continue;
      }
      float tflops[2] = {0, 0};
      std::string err, tile = "-";
      for (int which = 0; which < 2; ++which) {
        setenv("FLASHSERVE_KERNEL", which == 0 ? "sm90" : "auto", 1);
        setenv("FLASHSERVE_FP8_ATTENTION", "1", 1);
        flashserve::AttentionParams p = params(which == 1);
        tflops[which] = tflops_of(p, flops, workspace, workspace_bytes, warmup, iters, err);
        if (tflops[which] > 0 &&
            which == 1)  // the fp8 tile the plan chose (FLASHSERVE_FP8_BLOCK_N)
          tile = planned_tile(p);
      }
      unsetenv("FLASHSERVE_KERNEL");
      unsetenv("FLASHSERVE_FP8_ATTENTION");
      const double max_diff =
          tflops[0] > 0 && tflops[1] > 0 ? max_abs_diff(out16, out8, h16, h8, n, true) : NAN;
      std::printf("%-6d %-7d %-6d %-6d %10.1f %10.1f %10.2f %-8s %12.3g%s%s\n", causal, s, b, h,
                  tflops[0], tflops[1], tflops[0] > 0 ? tflops[1] / tflops[0] : 0.0, tile.c_str(),
                  max_diff, err.empty() ? "" : "  error: ", err.c_str());
    }
  for (uint16_t* p : {q, k, v, out16, out8}) CUDA_OK(cudaFree(p));
  for (uint8_t* p : {q8, k8, v8}) CUDA_OK(cudaFree(p));
  CUDA_OK(cudaFree(descale));
  CUDA_OK(cudaFree(workspace));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> seqlens{4096, 8192};
  int head_dim = 128, total = 16384, hidden = 2048, iters = 20, warmup = 3, window = -1;
  bool fp16 = false, varlen = false, fp8 = false;
  const SwitchAb* ab = nullptr;
  static constexpr SwitchAb kEpilogueAb{"FLASHSERVE_SM90_EPILOGUE", "epi", true};
  static constexpr SwitchAb kExp2FmaAb{"FLASHSERVE_SM90_EXP2_FMA", "fma", false};
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
    } else if (a == "--epilogue-ab") {
      ab = &kEpilogueAb;
    } else if (a == "--exp2-fma-ab") {
      ab = &kExp2FmaAb;
    } else if (a == "--fp8") {
      fp8 = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_sm90 [--seqlens 4096,8192] [--head-dim 128] "
                   "[--total-tokens 16384] [--iters 20] [--fp16] [--window N] [--varlen] "
                   "[--fp8] [--epilogue-ab | --exp2-fma-ab]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  cudaDeviceProp prop{};
  if (!cuda_device_or_skip("bench_sm90", &prop)) return 0;
  if (fp8 && ab != nullptr && ab != &kExp2FmaAb) {
    std::fprintf(stderr,
                 "bench_sm90: --fp8 takes --exp2-fma-ab only (the epilogue switch is the "
                 "16-bit tiles')\n");
    return 2;
  }
  if (fp8) return fp8_table(prop, seqlens, head_dim, total, hidden, warmup, iters, ab);
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

  if (ab)
    std::printf("\n%-6s %-7s %-6s %-6s %10s %10s %10s %10s\n", "causal", "seqlen", "batch", "heads",
                (std::string(ab->label) + "=0").c_str(), (std::string(ab->label) + "=1").c_str(),
                "new/old", ab->same_bits ? "same bits" : "max|diff|");
  else
    std::printf("\n%-6s %-7s %-6s %-6s %10s %10s %10s %10s %-5s %12s\n", "causal", "seqlen",
                "batch", "heads", "sm80", "sm90", "sm90/sm80", "auto", "took", "max|diff|");
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
      if (ab) {
        float best[2] = {0, 0};
        std::string err;
        setenv("FLASHSERVE_KERNEL", "sm90", 1);
        for (int round = 0; round < 4; ++round) {
          const int on = round % 2;
          setenv(ab->variable, on ? "1" : "0", 1);
          flashserve::AttentionParams p = params(on ? out90 : out80);
          best[on] = std::max(best[on],
                              tflops_of(p, flops, workspace, workspace_bytes, warmup, iters, err));
        }
        unsetenv(ab->variable);
        unsetenv("FLASHSERVE_KERNEL");
        const bool ran = best[0] > 0 && best[1] > 0;
        const size_t n = size_t(b) * s * h * d;
        const double max_diff = ran ? max_abs_diff(out80, out90, h80, h90, n, !fp16) : NAN;
        const bool same = ran && std::memcmp(h80.data(), h90.data(), n * 2) == 0;
        char last[32];
        if (ab->same_bits)
          std::snprintf(last, sizeof last, "%s", ran ? (same ? "yes" : "NO") : "-");
        else
          std::snprintf(last, sizeof last, "%.3g", max_diff);
        std::printf("%-6d %-7d %-6d %-6d %10.1f %10.1f %10.3f %10s%s%s\n", causal, s, b, h, best[0],
                    best[1], best[0] > 0 ? best[1] / best[0] : 0.0, last,
                    err.empty() ? "" : "  error: ", err.c_str());
        continue;
      }
      float tflops[3] = {0, 0, 0};
      std::string err, took;
      for (int which = 0; which < 3; ++which) {
        setenv("FLASHSERVE_KERNEL", which == 0 ? "sm80" : which == 1 ? "sm90" : "auto", 1);
        flashserve::AttentionParams p = params(which == 0 ? out80 : which == 1 ? out90 : out_auto);
        tflops[which] = tflops_of(p, flops, workspace, workspace_bytes, warmup, iters, err);
        if (tflops[which] > 0 && which == 2)
          took = flashserve::plan_attention(p).summary().rfind("sm90", 0) == 0 ? "sm90" : "sm80";
      }
      unsetenv("FLASHSERVE_KERNEL");
      const double max_diff =
          tflops[0] > 0 && tflops[1] > 0
              ? max_abs_diff(out80, out90, h80, h90, size_t(b) * s * h * d, !fp16)
              : NAN;
      std::printf("%-6d %-7d %-6d %-6d %10.1f %10.1f %10.2f %10.1f %-5s %12.3g%s%s\n", causal, s, b,
                  h, tflops[0], tflops[1], tflops[0] > 0 ? tflops[1] / tflops[0] : 0.0, tflops[2],
                  took.c_str(), max_diff, err.empty() ? "" : "  error: ", err.c_str());
    }
  for (uint16_t* p : {q, k, v, out80, out90, out_auto}) CUDA_OK(cudaFree(p));
  CUDA_OK(cudaFree(cu_seqlens));
  CUDA_OK(cudaFree(workspace));
  return 0;
}
