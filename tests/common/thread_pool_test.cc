#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace flashserve {
namespace {

TEST(ThreadPool, RunsEveryTaskExactlyOnce) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.size(), 4);
  for (int64_t n : {0, 1, 3, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    std::atomic<int> bad_worker{0};
    pool.parallel_for(n, [&](int64_t i, int w) {
      hits[i]++;
      if (w < 0 || w >= pool.size()) bad_worker++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "task " << i << " of " << n;
    EXPECT_EQ(bad_worker.load(), 0);
  }
}

TEST(ThreadPool, WorkerIndexIsNotSharedByConcurrentTasks) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> busy(pool.size());
  std::atomic<int> clash{0};
  pool.parallel_for(3000, [&](int64_t, int w) {
    if (busy[w].fetch_add(1) != 0) clash++;
    volatile int spin = 0;
    for (int i = 0; i < 200; ++i) spin = spin + i;
    busy[w].fetch_sub(1);
  });
  EXPECT_EQ(clash.load(), 0);
}

TEST(ThreadPool, RethrowsTheFirstExceptionAndStaysUsable) {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.parallel_for(100,
                                 [&](int64_t i, int) {
                                   ran++;
                                   if (i == 37) throw std::runtime_error("task 37");
                                 }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 100);  // the other tasks still ran
  std::atomic<int64_t> sum{0};
  pool.parallel_for(10, [&](int64_t i, int) { sum += i; });
  EXPECT_EQ(sum.load(), 45);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.parallel_for(8, [&](int64_t, int) { pool.parallel_for(5, [&](int64_t, int) { inner++; }); });
  EXPECT_EQ(inner.load(), 40);
}

// The calls that run on the calling thread alone (one worker, one task, nested) keep the contract
// of the pooled ones: every task runs and the first exception comes out at the end.
TEST(ThreadPool, InlineCallsRunEveryTaskThenRethrowTheFirst) {
  auto throwing = [](std::atomic<int>& ran) {
    return [&ran](int64_t i, int) {
      ran++;
      if (i == 2) throw std::runtime_error("task 2");
      if (i == 3) throw std::logic_error("task 3");
    };
  };
  ThreadPool single(1);
  std::atomic<int> ran{0};
  EXPECT_THROW(single.parallel_for(6, throwing(ran)), std::runtime_error);
  EXPECT_EQ(ran.load(), 6);

  ThreadPool pool(2);
  std::atomic<int> inner{0}, caught{0};
  pool.parallel_for(4, [&](int64_t, int) {
    std::atomic<int> here{0};
    try {
      pool.parallel_for(5, throwing(here));
    } catch (const std::runtime_error&) {
      caught++;
    }
    inner += here.load();
  });
  EXPECT_EQ(caught.load(), 4);
  EXPECT_EQ(inner.load(), 20);
}

// Two threads calling parallel_for on one pool at once: one gets the pool, the other runs its tasks
// alone; each call runs each of its tasks once, and per call no worker index is used by two tasks
// at the same time.
TEST(ThreadPool, ConcurrentCallersEachRunAllTheirTasks) {
  ThreadPool pool(3);
  auto caller = [&pool](std::vector<std::atomic<int>>& hits, std::atomic<int>& clash) {
    for (int round = 0; round < 20; ++round) {
      std::vector<std::atomic<int>> busy(pool.size());
      pool.parallel_for(static_cast<int64_t>(hits.size()), [&](int64_t i, int w) {
        if (busy[w].fetch_add(1) != 0) clash++;
        hits[i]++;
        volatile int spin = 0;
        for (int k = 0; k < 100; ++k) spin = spin + k;
        busy[w].fetch_sub(1);
      });
    }
  };
  std::vector<std::atomic<int>> hits_a(500), hits_b(700);
  std::atomic<int> clash{0};
  std::thread a(caller, std::ref(hits_a), std::ref(clash));
  std::thread b(caller, std::ref(hits_b), std::ref(clash));
  a.join();
  b.join();
  for (auto& h : hits_a) ASSERT_EQ(h.load(), 20);
  for (auto& h : hits_b) ASSERT_EQ(h.load(), 20);
  EXPECT_EQ(clash.load(), 0);
}

TEST(ThreadPool, GlobalPoolCanBeResized) {
  ThreadPool::set_global_workers(3);
  EXPECT_EQ(ThreadPool::global().size(), 3);
  ThreadPool::set_global_workers(0);
  EXPECT_GE(ThreadPool::global().size(), 1);
}

}  // namespace
}  // namespace flashserve
