// Tensor parallelism's ranks on one GPU: the in-process group's collectives
// (model/local_communicator.h) on device buffers, staged through host memory. NCCL refuses two
// ranks on one device, so this is how the CUDA runner's ranks (sharded weights, the all-reduces,
// the logits' gather) run against the whole model where there is a single GPU: for tests, not for
// speed. Each collective waits for the rank's stream, copies its buffer to the host, meets the
// other ranks there (float32 sums in rank order, every rank the same bits; a bf16 or fp16 sum is
// rounded once at the end, as NCCL's two-rank sum is) and copies the result back before it
// returns. Not capturable in a CUDA graph (Communicator::capturable).
#pragma once

#include <memory>

#include "model/communicator.h"

namespace flashserve::model::cuda {

// Error(kInvalidArgument, "size") for fewer than one rank.
std::unique_ptr<CommunicatorGroup> make_staged_group(int size);

}  // namespace flashserve::model::cuda
