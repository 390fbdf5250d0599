// The in-process communicator group (model/local_communicator.h), ranks as threads: the all-reduce
// is the rank-order float32 sum with the same bits on every rank, the all-gather places every
// rank's block (its output poisoned first), hundreds of back-to-back collectives of changing sizes
// see no race, an aborted group releases its waiting ranks and recovers; and a row-parallel GEMM
// (K split over ranks, partial sums all-reduced) is within the bound of a reordered dot product
// of the whole GEMM.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "flashserve/error.h"
#include "model/cpu_ops.h"
#include "model/local_communicator.h"
#include "test_dirs.h"

namespace flashserve::model {
namespace {

// Runs fn(rank) on `size` threads at once and joins them.
template <typename Fn>
void on_ranks(int size, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

std::vector<float> random_floats(std::mt19937_64& rng, size_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(LocalCommunicator, AllReduceIsTheRankOrderSumOnEveryRankAndAllGatherPlacesEveryBlock) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int size : {1, 2, 3, 4}) {
    SCOPED_TRACE("size " + std::to_string(size));
    auto group = make_local_group(size);
    ASSERT_EQ(group->size(), size);
    // 300 collectives back to back, sizes changing (0 and 1 among them): a rank that ran ahead
    // and overwrote a buffer another still reads would show as a wrong sum.
    const int rounds = 150;
    std::vector<int64_t> counts(rounds);
    for (int i = 0; i < rounds; ++i) counts[i] = i % 7 == 0 ? i % 2 : 1 + int64_t(rng() % 300);
    std::vector<std::vector<std::vector<float>>> in(size);  // [rank][round]
    for (int r = 0; r < size; ++r)
      for (int i = 0; i < rounds; ++i) in[r].push_back(random_floats(rng, size_t(counts[i])));
    std::vector<std::vector<std::vector<float>>> reduced(size), gathered(size);
    on_ranks(size, [&](int r) {
      Communicator& comm = group->rank(r);
      for (int i = 0; i < rounds; ++i) {
        std::vector<float> data = in[r][i];
        comm.all_reduce_sum(data.data(), counts[i], DType::kFloat32);
        reduced[r].push_back(data);
        std::vector<float> all(size_t(size * counts[i]), std::numeric_limits<float>::quiet_NaN());
        comm.all_gather(in[r][i].data(), all.data(), counts[i], DType::kFloat32);
        gathered[r].push_back(all);
      }
    });
    for (int i = 0; i < rounds; ++i) {
      for (int64_t k = 0; k < counts[i]; ++k) {
        float want = in[0][i][k];  // the documented order: ((x0 + x1) + x2) + x3
        for (int r = 1; r < size; ++r) want += in[r][i][k];
        for (int r = 0; r < size; ++r) {
          ASSERT_EQ(reduced[r][i][k], want) << "round " << i << " element " << k << " rank " << r;
          for (int s = 0; s < size; ++s)
            ASSERT_EQ(gathered[r][i][s * counts[i] + k], in[s][i][k])
                << "round " << i << " rank " << r << "'s copy of rank " << s << "'s block";
        }
      }
    }
  }
}

TEST(LocalCommunicator, AbortReleasesWaitingRanksAndRecoverReadiesTheGroup) {
  auto group = make_local_group(3);
  // Ranks 0 and 1 enter an all-reduce that rank 2 never joins: the abort must end their wait.
  std::vector<int> errors(2, 0);
  std::thread waiting[2];
  for (int r = 0; r < 2; ++r)
    waiting[r] = std::thread([&, r] {
      float x = 1;
      try {
        group->rank(r).all_reduce_sum(&x, 1, DType::kFloat32);
      } catch (const Error& e) {
        errors[r] = e.kind() == ErrorKind::kInternal && e.argument() == "communicator";
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // not a bound: either order works
  group->abort();
  for (auto& t : waiting) t.join();
  EXPECT_EQ(errors, std::vector<int>({1, 1}));
  float x = 1;
  EXPECT_THROW(group->rank(2).all_reduce_sum(&x, 1, DType::kFloat32), Error);  // still aborted
  group->recover();
  std::vector<float> v(3);
  on_ranks(3, [&](int r) {
    float y = float(r + 1);
    group->rank(r).all_reduce_sum(&y, 1, DType::kFloat32);
    v[r] = y;
  });
  EXPECT_EQ(v, std::vector<float>({6, 6, 6}));
}

TEST(LocalCommunicator, WhatItCannotDoIsRefusedByName) {
  EXPECT_THROW(make_local_group(0), Error);
  auto group = make_local_group(1);
  uint16_t h = 0;
  try {
    group->rank(0).all_reduce_sum(&h, 1, DType::kBFloat16);
    FAIL() << "a bf16 all-reduce was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_EQ(e.argument(), "dtype");
  }
  EXPECT_THROW(group->rank(1), Error);
}

// y = x W^T + r with W's K columns split over N ranks (o_proj, down_proj): each rank's partial
// GEMM over its K / N columns, all-reduced, then added to r; against the whole GEMM accumulated
// into r. Both are orders of the same K + 1 float32 terms (K products and r), each within
// gamma_{K+1} (|r| + sum |x_k w_k|) of the exact value (gamma_n = n u / (1 - n u), u = 2^-24;
// Higham, "Accuracy and Stability of Numerical Algorithms", 3.1), so they differ by at most twice
// that: a bound, not a guess, and about 1000x what a wrong split (a column lost or doubled) gives.
TEST(RowParallelLinear, KSplitAllReduceIsWithinTheReorderedDotProductBound) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t m = 5, n = 37, K = 256;
  const std::vector<float> x = random_floats(rng, m * K), w = random_floats(rng, n * K);
  const std::vector<float> resid = random_floats(rng, m * n);
  std::vector<float> whole = resid;
  cpu::linear(x.data(), w.data(), whole.data(), m, n, K, true);
  const double u = std::ldexp(1.0, -24), gamma = (K + 1) * u / (1 - (K + 1) * u);
  for (int size : {2, 4}) {
    auto group = make_local_group(size);
    const int64_t k = K / size;
    std::vector<std::vector<float>> out(size);
    on_ranks(size, [&](int r) {
      // Rank r's columns of x and W, contiguous as the runner holds them.
      std::vector<float> xr(m * k), wr(n * k), part(m * n, std::numeric_limits<float>::quiet_NaN());
      for (int64_t i = 0; i < m; ++i) std::copy_n(x.data() + i * K + r * k, k, xr.data() + i * k);
      for (int64_t j = 0; j < n; ++j) std::copy_n(w.data() + j * K + r * k, k, wr.data() + j * k);
      cpu::linear(xr.data(), wr.data(), part.data(), m, n, k);
      group->rank(r).all_reduce_sum(part.data(), m * n, DType::kFloat32);
      for (int64_t i = 0; i < m * n; ++i) part[i] += resid[i];
      out[r] = part;
    });
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double abs_sum = std::fabs(resid[i * n + j]);
        for (int64_t t = 0; t < K; ++t) abs_sum += std::fabs(double(x[i * K + t]) * w[j * K + t]);
        const double bound = 2 * gamma * abs_sum;
        for (int r = 0; r < size; ++r)
          ASSERT_LE(std::fabs(double(out[r][i * n + j]) - whole[i * n + j]), bound)
              << "TP=" << size << " rank " << r << " (" << i << ", " << j << ")";
      }
  }
}

}  // namespace
}  // namespace flashserve::model
