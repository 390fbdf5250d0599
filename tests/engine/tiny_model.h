// The tiny random checkpoint every engine test runs on (written once per test binary, removed when
// it exits), and the
// independent reference for greedy generation: one request alone through its own runner, whole
// prefill then one token per step, with the gap between the two largest logits at every position
// (a divergence after a near-tie is rounding, not a scheduling bug).
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/forward_batch.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model/runner.h"
#include "support/temp_dirs.h"

namespace flashserve::engine::testing {

inline const std::string& tiny_dir() {
  static const std::string dir = [] {
    const std::string p =
        flashserve::testing::temp_dir("fs_engine_tiny_" + std::to_string(::getpid()));
    model::RandomCheckpointOptions o;
    o.seed = 11;
    o.dtype = DType::kFloat32;
    model::write_random_checkpoint(model::preset_config("tiny"), p, o);
    return p;
  }();
  return dir;
}

struct Alone {
  std::vector<int32_t> tokens;
  std::vector<float> top2_gap;  // at each generated position
};

inline constexpr int32_t kAloneBlock = 16;

// A KV pool of blocks of kAloneBlock tokens for one sequence of `tokens`, and its block table.
inline std::vector<int32_t> pool_for_alone(model::ModelRunner& runner, size_t tokens) {
  const int64_t blocks = (static_cast<int64_t>(tokens) + kAloneBlock - 1) / kAloneBlock;
  runner.allocate_kv(blocks, kAloneBlock);
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) table[i] = static_cast<int32_t>(i);
  return table;
}

// Generation of `max_tokens` tokens (no stop) of `prompt`, alone (greedy unless `params` say).
inline Alone generate_alone(model::ModelRunner& runner, const std::vector<int32_t>& prompt,
                            int64_t max_tokens, const model::SamplingParams& params = {}) {
  const std::vector<int32_t> table = pool_for_alone(runner, prompt.size() + max_tokens);
  const int64_t vocab = runner.config().vocab_size;
  Alone a;
  std::vector<int32_t> seq = prompt;
  int64_t done = 0;
  while (static_cast<int64_t>(a.tokens.size()) < max_tokens) {
    const int64_t q = static_cast<int64_t>(seq.size()) - done;
    model::ForwardBatchBuilder b(kAloneBlock);
    b.add(seq.data() + done, done, q, table, true);
    const model::ForwardBatch fb = std::move(b).build();
    runner.forward(fb);
    const std::vector<float> logits = runner.logits();
    std::vector<float> row(logits.begin(), logits.begin() + vocab);
    const int32_t next = runner.sample(fb, {params})[0];
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
    a.top2_gap.push_back(row[0] - row[1]);
    a.tokens.push_back(next);
    seq.push_back(next);
    done += q;
  }
  return a;
}

}  // namespace flashserve::engine::testing
