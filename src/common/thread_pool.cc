#include "common/thread_pool.h"

#include <memory>

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

namespace flashserve {
namespace {
thread_local bool in_pool_task = false;
std::mutex global_mu;
pid_t global_pid = 0;    // the process the global pool's threads live in
int global_workers = 0;  // what set_global_workers asked for (0: hardware concurrency)

std::unique_ptr<ThreadPool>& global_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}

// A forked child has only the thread that called fork: the pool's workers are gone, and its
// mutexes may be held by threads that no longer exist, so the pool can neither run work (the
// caller would wait forever for the missing workers: issue 9, Python multiprocessing / DataLoader
// workers) nor be destroyed (joining threads that are not there). The child abandons it, leaked on
// purpose, and global() makes a new one. global_mu is held across fork so that the child never
// inherits it locked.
void abandon_pool_in_child() {
  (void)global_slot().release();
  global_pid = 0;
  global_mu.unlock();  // locked by this (the forking) thread in the prepare handler
}

void install_fork_handlers() {
  static const int installed =
      pthread_atfork([] { global_mu.lock(); }, [] { global_mu.unlock(); }, abandon_pool_in_child);
  (void)installed;
}
}  // namespace

// The CPUs this process may run on: a container pinned to 16 CPUs of a larger host sees all of
// them in hardware_concurrency(), and as many threads on 16 CPUs would oversubscribe them.
static int usable_cpus() {
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int workers) {
  if (workers <= 0) workers = usable_cpus();
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
  install_fork_handlers();
  std::lock_guard<std::mutex> lock(global_mu);
  auto& slot = global_slot();
  // The pid check also covers a child made without the atfork handlers (a raw clone()).
  if (slot && global_pid != getpid()) (void)slot.release();
  if (!slot) {
    slot = std::make_unique<ThreadPool>(global_workers);
    global_pid = getpid();
  }
  return *slot;
}

void ThreadPool::set_global_workers(int workers) {
  install_fork_handlers();
  std::lock_guard<std::mutex> lock(global_mu);
  auto& slot = global_slot();
  if (slot && global_pid != getpid()) (void)slot.release();  // not ours to join (see above)
  slot = std::make_unique<ThreadPool>(workers);
  global_pid = getpid();
  global_workers = workers;
}

}  // namespace flashserve
