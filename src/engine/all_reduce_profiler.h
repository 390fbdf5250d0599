// The all-reduce table of a tensor-parallel profile (serve/step_profile.h: `all_reduce`): one
// all-reduce of each message size over a communicator group's ranks, measured on its own, as Vidur
// measures collectives apart from a rank's compute. The ranks are threads (one a rank, each on
// its GPU on CUDA), released together by a host barrier before every timed call; rank 0 times
// its call to completion (on CUDA, the stream synchronised), and each size keeps the median of
// `reps` calls after `warmup`.
#pragma once

#include <cstdint>
#include <vector>

#include "flashserve/tensor.h"
#include "model/communicator.h"
#include "serve/step_profile.h"

namespace flashserve::engine {

struct AllReduceGrid {
  std::vector<int64_t> bytes;  // message sizes, strictly increasing, each a multiple of dtype's
  DType dtype = DType::kFloat32;
  int reps = 5, warmup = 2;
  // One message per token count of `tokens` (a profile's linear axis): tokens x bytes_per_token.
  static AllReduceGrid for_tokens(const std::vector<int64_t>& tokens, int64_t bytes_per_token,
                                  DType dtype);
};

// `devices[r]`: rank r's CUDA device, or empty for a group over host memory (the in-process
// one). The table is made non-decreasing (serve::make_monotone). Error(kInvalidArgument, "grid")
// for a malformed grid; Error(kUnsupported, "device") for devices in a build without CUDA.
serve::ProfileTable1 profile_all_reduce(model::CommunicatorGroup& group,
                                        const std::vector<int>& devices, const AllReduceGrid& grid);

}  // namespace flashserve::engine
