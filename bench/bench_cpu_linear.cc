// The CPU runner's GEMM, y = x W^T, at the shapes a model step has (a decode row, a chunk of a
// prompt; q/k/v, gate/up and down of Qwen2.5-0.5B and Llama-3-8B widths): our kernel
// (model/cpu_linear.h) with float32 and with bf16 weights, beside OpenBLAS's cblas_sgemm on the
// same float32 operands, all on one thread, in GFLOP/s per CPU-second (the median over 0.4 s of
// calls; on a machine shared with other jobs that still says what the code does).
//   bench_cpu_linear [--quick]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "common/half.h"
#include "cpu_timing.h"
#include "model/cpu_linear.h"
#if FLASHSERVE_WITH_BLAS
#include <cblas.h>
extern "C" char* openblas_get_corename(void);
#endif

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const double budget = quick ? 0.1 : 0.4;
#if FLASHSERVE_WITH_BLAS
  openblas_set_num_threads(1);
  std::printf("OpenBLAS core: %s\n", openblas_get_corename());
#endif
  std::printf("kernel: %s\n",
              flashserve::model::cpu::linear_nt_is_vectorised() ? "avx512" : "portable");
  struct Shape {
    const char* what;
    int64_t m, n, k;
  };
  const Shape shapes[] = {
      {"0.5B qkv decode", 1, 1152, 896},      {"0.5B gate_up decode", 1, 9728, 896},
      {"0.5B down decode", 1, 896, 4864},     {"0.5B qkv chunk", 128, 1152, 896},
      {"0.5B gate_up chunk", 128, 9728, 896}, {"0.5B down chunk", 128, 896, 4864},
      {"8B qkv decode", 1, 6144, 4096},       {"8B qkv chunk", 256, 6144, 4096},
      {"8B down chunk", 256, 4096, 14336},    {"decode batch 8", 8, 4096, 4096},
  };
  std::printf(
      "| shape | m | n | k | ours GFLOP/s | ours, bf16 W | OpenBLAS GFLOP/s | ours / OpenBLAS | "
      "bf16 W / OpenBLAS |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (const Shape& s : shapes) {
    if (quick && s.m * s.n * s.k > (int64_t{1} << 30)) continue;
    std::vector<float> x(s.m * s.k), w(s.n * s.k), y(s.m * s.n);
    std::vector<uint16_t> wb(w.size());
    for (float& v : x) v = normal(rng);
    for (size_t i = 0; i < w.size(); ++i) {
      wb[i] = flashserve::to_bf16(normal(rng)).bits;
      w[i] = flashserve::to_float(flashserve::bf16_t{wb[i]});
    }
    const double flops = 2.0 * s.m * s.n * s.k;
    double ours = 0, ours_bf16 = 0, blas = 0;
    median_seconds(
        [&] {
          flashserve::model::cpu::linear_nt(s.m, s.n, s.k, x.data(), s.k, w.data(), s.k, y.data(),
                                            s.n, false);
        },
        budget, 3, &ours, 1 << 20);
    median_seconds(
        [&] {
          flashserve::model::cpu::linear_nt(s.m, s.n, s.k, x.data(), s.k, wb.data(), s.k, y.data(),
                                            s.n, false);
        },
        budget, 3, &ours_bf16, 1 << 20);
#if FLASHSERVE_WITH_BLAS
    median_seconds(
        [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.m, s.n, s.k, 1.0f, x.data(), s.k,
                      w.data(), s.k, 0.0f, y.data(), s.n);
        },
        budget, 3, &blas, 1 << 20);
#endif
    std::printf("| %s | %lld | %lld | %lld | %.1f | %.1f | %.1f | %.2f | %.2f |\n", s.what,
                static_cast<long long>(s.m), static_cast<long long>(s.n),
                static_cast<long long>(s.k), flops / ours * 1e-9, flops / ours_bf16 * 1e-9,
                blas > 0 ? flops / blas * 1e-9 : 0, blas > 0 ? blas / ours : 0,
                blas > 0 ? blas / ours_bf16 : 0);
  }
}
