#include "model/cuda/staged_communicator.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "common/half.h"
#include "model/cuda/check.h"
#include "model/local_communicator.h"

namespace flashserve::model::cuda {

namespace {

class StagedCommunicator final : public Communicator {
 public:
  explicit StagedCommunicator(Communicator& host) : host_(host) {}
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

  void all_reduce_sum(void* data, int64_t count, DType dtype) override {
    const size_t n = static_cast<size_t>(count), elem = dtype_size(dtype);
    if (dtype != DType::kFloat32 && dtype != DType::kBFloat16 && dtype != DType::kFloat16)
      throw Error(
          ErrorKind::kUnsupported, "dtype",
          std::string(dtype_name(dtype)) + ": the staged all-reduce takes float32, bf16, fp16");
    raw_.resize(n * elem);
    sum_.resize(n);
    to_host(raw_.data(), data, n * elem);
    for (size_t i = 0; i < n; ++i)
      sum_[i] = load_float(raw_.data(), static_cast<int64_t>(i), dtype);
    host_.all_reduce_sum(sum_.data(), count, DType::kFloat32);
    for (size_t i = 0; i < n; ++i)
      store_float(raw_.data(), static_cast<int64_t>(i), dtype, sum_[i]);
    to_device(data, raw_.data(), n * elem);
  }

  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    raw_.resize(bytes);
    gathered_.resize(bytes * static_cast<size_t>(size()));
    to_host(raw_.data(), send, bytes);
    host_.all_gather(raw_.data(), gathered_.data(), count, dtype);
    to_device(recv, gathered_.data(), gathered_.size());
  }

 private:
  void to_host(void* dst, const void* src, size_t bytes) {
    if (bytes > 0)
      check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "staged copy");
    check_cuda(cudaStreamSynchronize(stream_), "staged copy");
  }
  void to_device(void* dst, const void* src, size_t bytes) {
    if (bytes > 0)
      check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "staged copy");
    check_cuda(cudaStreamSynchronize(stream_), "staged copy");  // the host buffer is reused
  }

  Communicator& host_;
  cudaStream_t stream_ = nullptr;
  std::vector<std::byte> raw_, gathered_;
  std::vector<float> sum_;
};

class StagedGroup final : public CommunicatorGroup {
 public:
  explicit StagedGroup(int size) : host_(make_local_group(size)) {
    for (int r = 0; r < size; ++r)
      ranks_.push_back(std::make_unique<StagedCommunicator>(host_->rank(r)));
  }
  int size() const override { return host_->size(); }
  void abort() override { host_->abort(); }
  void recover() override { host_->recover(); }

 private:
  Communicator& at(int r) override { return *ranks_[static_cast<size_t>(r)]; }
  std::unique_ptr<CommunicatorGroup> host_;  // declared first: destroyed after the ranks
  std::vector<std::unique_ptr<StagedCommunicator>> ranks_;
};

}  // namespace

std::unique_ptr<CommunicatorGroup> make_staged_group(int size) {
  return std::make_unique<StagedGroup>(size);  // make_local_group refuses a size below one
}

}  // namespace flashserve::model::cuda
