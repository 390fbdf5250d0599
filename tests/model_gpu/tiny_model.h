// What the model GPU tests share: the tiny random checkpoint they load (preset "tiny", written
// once per process into a temporary directory, only read, and removed at exit), and a sequence's
// block table in a pool laid out a fixed number of blocks per sequence.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "support/temp_dirs.h"

namespace flashserve::testing {

inline const std::string& tiny_checkpoint_dir() {
  static const std::string dir = [] {
    const std::string d = temp_dir("flashserve-gpu-tiny-" + std::to_string(::getpid()));
    model::write_random_checkpoint(model::preset_config("tiny"), d);
    return d;
  }();
  return dir;
}

// The blocks holding kv_len tokens of sequence `seq`, whose blocks start at seq x per_seq.
inline std::vector<int32_t> sequence_blocks(int64_t seq, int64_t kv_len, int64_t per_seq,
                                            int64_t block_size) {
  std::vector<int32_t> b;
  for (int64_t i = 0; i < (kv_len + block_size - 1) / block_size; ++i)
    b.push_back(static_cast<int32_t>(seq * per_seq + i));
  return b;
}

}  // namespace flashserve::testing
