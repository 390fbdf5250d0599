#include "server/byte_budget.h"

#include <algorithm>

#include "flashserve/error.h"

namespace flashserve::server {

ByteBudget::ByteBudget(size_t capacity) : capacity_(capacity) {
  if (capacity == 0) throw Error(ErrorKind::kInvalidArgument, "capacity", "must be positive");
}

ByteBudget::Hold::~Hold() {
  if (budget_) budget_->release(bytes_);
}

ByteBudget::Hold ByteBudget::acquire(size_t bytes) {
  const size_t n = std::min(bytes, capacity_);
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t ticket = next_ticket_++;
  cv_.wait(lock, [&] { return ticket == serving_ && used_ + n <= capacity_; });
  used_ += n;
  ++serving_;
  lock.unlock();
  cv_.notify_all();  // the next ticket may fit too
  return Hold(this, n);
}

size_t ByteBudget::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

size_t ByteBudget::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<size_t>(next_ticket_ - serving_);
}

void ByteBudget::release(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= bytes;
  }
  cv_.notify_all();
}

}  // namespace flashserve::server
