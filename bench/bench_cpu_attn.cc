// The CPU attention path's throughput: GFLOP/s of attention_forward on CPU tensors over a grid of
// dtypes, head dims, causal and not, sequence lengths, beside the block-product kernel's own
// single-thread peak (times the workers: the ceiling the path can approach) and, where built with
// OpenBLAS, a large cblas_sgemm on every thread (which core OpenBLAS chose is printed: Debian's
// 0.3.21 falls back to SSE3 "Prescott" kernels on CPUs newer than it knows).
//   bench_cpu_attn [--quick] [--seqlens 1024,2048] [--dims 64,128] [--dtypes f32,bf16,f16]
//                  [--heads 16] [--tokens 2048] [--isa portable] [--workers N] [--no-blas]
// dtypes: f32, f16, bf16 (on AMX tiles where available, the default), bf16c (bf16 blocks
// converted to float32: the path without AMX) and bf16p (products in bf16 pairs, AVX512-BF16).
// FLOPs = 4 * batch * heads * L^2 * d (half when causal), batch = max(1, tokens / L). Each figure
// is the median of the calls made in at least 0.3 s (at least 3), after one warm-up call.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#ifndef FLASHSERVE_BENCH_NO_KERNEL  // built against an older library for a "before" figure
#include "attention/reference/cpu_forward.h"
#include "attention/reference/cpu_gemm.h"
#endif
#include "common/half.h"
#include "common/thread_pool.h"
#include "cpu_timing.h"
#include "flashserve/attention.h"
#if FLASHSERVE_WITH_BLAS
#include <cblas.h>
extern "C" char* openblas_get_corename(void);
#endif

using namespace flashserve;

namespace {

std::vector<int64_t> ints(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return v;
}

#ifndef FLASHSERVE_BENCH_NO_KERNEL
double kernel_peak_gflops() {  // one thread, operands in L1/L2, the S^T = K Q^T shape
  const int64_t M = 256, N = 128, K = 128;
  std::vector<float> a(M * K, 0.5f), b(K * N, 0.25f), c(M * N);
  double cpu_s = 0;
  median_seconds(
      [&] {
        for (int r = 0; r < 20; ++r)
          attention::block_gemm(M, N, K, a.data(), K, 1, b.data(), N, c.data(), N, true);
      },
      0.2, 3, &cpu_s);
  return 20 * 2.0 * M * N * K / cpu_s / 1e9;  // per CPU-second: robust on a shared machine
}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> seqlens = {1024, 2048, 4096, 8192}, dims = {64, 128};
  std::vector<std::string> dtypes = {"f32", "bf16"};
  int64_t heads = 16, tokens = 2048;
  bool blas = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--quick")
      seqlens = {1024, 2048};
    else if (a == "--seqlens")
      seqlens = ints(next());
    else if (a == "--dims")
      dims = ints(next());
    else if (a == "--heads")
      heads = std::atoll(next());
    else if (a == "--tokens")
      tokens = std::atoll(next());
    else if (a == "--workers")
      ThreadPool::set_global_workers(std::atoi(next()));
    else if (a == "--no-blas")
      blas = false;
#ifndef FLASHSERVE_BENCH_NO_KERNEL
    else if (a == "--isa" && std::string(next()) == "portable")
      attention::force_cpu_isa(attention::CpuIsa::kPortable);
#endif
    else if (a == "--dtypes") {
      dtypes.clear();
      std::string s = next();
      for (size_t p = 0; p <= s.size();) {
        const size_t e = std::min(s.find(',', p), s.size());
        dtypes.push_back(s.substr(p, e - p));
        p = e + 1;
      }
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const int workers = ThreadPool::global().size();
#ifndef FLASHSERVE_BENCH_NO_KERNEL
  const double peak1 = kernel_peak_gflops();
  std::printf("workers %d, kernel %s: %.1f GFLOP/s on one thread (x%d = %.0f); AMX for bf16: %s\n",
              workers, attention::cpu_isa_name(attention::cpu_isa()), peak1, workers,
              peak1 * workers, attention::cpu_amx() ? "yes" : "no");
#endif
#if FLASHSERVE_WITH_BLAS
  if (blas) {
    const int n = 2048;
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
    const double s = median_seconds(
        [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n,
                      b.data(), n, 0.0f, c.data(), n);
        },
        0.5);
    std::printf("OpenBLAS (%s) sgemm %d^3, its own threads: %.0f GFLOP/s\n",
                openblas_get_corename(), n, 2.0 * n * n * n / s / 1e9);
  }
#endif
  // GFLOP/s: wall clock; per core: FLOPs per CPU-second of all threads (what each busy core does).
  std::printf("%-5s %4s %6s %6s %5s %6s %10s %9s %8s\n", "dtype", "d", "causal", "L", "batch",
              "heads", "GFLOP/s", "per_core", "ms");
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (const std::string& dt : dtypes) {
    // bf16p: bf16 with the block products in bf16 pairs (cpu_use_bf16_pairs), beside bf16.
#ifndef FLASHSERVE_BENCH_NO_KERNEL
    attention::cpu_use_bf16_pairs(dt == "bf16p");
    attention::cpu_use_amx(dt == "bf16");
#endif
    const DType dtype = dt == "bf16" || dt == "bf16p" || dt == "bf16c" ? DType::kBFloat16
                        : dt == "f16"                                  ? DType::kFloat16
                                                                       : DType::kFloat32;
    for (int64_t d : dims)
      for (int causal : {0, 1})
        for (int64_t L : seqlens) {
          const int64_t batch = std::max<int64_t>(1, tokens / L);
          const int64_t n = batch * L * heads * d;
          std::vector<std::byte> q(n * dtype_size(dtype)), k(q.size()), v(q.size()), o(q.size());
          for (auto* buf : {&q, &k, &v})
            for (int64_t i = 0; i < n; ++i) store_float(buf->data(), i, dtype, uni(rng));
          AttentionParams p;
          p.q = make_view(q.data(), dtype, {batch, L, heads, d});
          p.k = make_view(k.data(), dtype, {batch, L, heads, d});
          p.v = make_view(v.data(), dtype, {batch, L, heads, d});
          p.out = make_view(o.data(), dtype, {batch, L, heads, d});
          p.causal = causal != 0;
          double cpu_s = 0;
          const double s = median_seconds([&] { attention_forward(p); }, 0.3, 3, &cpu_s);
          const double flops = 4.0 * batch * heads * L * L * d * (causal ? 0.5 : 1.0);
          std::printf("%-5s %4lld %6d %6lld %5lld %6lld %10.1f %9.1f %8.2f\n", dt.c_str(),
                      static_cast<long long>(d), causal, static_cast<long long>(L),
                      static_cast<long long>(batch), static_cast<long long>(heads), flops / s / 1e9,
                      flops / cpu_s / 1e9, s * 1e3);
          std::fflush(stdout);
        }
  }
  return 0;
}
