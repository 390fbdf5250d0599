// Fork safety of the global thread pool (issue 9): a child made by fork() after the library has
// run a multi-threaded call must be able to run the next one. Before the fix the child waited
// forever for workers that exist only in the parent; here a child that does not finish within the
// timeout is killed and the test fails instead of hanging CI.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "flashserve/attention.h"

namespace flashserve {
namespace {

// Runs body() in a forked child; returns its exit status, or -1 if it ran past `timeout` (then
// it is killed).
int run_in_child(const std::function<int()>& body, std::chrono::seconds timeout) {
  const pid_t pid = fork();
  if (pid < 0) return -2;
  if (pid == 0) {
    alarm(static_cast<unsigned>(timeout.count()) + 5);  // a second line of defence
    _exit(body());
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int64_t pool_sum(int64_t n) {
  std::atomic<int64_t> sum{0};
  ThreadPool::global().parallel_for(n, [&](int64_t i, int) { sum += i; });
  return sum.load();
}

TEST(ForkSafety, ChildOfAPoolUserRunsParallelFor) {
  ThreadPool::set_global_workers(4);
  ASSERT_EQ(pool_sum(1000), 999 * 1000 / 2);  // the parent's workers are up and have worked
  const int status = run_in_child(
      [] {
        if (ThreadPool::global().size() != 4) return 3;  // the configured size survives
        for (int rep = 0; rep < 3; ++rep)
          if (pool_sum(1000) != 999 * 1000 / 2) return 2;
        return 0;
      },
      std::chrono::seconds(30));
  EXPECT_EQ(status, 0) << (status == -1 ? "the child hung" : "the child failed");
  EXPECT_EQ(pool_sum(1000), 999 * 1000 / 2);  // the parent's pool is untouched
  ThreadPool::set_global_workers(0);
}

// Forked while another thread of the parent is inside the pool: the child inherits the pool in
// the middle of a call (and possibly its mutexes locked) and must still get a working pool.
TEST(ForkSafety, ForkDuringAParallelForInAnotherThread) {
  ThreadPool::set_global_workers(3);
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop) pool_sum(5000);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  int failures = 0;
  for (int i = 0; i < 5; ++i) {
    const int status = run_in_child([] { return pool_sum(2000) == 1999 * 2000 / 2 ? 0 : 2; },
                                    std::chrono::seconds(30));
    failures += status != 0;
  }
  stop = true;
  busy.join();
  EXPECT_EQ(failures, 0);
  ThreadPool::set_global_workers(0);
}

// The reproduction through the attention API: a multi-tile CPU call, fork, the same call
// in the child gives bit for bit the parent's output.
TEST(ForkSafety, ChildRunsTheSameAttentionCall) {
  ThreadPool::set_global_workers(4);
  const int64_t n = 256, h = 4, d = 64;
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal;
  std::vector<float> q(n * h * d), k(n * h * d), v(n * h * d), out(n * h * d), again(n * h * d);
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = normal(rng);
  AttentionParams p;
  p.q = make_view(q.data(), DType::kFloat32, {1, n, h, d});
  p.k = make_view(k.data(), DType::kFloat32, {1, n, h, d});
  p.v = make_view(v.data(), DType::kFloat32, {1, n, h, d});
  p.out = make_view(out.data(), DType::kFloat32, {1, n, h, d});
  attention_forward(p);
  const int status = run_in_child(
      [&] {
        AttentionParams c = p;
        c.out = make_view(again.data(), DType::kFloat32, {1, n, h, d});
        std::fill(again.begin(), again.end(), NAN);
        attention_forward(c);
        return std::memcmp(again.data(), out.data(), out.size() * sizeof(float)) == 0 ? 0 : 2;
      },
      std::chrono::seconds(30));
  EXPECT_EQ(status, 0) << (status == -1 ? "the child hung" : "the child's output differs");
  ThreadPool::set_global_workers(0);
}

}  // namespace
}  // namespace flashserve
