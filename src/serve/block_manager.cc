#include "serve/block_manager.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "flashserve/error.h"

namespace flashserve::serve {

namespace {
[[noreturn]] void internal(const std::string& what) {
  throw Error(ErrorKind::kInternal, "block_manager", what);
}
}  // namespace

BlockManager::BlockManager(int64_t num_blocks, int32_t block_size, double watermark)
    : block_size_(block_size) {
  if (num_blocks <= 0 || num_blocks > INT32_MAX)
    throw Error(ErrorKind::kInvalidArgument, "num_blocks",
                std::to_string(num_blocks) + " is not in [1, 2^31)");
  if (block_size <= 0)
    throw Error(ErrorKind::kInvalidArgument, "block_size",
                std::to_string(block_size) + " must be positive");
  // The engine addresses KV slots as int32 (ForwardBatch::slot_mapping, like the kernels' tables).
  if (num_blocks * int64_t{block_size} > INT32_MAX)
    throw Error(ErrorKind::kInvalidArgument, "num_blocks",
                std::to_string(num_blocks) + " blocks of " + std::to_string(block_size) +
                    " tokens exceed the 2^31 token slots that int32 slot indices address");
  if (!(watermark >= 0 && watermark < 1))
    throw Error(ErrorKind::kInvalidArgument, "watermark",
                std::to_string(watermark) + " must be in [0, 1)");
  watermark_blocks_ = static_cast<int64_t>(std::floor(watermark * static_cast<double>(num_blocks)));
  ref_count_.assign(num_blocks, 0);
  free_.resize(num_blocks);
  // Block 0 on top of the stack, so that a fresh manager hands out 0, 1, 2, ...
  for (int64_t i = 0; i < num_blocks; ++i) free_[i] = static_cast<int32_t>(num_blocks - 1 - i);
}

int64_t BlockManager::blocks_needed(const Sequence& seq, int64_t num_tokens) const {
  return std::max<int64_t>(
      0, blocks_for_tokens(num_tokens) - static_cast<int64_t>(seq.block_table.size()));
}

bool BlockManager::can_admit(const Sequence& seq, int64_t num_tokens) const {
  return num_free() - blocks_needed(seq, num_tokens) >= watermark_blocks_;
}

bool BlockManager::can_grow(const Sequence& seq, int64_t num_tokens) const {
  return blocks_needed(seq, num_tokens) <= num_free();
}

void BlockManager::grow(Sequence& seq, int64_t num_tokens) {
  const int64_t need = blocks_needed(seq, num_tokens);
  if (need > num_free())
    internal("sequence " + std::to_string(seq.id) + " needs " + std::to_string(need) +
             " blocks, only " + std::to_string(num_free()) + " free");
  for (int64_t i = 0; i < need; ++i) {
    const int32_t b = free_.back();
    free_.pop_back();
    ref_count_[b] = 1;
    seq.block_table.push_back(b);
  }
}

void BlockManager::release(Sequence& seq) {
  for (int32_t b : seq.block_table) {
    if (ref_count_.at(b) <= 0)
      internal("sequence " + std::to_string(seq.id) + " releases free block " + std::to_string(b));
    if (--ref_count_[b] == 0) free_.push_back(b);
  }
  seq.block_table.clear();
}

void BlockManager::share_prefix(const Sequence& parent, Sequence& child, int64_t num_tokens) {
  if (!child.block_table.empty())
    throw Error(ErrorKind::kInvalidArgument, "child",
                "sequence " + std::to_string(child.id) + " already holds blocks");
  if (num_tokens < 0 || num_tokens > parent.num_computed)
    throw Error(ErrorKind::kInvalidArgument, "num_tokens",
                std::to_string(num_tokens) + " is not in [0, parent's computed tokens " +
                    std::to_string(parent.num_computed) + "]");
  // Only full blocks are shared: the child's next token would otherwise write into a slot of a
  // block the parent may also write (copy-on-write would be needed).
  const int64_t full = num_tokens / block_size_;
  for (int64_t i = 0; i < full; ++i) {
    const int32_t b = parent.block_table[i];
    ++ref_count_[b];
    child.block_table.push_back(b);
  }
  child.num_computed = full * block_size_;
}

void BlockManager::check_invariants(const std::vector<const Sequence*>& live) const {
  const int64_t n = num_blocks();
  std::vector<int32_t> refs(n, 0);
  for (const Sequence* s : live) {
    std::vector<int32_t> sorted = s->block_table;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      internal("sequence " + std::to_string(s->id) + " names a block twice");
    if (static_cast<int64_t>(s->block_table.size()) < blocks_for_tokens(s->num_computed))
      internal("sequence " + std::to_string(s->id) + " has " + std::to_string(s->num_computed) +
               " computed tokens but only " + std::to_string(s->block_table.size()) + " blocks");
    for (int32_t b : s->block_table) {
      if (b < 0 || b >= n) internal("block id " + std::to_string(b) + " out of range");
      ++refs[b];
    }
  }
  std::vector<char> in_pool(n, 0);
  for (int32_t b : free_) {
    if (b < 0 || b >= n) internal("free block id " + std::to_string(b) + " out of range");
    if (in_pool[b]) internal("block " + std::to_string(b) + " is in the free pool twice");
    in_pool[b] = 1;
  }
  int64_t used = 0;
  for (int64_t b = 0; b < n; ++b) {
    if (refs[b] != ref_count_[b])
      internal("block " + std::to_string(b) + " has count " + std::to_string(ref_count_[b]) +
               " but " + std::to_string(refs[b]) + " owners");
    if (in_pool[b] && refs[b] != 0) internal("block " + std::to_string(b) + " is free and owned");
    if (!in_pool[b] && refs[b] == 0) internal("block " + std::to_string(b) + " leaked");
    used += refs[b] > 0;
  }
  if (used + num_free() != n)
    internal("free " + std::to_string(num_free()) + " + used " + std::to_string(used) +
             " != total " + std::to_string(n));
}

}  // namespace flashserve::serve
