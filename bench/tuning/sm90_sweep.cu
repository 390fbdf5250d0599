// sm90_sweep: alternative tiles of the sm90 forward kernel
// side by side on the FA3 benchmark grid, to choose tile_config.h's DefaultTile by measurement
// (docs/kernel-notes.md). A tuning tool, built only with -DFLASHSERVE_TUNING=ON.
//
// bf16 [batch, seqlen, heads, d], batch x seqlen = 16384, heads x d = 2048, causal and not. Each
// figure: 10 calls captured in one CUDA graph, the median of 7 replays (as bench/fa3_grid.py
// times flash_attn_func), after a 200 ms pause that lets the power state settle. Every variant's
// output is compared with the first (default) variant of its head dim and mask: a broken variant
// must not win. Usage: sm90_sweep [seqlens, default 512,1024,2048,4096,8192,16384] [head dims].
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "../bench_common.h"
#include "sm90_sweep.h"

namespace fb = flashserve::bench;
namespace sm90 = flashserve::attention::sm90;

namespace {

float to_float(uint16_t bits) {
  return __bfloat162float(__ushort_as_bfloat16(bits));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> seqlens{512, 1024, 2048, 4096, 8192, 16384};
  std::vector<int> dims{64, 128, 256};
  if (argc > 1) seqlens = parse_int_list(argv[1]);
  if (argc > 2) dims = parse_int_list(argv[2]);
  int sms = 0, l2 = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CUDA_OK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  constexpr int64_t kTokens = 16384, kHidden = 2048;
  const int64_t elems = kTokens * kHidden;
  uint16_t *q, *k, *v, *out;  // bf16 bits
  for (auto** b : {&q, &k, &v, &out}) CUDA_OK(cudaMalloc(b, elems * 2));
  float* lse = nullptr;
  CUDA_OK(cudaMalloc(&lse, kTokens * 64 * sizeof(float)));
  int* counter = nullptr;
  CUDA_OK(cudaMalloc(&counter, sizeof(int)));
  fill_random<<<1024, 256>>>(q, elems, 1);
  fill_random<<<1024, 256>>>(k, elems, 2);
  fill_random<<<1024, 256>>>(v, elems, 3);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t t0, t1;
  CUDA_OK(cudaEventCreate(&t0));
  CUDA_OK(cudaEventCreate(&t1));

  std::vector<fb::Sm90Variant> variants;
  for (int d : dims) {
    auto add = d == 64    ? fb::sm90_variants_d64()
               : d == 128 ? fb::sm90_variants_d128()
                          : fb::sm90_variants_d256();
    variants.insert(variants.end(), add.begin(), add.end());
  }
  std::printf("| variant | causal | L | TFLOP/s | vs default | max abs diff |\n");
  std::printf("|---|---|---|---|---|---|\n");
  std::vector<uint16_t> ref(elems), got(elems);
  for (int L : seqlens)
    for (int d : dims)
      for (bool causal : {false, true}) {
        double default_tflops = 0;
        bool first = true;
        for (const auto& var : variants) {
          if (var.head_dim != d || var.causal != causal) continue;
          const int heads = static_cast<int>(kHidden / d), batch = static_cast<int>(kTokens / L);
          const sm90::FwdArgs a = fb::grid_args(q, k, v, out, lse, counter, d, L, causal, kTokens,
                                                kHidden, sms, l2, stream);
          CUDA_OK(cudaMemsetAsync(out, 0xff, elems * 2, stream));
          var.run(a);
          CUDA_OK(cudaStreamSynchronize(stream));
          CUDA_OK(
              cudaMemcpy(first ? ref.data() : got.data(), out, elems * 2, cudaMemcpyDeviceToHost));
          double diff = 0;
          if (!first)
            for (int64_t i = 0; i < elems; ++i) {
              const double e = std::fabs(double(to_float(got[i])) - to_float(ref[i]));
              diff = std::isnan(e) ? INFINITY : std::max(diff, e);
            }
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          for (int i = 0; i < 10; ++i) var.run(a);
          CUDA_OK(cudaStreamEndCapture(stream, &graph));
          CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
          CUDA_OK(cudaGraphLaunch(exec, stream));  // warm-up
          CUDA_OK(cudaStreamSynchronize(stream));
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          std::vector<float> ms;
          for (int r = 0; r < 7; ++r) {
            CUDA_OK(cudaEventRecord(t0, stream));
            CUDA_OK(cudaGraphLaunch(exec, stream));
            CUDA_OK(cudaEventRecord(t1, stream));
            CUDA_OK(cudaEventSynchronize(t1));
            float x = 0;
            CUDA_OK(cudaEventElapsedTime(&x, t0, t1));
            ms.push_back(x / 10);
          }
          CUDA_OK(cudaGraphExecDestroy(exec));
          CUDA_OK(cudaGraphDestroy(graph));
          std::sort(ms.begin(), ms.end());
          const double flops = 4.0 * batch * heads * double(L) * L * d / (causal ? 2 : 1);
          const double tflops = flops / (ms[3] * 1e-3) / 1e12;
          if (first) default_tflops = tflops;
          std::printf("| %s | %s | %d | %.1f | %.3f | %.3g |\n", var.name, causal ? "yes" : "no", L,
                      tflops, tflops / default_tflops, diff);
          std::fflush(stdout);
          first = false;
        }
      }
  return 0;
}
