// flashserve demo: why tiling matters. For growing sequence lengths it runs the float64 naive
// reference (which materialises the N x N scores S and probabilities P) and the tiled
// online-softmax CPU path on the same inputs, and prints time, measured peak extra heap memory and
// the largest difference between the two. The naive column grows as N^2; the tiled one stays flat.
//
// Memory is measured by replacing the global operator new/delete in this executable (see
// common/heap_tracker.h): the peak of live heap bytes during each call minus the bytes live before
// it, with the inputs and the tiled path's output allocated beforehand.
#define FLASHSERVE_DEFINE_HEAP_TRACKER
#include "common/heap_tracker.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "attention/reference/naive.h"
#include "cli/command.h"
#include "cli/options.h"
#include "common/thread_pool.h"
#include "flashserve/attention.h"

namespace flashserve::cli {
namespace {

struct Measured {
  double seconds = 0;
  int64_t peak_extra_bytes = 0;
};

template <typename F>
Measured measure(F&& call) {
  const int64_t before = heap::current_bytes();
  heap::reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  call();
  const auto t1 = std::chrono::steady_clock::now();
  return {std::chrono::duration<double>(t1 - t0).count(), heap::peak_bytes() - before};
}

std::string human_bytes(int64_t b) {
  char buf[32];
  if (b < 1024)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
  else if (b < (1 << 20))
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else if (b < (int64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  return buf;
}

std::string seconds(double s) {
  char buf[32];
  if (s < 1e-3)
    std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  else if (s < 1)
    std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

int run_demo(int argc, char** argv) {
  CLI::App app{"Naive (materialises S and P) vs tiled online-softmax attention on the CPU"};
  int64_t max_n = 16384, naive_max_n = 4096, heads = 2, head_dim = 64;
  int32_t threads = 0;
  bool causal = false;
  uint64_t seed = 1;
  add_int(app, "--max-n", max_n, {256, int64_t{1} << 20},
          "largest sequence length for the tiled path");
  auto* naive_opt = add_int(app, "--naive-max-n", naive_max_n, {0, int64_t{1} << 16},
                            "largest sequence length for the naive reference");
  add_int(app, "--heads", heads, {1, 64}, "attention heads (batch is 1)");
  add_int(app, "--head-dim", head_dim, {1, 512}, "head dimension");
  add_int(app, "--threads", threads, {0, 1024}, "worker threads of the tiled path (0: all cores)");
  app.add_flag("--causal", causal, "causal mask");
  add_uint(app, "--seed", seed, "seed of the random inputs");
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  refuse_unless(
      naive_opt, naive_max_n <= max_n,
      "the naive path runs the tiled path's lengths, up to --max-n " + std::to_string(max_n));
  // q, k, v, out at the largest N (the ranges keep this product inside int64): refused up front
  // when it exceeds the machine's memory, instead of an overcommitted allocation that the kernel
  // kills later.
  const int64_t input_bytes = 4 * max_n * heads * head_dim * int64_t{sizeof(float)};
  const double phys = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  if (phys > 0 && static_cast<double>(input_bytes) > 0.5 * phys)
    throw UsageError("--max-n", human_bytes(input_bytes) +
                                    " of inputs at N = " + std::to_string(max_n) +
                                    " is more than half of this machine's " +
                                    human_bytes(static_cast<int64_t>(phys)) + " of memory");
  ThreadPool::set_global_workers(threads);
  const int workers = ThreadPool::global().size();

  std::printf(
      "flashserve demo: batch 1, %lld heads, head_dim %lld, float32, %s, %d worker thread%s\n",
      static_cast<long long>(heads), static_cast<long long>(head_dim),
      causal ? "causal" : "no mask", workers, workers == 1 ? "" : "s");
  std::printf(
      "memory = peak live heap bytes allocated during the call (global operator new, all "
      "threads),\n"
      "         inputs q/k/v and the tiled output preallocated; the naive column includes its\n"
      "         float64 result vectors. max|diff| = largest |tiled - naive float64| output "
      "element.\n\n");
  std::printf("%7s | %10s %12s | %10s %12s | %10s\n", "N", "naive", "naive mem", "tiled",
              "tiled mem", "max|diff|");
  std::printf("--------+-------------------------+-------------------------+-----------\n");

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n = 256; n <= max_n; n *= 2) {
    const int64_t elems = n * heads * head_dim;
    std::vector<float> q(elems), k(elems), v(elems), out(elems), lse(heads * n);
    for (auto* t : {&q, &k, &v})
      for (float& x : *t) x = normal(rng);
    std::fill(out.begin(), out.end(), NAN);
    AttentionParams p;
    p.q = make_view(q.data(), DType::kFloat32, {1, n, heads, head_dim});
    p.k = make_view(k.data(), DType::kFloat32, {1, n, heads, head_dim});
    p.v = make_view(v.data(), DType::kFloat32, {1, n, heads, head_dim});
    p.out = make_view(out.data(), DType::kFloat32, {1, n, heads, head_dim});
    p.lse = make_view(lse.data(), DType::kFloat32, {1, heads, n});
    p.causal = causal;

    const Measured tiled = measure([&] { attention_forward(p); });
    std::string naive_t = "-", naive_m = "-", diff = "-";
    if (n <= naive_max_n) {
      attention::reference::NaiveOutput ref;
      const Measured naive = measure([&] { ref = attention::reference::naive_forward(p); });
      double worst = 0;
      for (int64_t i = 0; i < elems; ++i) {
        const double d = std::abs(static_cast<double>(out[i]) - ref.out[i]);
        worst = std::isnan(d) ? INFINITY : std::max(worst, d);
      }
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2e", worst);
      naive_t = seconds(naive.seconds);
      naive_m = human_bytes(naive.peak_extra_bytes);
      diff = buf;
    }
    std::printf("%7lld | %10s %12s | %10s %12s | %10s\n", static_cast<long long>(n),
                naive_t.c_str(), naive_m.c_str(), seconds(tiled.seconds).c_str(),
                human_bytes(tiled.peak_extra_bytes).c_str(), diff.c_str());
    std::fflush(stdout);
  }
  return 0;
}

Register reg("demo", "naive vs tiled CPU attention: time, measured peak memory, max difference",
             run_demo);

}  // namespace
}  // namespace flashserve::cli
