// make_nccl_group in a build without NCCL (src/model/nccl/nccl_communicator.cc replaces this file
// when CUDA and NCCL are found; see src/CMakeLists.txt).
#include "flashserve/error.h"
#include "model/nccl_communicator.h"

namespace flashserve::model {

void check_nccl_devices(const std::vector<int>& devices) {
  (void)devices;
  throw Error(ErrorKind::kUnsupported, "tensor_parallel_size",
              "this flashserve is built without NCCL (CUDA's collectives library): no tensor "
              "parallelism over GPUs");
}

std::unique_ptr<CommunicatorGroup> make_nccl_group(const std::vector<int>& devices) {
  check_nccl_devices(devices);
  return nullptr;  // not reached: the check refuses every group
}

bool nccl_available() {
  return false;
}

int nccl_device_count() {
  return 0;
}

}  // namespace flashserve::model
