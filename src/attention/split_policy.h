// The CUDA path's two shape decisions that do not depend on a kernel being present: whether a call
// is decode (the GQA-packed decode tiles) and how many ways split-KV divides its keys. Plain C++,
// so that CI tests the policy without a GPU; the workspace size a caller allocates follows from it.
#pragma once

#include <cstdint>

#include "problem.h"

namespace flashserve::attention {

// What the choice needs to know of the device.
struct SplitDevice {
  int sms = 0;          // streaming multiprocessors
  int smem_per_sm = 0;  // shared memory per SM in bytes (how many decode blocks fit)
};

// Decode: every sequence has at most one query, so causal masks nothing and a left window bounds
// all of a sequence's heads alike (the GQA-packed decode tiles take it).
bool is_decode(const Problem& pr);

// num_splits 1: 1; n > 1: n; 0: the choice below (1 when splitting would not pay). fp8_codes: the
// decode launch runs the fp8 KV cache's register-conversion tiles (smaller blocks, more per SM).
int choose_splits(const Problem& pr, const SplitDevice& dev, bool decode, bool fp8_codes = false);

}  // namespace flashserve::attention
