// A bound on the bytes of prompt text being tokenized at once. Tokenizing takes memory in
// proportion to its text (the normalized copy, and a word's BPE symbols: about 25 bytes per byte
// of one long word), and each of hundreds of connection threads may hold an 8 MiB body: without a
// bound, a few hundred long prompts at once take tens of GB. Past the budget, requests wait their
// turn in arrival order; tokenizing is CPU work, so running more at once than there are cores
// would not finish them sooner.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace flashserve::server {

class ByteBudget {
 public:
  explicit ByteBudget(size_t capacity);

  // Bytes held until destroyed.
  class Hold {
   public:
    Hold(Hold&& o) noexcept : budget_(o.budget_), bytes_(o.bytes_) { o.budget_ = nullptr; }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    Hold& operator=(Hold&&) = delete;
    ~Hold();

   private:
    friend class ByteBudget;
    Hold(ByteBudget* b, size_t n) : budget_(b), bytes_(n) {}
    ByteBudget* budget_;
    size_t bytes_;
  };

  // Waits until every earlier caller has its bytes and `bytes` fit beside what is held, then
  // holds them. More than the capacity holds all of it (such a text waits until it runs alone).
  Hold acquire(size_t bytes);
  size_t capacity() const { return capacity_; }
  size_t in_use() const;
  size_t waiting() const;  // callers of acquire() not yet holding

 private:
  void release(size_t bytes);

  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t used_ = 0;
  uint64_t next_ticket_ = 0;  // arrival order
  uint64_t serving_ = 0;      // the ticket whose turn it is
};

}  // namespace flashserve::server
