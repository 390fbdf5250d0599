// The collectives tensor parallelism needs between the ranks of one model
// (docs/tensor-parallel.md): an all-reduce (sum) after each row-parallel projection and an
// all-gather of the LM head's vocabulary blocks. Three groups implement it: the in-process one
// over host memory (model/local_communicator.h: the CPU emulation CI runs), NCCL's over GPUs
// (model/nccl_communicator.h), and the in-process one's over device buffers staged through the
// host (model/cuda/staged_communicator.h: CUDA ranks sharing one GPU, for tests). A rank's runner
// holds its Communicator; the tensor-parallel runner holds the group, to abort and recover it when
// a rank fails mid-step.
#pragma once

#include <cstdint>
#include <string>

#include "flashserve/error.h"
#include "flashserve/tensor.h"

namespace flashserve::model {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: data[i] = the sum over ranks of their data[i], for i < count, with the same bits on
  // every rank (each rank's next layer must see the same residual stream). `data` lives where the
  // rank's runner computes (host memory, or its GPU); a device communicator enqueues the
  // collective on its stream and returns.
  virtual void all_reduce_sum(void* data, int64_t count, DType dtype) = 0;
  // recv[r * count + i] = rank r's send[i] for every rank r and i < count (recv holds
  // size() * count elements; send and recv do not overlap).
  virtual void all_gather(const void* send, void* recv, int64_t count, DType dtype) = 0;
  // The stream a device communicator enqueues on (a cudaStream_t; null: the default stream), so
  // that its collectives order with the runner's kernels. The in-process one has none.
  virtual void set_stream(void* stream) { (void)stream; }
  // Whether its collectives may be captured in a CUDA graph with the runner's kernels (NCCL's:
  // yes; one that waits on the host for the data: no, and the runner then runs every step
  // eagerly).
  virtual bool capturable() const { return false; }
};

// The communicators of one group, rank r's at rank(r).
class CommunicatorGroup {
 public:
  virtual ~CommunicatorGroup() = default;
  virtual int size() const = 0;
  // Error(kInvalidArgument, "rank") outside [0, size()).
  Communicator& rank(int r) {
    if (r < 0 || r >= size())
      throw Error(ErrorKind::kInvalidArgument, "rank",
                  std::to_string(r) + " is outside [0, " + std::to_string(size()) + ")");
    return at(r);
  }
  // A rank failed mid-step: every rank blocked in a collective, and every later call, ends with
  // Error(kInternal, "communicator") instead of waiting forever for the failed one.
  virtual void abort() = 0;
  // Readies an aborted group for the next step. Only once no rank is inside a collective (the
  // tensor-parallel runner calls it after joining every rank).
  virtual void recover() = 0;

 protected:
  virtual Communicator& at(int r) = 0;  // r in [0, size())
};

}  // namespace flashserve::model
