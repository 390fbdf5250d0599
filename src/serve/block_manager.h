// Bookkeeping of the paged KV cache: a fixed pool of blocks of `block_size` token slots each. A
// sequence owns a block table (logical block i -> physical block id); blocks carry reference counts
// so that a prefix can be shared between sequences (share_prefix) and freed only by its last owner.
// The manager holds no KV data: the engine maps block ids to device memory, the simulator ignores
// it.
#pragma once

#include <cstdint>
#include <vector>

#include "serve/sequence.h"

namespace flashserve::serve {

class BlockManager {
 public:
  // watermark: the fraction of blocks that admitting a new (or preempted) sequence must leave free,
  // so that the running sequences can keep growing for a while without preemption (as in vLLM).
  BlockManager(int64_t num_blocks, int32_t block_size, double watermark = 0.01);

  int32_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return static_cast<int64_t>(ref_count_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_used() const { return num_blocks() - num_free(); }
  int64_t watermark_blocks() const { return watermark_blocks_; }
  int32_t ref_count(int32_t block) const { return ref_count_.at(block); }

  int64_t blocks_for_tokens(int64_t tokens) const {
    return (tokens + block_size_ - 1) / block_size_;
  }
  // Blocks that `seq` lacks for its table to cover `num_tokens` token slots.
  int64_t blocks_needed(const Sequence& seq, int64_t num_tokens) const;
  // Whether a sequence not yet holding blocks (new or preempted) may take enough for `num_tokens`
  // and still leave the watermark free.
  bool can_admit(const Sequence& seq, int64_t num_tokens) const;
  // Whether a running sequence can grow to `num_tokens` (the watermark is there to be used here).
  bool can_grow(const Sequence& seq, int64_t num_tokens) const;
  // Extends seq.block_table to cover `num_tokens` slots. Throws if there are not enough free
  // blocks.
  void grow(Sequence& seq, int64_t num_tokens);
  // Drops seq's references; blocks whose count reaches zero return to the free pool.
  void release(Sequence& seq);
  // Room for prefix sharing: `child` (holding no blocks) takes references to the full blocks of
  // `parent` that cover its first `num_tokens` tokens and counts them as computed.
  void share_prefix(const Sequence& parent, Sequence& child, int64_t num_tokens);

  // Throws Error(kInternal) naming the first violation of: every block is either free (count 0, in
  // the pool exactly once) or used (count = number of table entries naming it across `live`); no
  // table names a block twice; each table covers its computed tokens; free + used = total.
  void check_invariants(const std::vector<const Sequence*>& live) const;

 private:
  int32_t block_size_;
  int64_t watermark_blocks_;
  std::vector<int32_t> ref_count_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
};

}  // namespace flashserve::serve
