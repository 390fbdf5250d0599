// A small fixed pool of worker threads for the CPU attention path. The threads are created once
// (the first time global() is called) and reused by every call, so a call pays a wake-up, not a
// thread start. Work is handed out dynamically from an atomic counter, which balances tasks of
// unequal cost (causal tiles near the diagonal are cheap, those at the bottom expensive).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flashserve {

class ThreadPool {
 public:
  // `workers` threads take part in each parallel_for, the calling thread being one of them (so
  // workers - 1 threads are started). workers <= 0: the CPUs this process may run on (its
  // affinity mask; std::thread::hardware_concurrency() where that is unknown).
  explicit ThreadPool(int workers = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(threads_.size()) + 1; }

  // Calls fn(task, worker) for every task in [0, num_tasks) and returns when all have finished;
  // worker is in [0, size()) and no two tasks of this call run at once on one worker, so it can
  // index per-worker state owned by the call. The first exception a task throws is rethrown here
  // (the remaining tasks still run). Called from inside a task, or while another thread's
  // parallel_for is running, it runs the tasks on the calling thread alone (no deadlock, no
  // oversubscription).
  void parallel_for(int64_t num_tasks, const std::function<void(int64_t task, int worker)>& fn);

  // The process-wide pool the CPU attention path uses. Fork-safe: in a child made by fork() the
  // parent's pool (whose threads the child does not have) is abandoned and a new one with the
  // same number of workers is started on first use.
  static ThreadPool& global();
  // Replaces the global pool by one with `workers` workers (0: hardware concurrency). Must not be
  // called while the global pool is running tasks.
  static void set_global_workers(int workers);

 private:
  void stop_and_join();
  void worker_loop(int worker);
  void run_tasks(int worker);

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::mutex busy_;  // held by the thread whose parallel_for owns the pool
  uint64_t generation_ = 0;
  bool stop_ = false;
  int active_ = 0;  // threads still working on the current generation
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
};

}  // namespace flashserve
