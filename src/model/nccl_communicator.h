// The communicator group over GPUs of this process: NCCL (from the CUDA toolkit, or PyTorch's
// wheel), one communicator per device made at once by ncclCommInitAll (the ranks are threads of
// one process: docs/tensor-parallel.md). Collectives enqueue on the stream each rank's runner
// sets (Communicator::set_stream) and return; the sum's order is NCCL's (ring or tree), the same
// bits on every rank. NVLink multicast (NVLS) is off unless NCCL_NVLS_ENABLE is set: on shared
// machines it can take the host's GPUs out of service.
#pragma once

#include <memory>
#include <vector>

#include "model/communicator.h"

namespace flashserve::model {

// Rank r on CUDA device devices[r]. Error(kUnsupported, "tensor_parallel_size") in a build without
// NCCL (src/model/nccl_communicator_stub.cc), Error(kInvalidArgument, "devices") for fewer than one
// or a repeated device, Error(kInvalidArgument, "tensor_parallel_size") for a device the machine
// does not have, Error(kCuda, "nccl") for NCCL's failures.
std::unique_ptr<CommunicatorGroup> make_nccl_group(const std::vector<int>& devices);

// make_nccl_group's refusals without making the group: what a loader checks before it reads a
// model it could not split over these devices.
void check_nccl_devices(const std::vector<int>& devices);

// Whether this build has NCCL (the stub answers false).
bool nccl_available();

// The CUDA devices a group could take: 0 without a GPU, its driver, or NCCL.
int nccl_device_count();

}  // namespace flashserve::model
