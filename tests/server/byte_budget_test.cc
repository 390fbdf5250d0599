// ByteBudget: holds add up to the capacity, a request that does not fit waits until enough is
// released, waiters are served in arrival order (a small one does not pass a large one), a
// request above the capacity waits to run alone, and a hold gives its bytes back however it ends.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "flashserve/error.h"
#include "server/byte_budget.h"

namespace flashserve::server {
namespace {

using namespace std::chrono_literals;

// Waits (up to 5 s) for `cond`; false if it never held.
template <typename F>
bool eventually(F cond) {
  for (int i = 0; i < 5000 && !cond(); ++i) std::this_thread::sleep_for(1ms);
  return cond();
}

TEST(ByteBudget, HoldsAddUpAndAreGivenBack) {
  ByteBudget b(100);
  {
    const ByteBudget::Hold x = b.acquire(60);
    const ByteBudget::Hold y = b.acquire(40);
    EXPECT_EQ(b.in_use(), 100u);
  }
  EXPECT_EQ(b.in_use(), 0u);
  {
    const ByteBudget::Hold big = b.acquire(1000);  // above the capacity: all of it
    EXPECT_EQ(b.in_use(), 100u);
  }
  EXPECT_EQ(b.in_use(), 0u);
  try {
    const ByteBudget::Hold h = b.acquire(30);
    throw Error(ErrorKind::kInvalidArgument, "x", "thrown while holding");
  } catch (const Error&) {
  }
  EXPECT_EQ(b.in_use(), 0u);
  EXPECT_THROW(ByteBudget(0), Error);
}

TEST(ByteBudget, WhatDoesNotFitWaitsInArrivalOrder) {
  ByteBudget b(100);
  std::optional<ByteBudget::Hold> first(b.acquire(70));
  std::atomic<int> step{0};
  std::vector<int> order;
  std::mutex mu;
  auto waiter = [&](size_t bytes, int name) {
    return std::thread([&, bytes, name] {
      const ByteBudget::Hold h = b.acquire(bytes);
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(name);
      }
      while (step.load() < name) std::this_thread::sleep_for(1ms);  // hold until told
    });
  };
  std::thread large = waiter(50, 1);  // does not fit beside 70
  ASSERT_TRUE(eventually([&] { return b.waiting() == 1u; }));
  std::thread small = waiter(10, 2);  // would fit, but arrived after the large one
  ASSERT_TRUE(eventually([&] { return b.waiting() == 2u; }));
  std::this_thread::sleep_for(50ms);  // time to run past the budget, if it could
  {
    std::lock_guard<std::mutex> lock(mu);
    // The small one would fit beside the 70 held: it waits only because it came second.
    EXPECT_TRUE(order.empty()) << "a waiter ran past the budget or out of turn";
  }
  first.reset();  // 70 back: the large one goes, then the small one fits beside it
  ASSERT_TRUE(eventually([&] { return b.in_use() == 60u; }));
  EXPECT_EQ(b.waiting(), 0u);
  step = 2;
  large.join();
  small.join();
  EXPECT_EQ(b.in_use(), 0u);
}

// Many threads at once never hold more than the capacity, and all finish.
TEST(ByteBudget, ManyThreadsStayWithinTheCapacity) {
  ByteBudget b(1000);
  std::atomic<size_t> held{0}, peak{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const size_t n = static_cast<size_t>((t * 37 + i * 101) % 1200);  // some above capacity
        const ByteBudget::Hold h = b.acquire(n);
        const size_t now = held += std::min<size_t>(n, 1000);
        size_t p = peak.load();
        while (now > p && !peak.compare_exchange_weak(p, now)) {
        }
        held -= std::min<size_t>(n, 1000);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_LE(peak.load(), 1000u);
  EXPECT_EQ(b.in_use(), 0u);
}

}  // namespace
}  // namespace flashserve::server
