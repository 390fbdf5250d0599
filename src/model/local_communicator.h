// The in-process communicator group: ranks are threads of this process sharing host memory (the
// CPU emulation of tensor parallelism that CI runs, and the reference for NCCL's results). Each
// collective is a rendezvous of all ranks: every rank posts its buffer, waits for the others,
// reads them, and waits again before anyone may reuse a buffer. The all-reduce adds the ranks'
// values in rank order, ((x0 + x1) + x2) + ..., on every rank: deterministic, and the same bits
// everywhere. float32 only (the CPU runner's dtype); the all-gather copies any dtype.
#pragma once

#include <memory>

#include "model/communicator.h"

namespace flashserve::model {

std::unique_ptr<CommunicatorGroup> make_local_group(int size);

}  // namespace flashserve::model
