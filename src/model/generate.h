// One prompt through a runner: prefill (whole, or in chunks), then decode token by token. The
// engine issue replaces this loop by the scheduler's for many requests; `flashserve generate`
// and the tests use it for one.
#pragma once

#include <cstdint>
#include <vector>

#include "model/runner.h"
#include "model/sampling.h"

namespace flashserve::model {

struct GenerateOptions {
  int64_t max_tokens = 32;  // new tokens at most
  SamplingParams sampling;
  bool stop_at_eos = true;    // stop after one of the config's eos tokens (it is returned)
  int32_t block_size = 16;    // KV page size
  int64_t prefill_chunk = 0;  // tokens per prefill step; 0: the whole prompt in one step
};

// Allocates the runner's KV pool for prompt + max_tokens and returns the generated token ids.
std::vector<int32_t> generate(ModelRunner& runner, const std::vector<int32_t>& prompt,
                              const GenerateOptions& options);

}  // namespace flashserve::model
