// The collective tables of a tensor-parallel profile (serve/step_profile.h: `all_reduce` and
// `all_gather`): one collective of each message size over a communicator group's ranks, measured
// on its own, as Vidur measures collectives apart from a rank's compute. The ranks are threads
// (one a rank, each on its GPU on CUDA), released together by a host barrier before every timed
// call; rank 0 times its call to completion (on CUDA, the stream synchronised), and each size
// keeps the median of `reps` calls after `warmup`.
#pragma once

#include <cstdint>
#include <vector>

#include "flashserve/tensor.h"
#include "model/communicator.h"
#include "serve/step_profile.h"

namespace flashserve::engine {

enum class Collective {
  kAllReduce,  // a sum in place of `bytes` on every rank (after o_proj and down_proj)
  kAllGather,  // `bytes` from every rank, size() x bytes received by each (the logits' blocks)
};

struct CollectiveGrid {
  Collective collective = Collective::kAllReduce;
  std::vector<int64_t> bytes;  // each rank's message sizes, strictly increasing, multiples of
                               // dtype's size
  DType dtype = DType::kFloat32;
  int reps = 5, warmup = 2;
  // One message per count of `counts` (a profile's axis: tokens, or sampled rows): count x
  // bytes_per_unit.
  static CollectiveGrid for_counts(Collective collective, const std::vector<int64_t>& counts,
                                   int64_t bytes_per_unit, DType dtype);
};

// `devices[r]`: rank r's CUDA device, or empty for a group over host memory (the in-process
// one). The table (x: each rank's message bytes) is made non-decreasing (serve::make_monotone).
// Error(kInvalidArgument, "grid") for a malformed grid; Error(kUnsupported, "device") for devices
// in a build without CUDA.
serve::ProfileTable1 profile_collective(model::CommunicatorGroup& group,
                                        const std::vector<int>& devices,
                                        const CollectiveGrid& grid);

}  // namespace flashserve::engine
