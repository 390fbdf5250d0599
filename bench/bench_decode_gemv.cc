// bench_decode_gemv: the decode step's four weight products at small batch, chained through 32
// layers as the model runs them (qkv -> o -> gate/up -> silu -> down, each reading the one
// before's output, every layer its own weights so nothing stays in L2), captured in one CUDA
// graph and replayed: ms per chain against the weight-read floor (the weights' bytes at the
// device-to-device copy rate, read + written, measured in the same run). Variants: cuBLASLt and
// model/cuda/gemv.h's kernel, with and without programmatic dependent launch.
//
//   bench_decode_gemv [--shape mistral-7b] [--rows 1,2,4] [--reps 20]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cli_args.h"
#include "model/cuda/gemm.h"
#include "model/cuda/gemv.h"
#include "model/cuda/silu_mul.h"
#include "model/presets.h"

namespace mc = flashserve::model::cuda;
using bf16 = __nv_bfloat16;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Bytes read + written per second by a device-to-device copy of 4 GB (median of 5).
double copy_bandwidth() {
  const size_t bytes = size_t{4} << 30;
  void *a, *b;
  check(cudaMalloc(&a, bytes), "malloc");
  check(cudaMalloc(&b, bytes), "malloc");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 7; ++i) {
    cudaEventRecord(e0);
    check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice), "copy");
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (ms[ms.size() / 2] * 1e-3);
}

struct Layer {
  bf16 *qkv, *o, *gate_up, *down;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string shape = arg(argc, argv, "--shape", "mistral-7b");
  const int reps = std::atoi(arg(argc, argv, "--reps", "20").c_str());
  std::vector<int64_t> row_counts;
  for (std::string list = arg(argc, argv, "--rows", "1,2,4"); !list.empty();) {
    const size_t comma = std::min(list.find(','), list.size());
    row_counts.push_back(std::atoll(list.substr(0, comma).c_str()));
    list.erase(0, std::min(comma + 1, list.size()));
  }
  const auto cfg = flashserve::model::preset_config(shape);
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, L = cfg.num_hidden_layers;
  const int64_t QKV = cfg.q_size() + 2 * cfg.kv_size(), Q = cfg.q_size();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device");
  const char* commit = std::getenv("COMMIT");
  std::printf("# bench_decode_gemv: %s, %lld layers, %s, commit %s\n", shape.c_str(),
              static_cast<long long>(L), prop.name, commit ? commit : "unknown");
  const double bw = copy_bandwidth();

  // Every layer's weights, filled from one random host block of small values.
  const int64_t per_layer = QKV * H + H * Q + 2 * I * H + H * I;
  bf16* all = nullptr;
  check(cudaMalloc(&all, per_layer * L * sizeof(bf16)), "weights");
  {
    std::vector<bf16> block(size_t{1} << 24);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.0f / 64, 1.0f / 64);
    for (auto& v : block) v = __float2bfloat16(u(rng));
    for (int64_t at = 0; at < per_layer * L; at += block.size()) {
      const int64_t n = std::min<int64_t>(block.size(), per_layer * L - at);
      check(cudaMemcpy(all + at, block.data(), n * sizeof(bf16), cudaMemcpyHostToDevice), "fill");
    }
  }
  std::vector<Layer> layers(L);
  for (int64_t l = 0; l < L; ++l) {
    bf16* p = all + l * per_layer;
    layers[l] = {p, p + QKV * H, p + QKV * H + H * Q, p + QKV * H + H * Q + 2 * I * H};
  }
  const double floor_ms = static_cast<double>(per_layer) * L * sizeof(bf16) / bw * 1e3;
  std::printf("copy bandwidth %.2f TB/s (read + written); weights %.2f GB; floor %.3f ms\n\n",
              bw / 1e12, per_layer * L * 2 / 1e9, floor_ms);

  const int64_t max_m = *std::max_element(row_counts.begin(), row_counts.end());
  bf16 *h, *qkv, *delta, *gu, *act;
  check(cudaMalloc(&h, max_m * H * sizeof(bf16)), "h");
  check(cudaMalloc(&qkv, max_m * std::max(QKV, H) * sizeof(bf16)), "qkv");
  check(cudaMalloc(&delta, max_m * H * sizeof(bf16)), "delta");
  check(cudaMalloc(&gu, max_m * 2 * I * sizeof(bf16)), "gu");
  check(cudaMalloc(&act, max_m * I * sizeof(bf16)), "act");
  cudaMemset(h, 0x3c, max_m * H * sizeof(bf16));  // ~0.01 each
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  mc::Gemm gemm;

  struct Variant {
    const char* name;
    bool cublas, pdl;
  };
  std::vector<Variant> variants = {{"cuBLASLt", true, false}, {"GEMV", false, false}};
  if (prop.major >= 9) variants.push_back({"GEMV, PDL", false, true});

  std::printf("| rows | variant | ms per chain | floor ms | ratio | weight TB/s |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const int64_t m : row_counts) {
    for (const Variant& v : variants) {
      auto product = [&](const bf16* x, const bf16* w, bf16* y, int64_t n, int64_t k) {
        if (v.cublas)
          gemm.run(x, w, y, false, m, n, k, stream);
        else
          mc::gemv(x, w, nullptr, y, false, m, n, k, stream, v.pdl);
      };
      auto chain = [&] {
        for (const Layer& l : layers) {
          product(h, l.qkv, qkv, QKV, H);
          product(qkv, l.o, delta, H, Q);
          product(delta, l.gate_up, gu, 2 * I, H);
          mc::silu_mul(gu, act, m, I, stream);
          product(act, l.down, h, H, I);
        }
      };
      chain();  // cuBLASLt picks its algorithms outside the capture
      check(cudaStreamSynchronize(stream), "warm-up");
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
      chain();
      check(cudaStreamEndCapture(stream, &graph), "end capture");
      check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      std::vector<float> ms;
      for (int i = 0; i < reps + 3; ++i) {
        cudaEventRecord(e0, stream);
        check(cudaGraphLaunch(exec, stream), "replay");
        cudaEventRecord(e1, stream);
        check(cudaEventSynchronize(e1), "sync");
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (i >= 3) ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      std::printf("| %lld | %s | %.3f | %.3f | %.2f | %.2f |\n", static_cast<long long>(m), v.name,
                  med, floor_ms, med / floor_ms,
                  static_cast<double>(per_layer) * L * 2 / (med * 1e-3) / 1e12);
      std::fflush(stdout);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
    }
  }
  return 0;
}
