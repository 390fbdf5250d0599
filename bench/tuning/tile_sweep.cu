// tile_sweep: times alternative tile configurations of the sm80 forward kernel side by side on the
// benchmark grid, to choose tile_config.h's table by measurement (docs/kernel-notes.md). A tuning
// tool, built only with -DFLASHSERVE_TUNING=ON (scripts/gpu-check.sh --sweep).
//
// Dense bf16 inputs [batch, seqlen, heads, d], batch x seqlen = 16384, heads x d = 2048, causal or
// not; every variant's output is compared with the first variant of the same head dim and mask (a
// broken variant must not win). One row per (variant, seqlen): ms and TFLOP/s (causal counts half
// the FLOPs), median of 20 runs after a pause that lets the power state settle.
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

#include "attention/sm80/launch_template.h"

namespace fs = flashserve::attention::sm80;

namespace {

#define CUDA_OK(expr)                                                                    \
  do {                                                                                   \
    cudaError_t err_ = (expr);                                                           \
    if (err_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

__global__ void fill(__nv_bfloat16* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    x[i] = __float2bfloat16((h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

struct Problem {
  int d, seqlen, batch, heads;
  bool causal;
  __nv_bfloat16 *q, *k, *v, *out;
};

fs::FwdParams make_params(const Problem& pr) {
  fs::FwdParams p{};
  p.q = pr.q;
  p.k = pr.k;
  p.v = pr.v;
  p.out = pr.out;
  const int64_t row = int64_t{pr.heads} * pr.d, batch = row * pr.seqlen;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = batch;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = row;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = pr.d;
  p.seqlen_q = p.seqlen_k = pr.seqlen;
  p.h_q = pr.heads;
  p.h_ratio = 1;
  p.window_left = -1;
  p.window_right = pr.causal ? 0 : -1;  // causal: bottom-right, equal lengths
  p.scale = 1.0f / std::sqrt(float(pr.d));
  p.scale_log2 = p.scale * 1.4426950408889634f;
  p.num_splits = 1;
  p.q_rows = int64_t{pr.batch} * pr.seqlen;
  p.seq_end = pr.batch;  // every sequence (seq_begin 0, all kinds)
  return p;
}

using Launcher = void (*)(const fs::FwdParams&, const fs::FwdLaunch&);

// kHeaviestFirst = false: the masked grid's previous order (attention/kernel/tile_order.h), to
// measure it.
template <int kD, fs::Tiles kTiles, bool kMask, bool kHeaviestFirst = true>
void launch(const fs::FwdParams& p, const fs::FwdLaunch& l) {
  fs::FwdLaunch order = l;
  order.heaviest_first = kHeaviestFirst;
  fs::launch_config<fs::FwdConfig<kD, kTiles>, __nv_bfloat16, kMask, false>(p, order);
}

struct Variant {
  const char* name;
  int d;
  bool causal;
  Launcher run;
};

// Tiles: block_m, block_n, warps, stages, skip_unchanged_rescale, min_blocks_per_sm, pack_gqa,
// pipeline_frags, pv_pairs. The first variant of each (d, causal) is the reference. Add a line to
// try one.
constexpr fs::Tiles kD256P{64, 64, 4, 1, true, 2, false, true};
constexpr fs::Tiles kD256Pairs{64, 64, 4, 1, true, 2, false, true, true};
constexpr fs::Tiles kD128M{128, 64, 4, 1, true, 2};
constexpr fs::Tiles kD64{128, 128, 4, 1, false, 2};
const Variant kVariants[] = {
    {"d256 64x64 4w s1 skip pipe", 256, false, launch<256, kD256P, false>},
    {"d256 64x64 4w pipe pairs", 256, false, launch<256, kD256Pairs, false>},
    {"d256 per-head order", 256, true, launch<256, kD256P, true, false>},
    {"d256 64x64 4w s1 skip pipe", 256, true, launch<256, kD256P, true>},
    {"d256 pipe pairs", 256, true, launch<256, kD256Pairs, true>},
    {"d128 s1 skip per-head order", 128, true, launch<128, kD128M, true, false>},
    {"d128 128x64 4w s1 skip", 128, true, launch<128, kD128M, true>},
    {"d64 s1 per-head order", 64, true, launch<64, kD64, true, false>},
    {"d64 128x128 4w s1", 64, true, launch<64, kD64, true>},
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> seqlens{1024, 2048, 4096, 8192};
  if (argc > 1) {
    seqlens.clear();
    for (char* s = argv[1]; *s;) {
      seqlens.push_back(std::strtol(s, &s, 10));
      if (*s == ',') ++s;
    }
  }
  int smem = 0, smem_per_sm = 0, sms = 0, l2 = 0;
  CUDA_OK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  CUDA_OK(cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CUDA_OK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  constexpr int64_t kTokens = 16384, kHidden = 2048;
  const int64_t elems = kTokens * kHidden;
  __nv_bfloat16 *q, *k, *v, *out;
  for (auto** b : {&q, &k, &v, &out}) CUDA_OK(cudaMalloc(b, elems * 2));
  fill<<<1024, 256>>>(q, elems, 1);
  fill<<<1024, 256>>>(k, elems, 2);
  fill<<<1024, 256>>>(v, elems, 3);
  cudaEvent_t t0, t1;
  CUDA_OK(cudaEventCreate(&t0));
  CUDA_OK(cudaEventCreate(&t1));
  std::printf("%-30s %6s %7s %9s %9s %10s\n", "variant", "causal", "seqlen", "ms", "TFLOP/s",
              "max|diff|");
  std::vector<__nv_bfloat16> ref(elems), got(elems);
  for (int seqlen : seqlens) {
    const Variant* first = nullptr;
    for (const Variant& var : kVariants) {
      Problem pr{var.d, seqlen, int(kTokens / seqlen), int(kHidden / var.d), var.causal, q, k,
                 v,     out};
      const fs::FwdParams p = make_params(pr);
      fs::FwdLaunch l{};
      l.dtype = flashserve::DType::kBFloat16;
      l.batch = pr.batch;
      l.max_q_len = seqlen;
      l.max_kv_len = seqlen;
      l.smem_per_block = smem;
      l.smem_per_sm = smem_per_sm;
      l.sms = sms;
      l.l2_bytes = l2;
      CUDA_OK(cudaMemset(out, 0xff, elems * 2));  // NaN poison
      var.run(p, l);
      CUDA_OK(cudaDeviceSynchronize());
      CUDA_OK(cudaMemcpy(got.data(), out, elems * 2, cudaMemcpyDeviceToHost));
      if (first == nullptr || first->d != var.d || first->causal != var.causal) {
        first = &var;
        ref = got;
      }
      double diff = 0;
      for (int64_t i = 0; i < elems; ++i) {
        const double x = __bfloat162float(ref[i]), y = __bfloat162float(got[i]);
        if (std::isnan(y)) {
          diff = INFINITY;
          break;
        }
        diff = std::max(diff, std::abs(x - y));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the power state settle
      for (int i = 0; i < 3; ++i) var.run(p, l);
      std::vector<float> ms;
      for (int i = 0; i < 20; ++i) {
        CUDA_OK(cudaEventRecord(t0));
        var.run(p, l);
        CUDA_OK(cudaEventRecord(t1));
        CUDA_OK(cudaEventSynchronize(t1));
        float m = 0;
        CUDA_OK(cudaEventElapsedTime(&m, t0, t1));
        ms.push_back(m);
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      const double flops =
          4.0 * pr.batch * pr.heads * double(seqlen) * seqlen * pr.d * (var.causal ? 0.5 : 1.0);
      std::printf("%-30s %6d %7d %9.3f %9.1f %10.2e\n", var.name, var.causal, seqlen, med,
                  flops / med / 1e9, diff);
    }
  }
  return 0;
}
