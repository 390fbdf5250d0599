#include "serve/block_manager.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#include "flashserve/error.h"

namespace flashserve::serve {

namespace {
[[noreturn]] void internal(const std::string& what) {
  throw Error(ErrorKind::kInternal, "block_manager", what);
}
}  // namespace

BlockManager::BlockManager(int64_t num_blocks, int32_t block_size, double watermark,
                           bool prefix_caching)
    : block_size_(block_size), caching_(prefix_caching) {
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
  if (caching_) {
    epoch_.assign(num_blocks, 0);
    cached_.assign(num_blocks, 0);
    parent_.assign(num_blocks, -1);
    parent_epoch_.assign(num_blocks, 0);
    tokens_.assign(num_blocks * block_size, 0);
    hash_.assign(num_blocks, 0);
    lru_at_.resize(num_blocks);
    key_tokens_.resize(block_size);
  }
}

int32_t BlockManager::take_block() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    b = lru_.front();  // the cached block freed longest ago is forgotten
    lru_.pop_front();
    if (auto it = index_.find(hash_[b]); it != index_.end() && it->second == b) index_.erase(it);
    cached_[b] = 0;
  }
  if (caching_) ++epoch_[b];  // keys naming it as their parent no longer match
  ref_count_[b] = 1;
  return b;
}

void BlockManager::gather(const Sequence& seq, int64_t block) const {
  for (int32_t t = 0; t < block_size_; ++t) key_tokens_[t] = seq.token_at(block * block_size_ + t);
}

uint64_t BlockManager::key_hash(int32_t parent, uint64_t parent_epoch) const {
  // FNV-1a over the key's words, finished by a 64-bit mix; the key is compared in full on a hit.
  uint64_t h = 1469598103934665603ull;
  const auto add = [&](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  add(static_cast<uint32_t>(parent));
  add(parent_epoch);
  for (int32_t t : key_tokens_) add(static_cast<uint32_t>(t));
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

int64_t BlockManager::match_prefix(Sequence& seq) {
  if (!caching_) return 0;
  if (!seq.block_table.empty() || seq.num_computed != 0)
    internal("sequence " + std::to_string(seq.id) + " looks up a prefix holding blocks");
  const int64_t max_blocks = prefix_lookup_tokens(seq) / block_size_;
  int32_t parent = -1;
  uint64_t parent_epoch = 0;
  for (int64_t i = 0; i < max_blocks; ++i) {
    gather(seq, i);
    const auto it = index_.find(key_hash(parent, parent_epoch));
    if (it == index_.end()) break;
    const int32_t b = it->second;
    if (parent_[b] != parent || parent_epoch_[b] != parent_epoch ||
        !std::equal(key_tokens_.begin(), key_tokens_.end(), tokens_.begin() + b * block_size_))
      break;
    if (ref_count_[b]++ == 0) lru_.erase(lru_at_[b]);
    seq.block_table.push_back(b);
    parent = b;
    parent_epoch = epoch_[b];
  }
  seq.num_computed = static_cast<int64_t>(seq.block_table.size()) * block_size_;
  return seq.num_computed;
}

void BlockManager::remember_computed(const Sequence& seq, int64_t from, int64_t to) {
  if (!caching_) return;
  for (int64_t i = from / block_size_; i < to / block_size_; ++i) {
    const int32_t b = seq.block_table.at(i);
    if (cached_[b]) continue;  // taken from the cache, or remembered already
    const int32_t parent = i > 0 ? seq.block_table[i - 1] : -1;
    const uint64_t parent_epoch = i > 0 ? epoch_[parent] : 0;
    gather(seq, i);
    const uint64_t h = key_hash(parent, parent_epoch);
    if (index_.count(h)) continue;  // the same content in another block (or a hash collision)
    cached_[b] = 1;
    hash_[b] = h;
    parent_[b] = parent;
    parent_epoch_[b] = parent_epoch;
    std::copy(key_tokens_.begin(), key_tokens_.end(), tokens_.begin() + b * block_size_);
    index_.emplace(h, b);
  }
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
  for (int64_t i = 0; i < need; ++i) seq.block_table.push_back(take_block());
}

void BlockManager::release(Sequence& seq) {
  for (int32_t b : seq.block_table) {
    if (ref_count_.at(b) <= 0)
      internal("sequence " + std::to_string(seq.id) + " releases free block " + std::to_string(b));
    if (--ref_count_[b] > 0) continue;
    if (caching_ && cached_[b])
      lru_at_[b] = lru_.insert(lru_.end(), b);  // kept, to be taken last
    else
      free_.push_back(b);
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
    if (caching_ && cached_[b]) internal("cached block " + std::to_string(b) + " in the free pool");
    in_pool[b] = 1;
  }
  for (int32_t b : lru_) {
    if (b < 0 || b >= n) internal("cached block id " + std::to_string(b) + " out of range");
    if (in_pool[b]) internal("block " + std::to_string(b) + " is in a free pool twice");
    if (!cached_[b]) internal("block " + std::to_string(b) + " is in the LRU pool uncached");
    in_pool[b] = 1;
  }
  for (const auto& [h, b] : index_)
    if (!cached_[b] || hash_[b] != h)
      internal("the prefix index names block " + std::to_string(b) + " under another key");
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
