#include "model/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>

#include "flashserve/error.h"

namespace flashserve::model {

namespace {

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw Error(ErrorKind::kCuda, "nccl", std::string(what) + ": " + ncclGetErrorString(r));
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
    default:
      throw Error(ErrorKind::kUnsupported, "dtype",
                  std::string(dtype_name(d)) + ": the NCCL communicator takes float32, bf16, fp16");
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(void* data, int64_t count, DType dtype) override {
    check(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(dtype), ncclSum, comm_,
                        stream_),
          "ncclAllReduce");
  }
  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    check(ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(dtype), comm_, stream_),
          "ncclAllGather");
  }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }
  bool capturable() const override { return true; }  // NCCL's collectives are graph nodes
  ncclComm_t comm() const { return comm_; }

 private:
  ncclComm_t comm_;
  int rank_, size_;
  cudaStream_t stream_ = nullptr;
};

class NcclGroup final : public CommunicatorGroup {
 public:
  explicit NcclGroup(std::vector<int> devices) : devices_(std::move(devices)) { init(); }
  ~NcclGroup() override { release(aborted_); }
  int size() const override { return static_cast<int>(devices_.size()); }
  // ncclCommAbort ends the kernels of collectives a failed rank will never join, so the other
  // ranks' stream synchronisations return (with an error) instead of hanging.
  void abort() override {
    if (aborted_) return;
    aborted_ = true;
    for (auto& r : ranks_) ncclCommAbort(r->comm());
  }
  // An aborted NCCL communicator cannot be used again: make the group anew.
  void recover() override {
    if (!aborted_) return;
    release(true);
    init();
  }

 private:
  Communicator& at(int r) override { return *ranks_[static_cast<size_t>(r)]; }
  void init() {
    std::vector<ncclComm_t> comms(devices_.size());
    check(ncclCommInitAll(comms.data(), size(), devices_.data()), "ncclCommInitAll");
    ranks_.clear();
    for (int r = 0; r < size(); ++r)
      ranks_.push_back(
          std::make_unique<NcclCommunicator>(comms[static_cast<size_t>(r)], r, size()));
    aborted_ = false;
  }
  void release(bool aborted) {
    for (auto& r : ranks_)
      if (!aborted) ncclCommDestroy(r->comm());
    ranks_.clear();
  }

  std::vector<int> devices_;
  std::vector<std::unique_ptr<NcclCommunicator>> ranks_;
  bool aborted_ = false;
};

}  // namespace

void check_nccl_devices(const std::vector<int>& devices) {
  if (devices.empty() || std::set<int>(devices.begin(), devices.end()).size() != devices.size())
    throw Error(ErrorKind::kInvalidArgument, "devices",
                "a group needs at least one device, each once");
  const int count = nccl_device_count();
  for (int d : devices)
    if (d < 0 || d >= count)
      throw Error(ErrorKind::kInvalidArgument, "tensor_parallel_size",
                  "needs CUDA device " + std::to_string(d) + ", and this machine has " +
                      std::to_string(count));
}

std::unique_ptr<CommunicatorGroup> make_nccl_group(const std::vector<int>& devices) {
  check_nccl_devices(devices);
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // the user's setting wins
  return std::make_unique<NcclGroup>(devices);
}

bool nccl_available() {
  return true;
}

int nccl_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the status the failed query left
    count = 0;
  }
  return count;
}

}  // namespace flashserve::model
