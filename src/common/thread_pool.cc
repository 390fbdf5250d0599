#include "common/thread_pool.h"

#include <memory>

namespace flashserve {
namespace {
thread_local bool in_pool_task = false;
std::mutex global_mu;
std::unique_ptr<ThreadPool>& global_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
}  // namespace

ThreadPool::ThreadPool(int workers) {
  if (workers <= 0) workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads_.reserve(workers - 1);
  try {
    for (int w = 1; w < workers; ++w) threads_.emplace_back([this, w] { worker_loop(w); });
  } catch (...) {  // no thread left joinable, or its destructor would call std::terminate
    stop_and_join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  stop_and_join();
}

void ThreadPool::stop_and_join() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run_tasks(int worker) {
  in_pool_task = true;
  for (int64_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < num_tasks_;) {
    try {
      (*fn_)(i, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
  in_pool_task = false;
}

void ThreadPool::worker_loop(int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_tasks(worker);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t num_tasks, const std::function<void(int64_t, int)>& fn) {
  if (num_tasks <= 0) return;
  std::unique_lock<std::mutex> owner(busy_, std::defer_lock);
  if (in_pool_task || threads_.empty() || num_tasks == 1 || !owner.try_lock()) {
    // On this thread alone (worker 0 is free: the pool is not ours), with the same contract as the
    // pool: every task runs, then the first exception is rethrown.
    std::exception_ptr error;
    for (int64_t i = 0; i < num_tasks; ++i) {
      try {
        fn(i, 0);
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    num_tasks_ = num_tasks;
    next_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    active_ = static_cast<int>(threads_.size());
    ++generation_;
  }
  wake_.notify_all();
  run_tasks(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return active_ == 0; });
    fn_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

ThreadPool& ThreadPool::global() {
  std::lock_guard<std::mutex> lock(global_mu);
  auto& slot = global_slot();
  if (!slot) slot = std::make_unique<ThreadPool>();
  return *slot;
}

void ThreadPool::set_global_workers(int workers) {
  std::lock_guard<std::mutex> lock(global_mu);
  global_slot() = std::make_unique<ThreadPool>(workers);
}

}  // namespace flashserve
