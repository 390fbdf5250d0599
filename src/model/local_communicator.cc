#include "model/local_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "flashserve/error.h"

namespace flashserve::model {

namespace {

class LocalGroup;

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(LocalGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override;
  void all_reduce_sum(void* data, int64_t count, DType dtype) override;
  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override;

 private:
  LocalGroup& group_;
  int rank_;
  std::vector<float> sum_;  // the reduction, before it replaces this rank's data
};

class LocalGroup final : public CommunicatorGroup {
 public:
  explicit LocalGroup(int size) : posted_(static_cast<size_t>(size)) {
    for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<LocalCommunicator>(*this, r));
  }
  int size() const override { return static_cast<int>(ranks_.size()); }
  void abort() override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }
  void recover() override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = false;
    arrived_ = 0;
  }

  Communicator& at(int r) override { return *ranks_[static_cast<size_t>(r)]; }

  // Posts rank's buffer, then waits until every rank has posted its own.
  void post_and_wait(int rank, const void* buffer) {
    posted_[static_cast<size_t>(rank)] = buffer;
    wait();
  }
  const void* posted(int rank) const { return posted_[static_cast<size_t>(rank)]; }
  // A barrier of all ranks; Error(kInternal) once aborted.
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    check_live();
    const uint64_t gen = generation_;
    if (++arrived_ == size()) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    if (generation_ == gen) check_live();
  }

 private:
  void check_live() const {
    if (aborted_)
      throw Error(ErrorKind::kInternal, "communicator",
                  "the group was aborted: another rank failed in this step");
  }

  std::vector<std::unique_ptr<LocalCommunicator>> ranks_;
  // posted_[r] is written by rank r before a barrier and read by all after it; the barriers'
  // mutex orders those accesses.
  std::vector<const void*> posted_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
};

int LocalCommunicator::size() const {
  return group_.size();
}

void LocalCommunicator::all_reduce_sum(void* data, int64_t count, DType dtype) {
  if (dtype != DType::kFloat32)
    throw Error(ErrorKind::kUnsupported, "dtype",
                std::string(dtype_name(dtype)) + ": the in-process all-reduce sums float32 only");
  if (count < 0) throw Error(ErrorKind::kInvalidArgument, "count", "must be >= 0");
  group_.post_and_wait(rank_, data);
  sum_.resize(static_cast<size_t>(count));
  const auto* first = static_cast<const float*>(group_.posted(0));
  std::copy_n(first, count, sum_.data());
  for (int r = 1; r < size(); ++r) {
    const auto* x = static_cast<const float*>(group_.posted(r));
    for (int64_t i = 0; i < count; ++i) sum_[static_cast<size_t>(i)] += x[i];
  }
  group_.wait();  // every rank has read every buffer: each may now overwrite its own
  std::copy_n(sum_.data(), count, static_cast<float*>(data));
}

void LocalCommunicator::all_gather(const void* send, void* recv, int64_t count, DType dtype) {
  if (count < 0) throw Error(ErrorKind::kInvalidArgument, "count", "must be >= 0");
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  group_.post_and_wait(rank_, send);
  for (int r = 0; r < size(); ++r)
    if (bytes > 0)
      std::memcpy(static_cast<std::byte*>(recv) + static_cast<size_t>(r) * bytes, group_.posted(r),
                  bytes);
  group_.wait();  // no rank changes its send buffer while another still reads it
}

}  // namespace

std::unique_ptr<CommunicatorGroup> make_local_group(int size) {
  if (size < 1)
    throw Error(ErrorKind::kInvalidArgument, "size",
                std::to_string(size) + ": a group has at least one rank");
  return std::make_unique<LocalGroup>(size);
}

}  // namespace flashserve::model
