// Serving metrics as the Sarathi-Serve paper defines them, computed from finished sequences:
//   TTFT            first token time - arrival
//   TBT             every gap between consecutive tokens of a request (pooled over all requests)
//   TPOT            (last token time - first token time) / (output tokens - 1), per request
//   end-to-end      last token time - arrival
//   scheduling delay  start of the first step that ran the request - arrival
#pragma once

#include <cstdint>
#include <vector>

#include "serve/sequence.h"

namespace flashserve::serve {

struct Summary {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

// Percentile q in [0, 100] by linear interpolation between order statistics (NumPy's default).
double percentile(std::vector<double> values, double q);
Summary summarize(const std::vector<double>& values);

struct ServingMetrics {
  int64_t num_requests = 0;
  int64_t output_tokens = 0;
  int64_t preemptions = 0;
  double duration_s = 0;          // first arrival to last finish
  double request_throughput = 0;  // requests / duration
  double token_throughput = 0;    // output tokens / duration
  Summary ttft, tbt, tpot, e2e, sched_delay;
  std::vector<double> tbt_samples;  // every gap, for CDF plots
};

// Throws Error(kInvalidArgument) if a sequence is unfinished or its timestamps are inconsistent.
ServingMetrics compute_metrics(const std::vector<const Sequence*>& finished);

}  // namespace flashserve::serve
