// Bookkeeping of the paged KV cache: a fixed pool of blocks of `block_size` token slots each. A
// sequence owns a block table (logical block i -> physical block id); blocks carry reference counts
// so that a prefix can be shared between sequences (share_prefix) and freed only by its last owner.
// The manager holds no KV data: the engine maps block ids to device memory, the simulator ignores
// it.
//
// Prefix caching (optional): a full block whose KV has been computed is remembered by its content,
// the block before it (id and epoch) and its block_size tokens, so a later sequence that starts
// with the same tokens takes it instead of computing it again (shared system prompts, multi-turn
// chats, n choices of one prompt). A cached block nobody holds stays in an LRU pool: free to be
// taken, but taken last, and forgotten only then. Keys are compared exactly (a hash only finds
// the candidate), and a block's epoch changes whenever its slots get other content, so a key that
// names a reused block no longer matches anything.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "serve/sequence.h"

namespace flashserve::serve {

class BlockManager {
 public:
  // watermark: the fraction of blocks that admitting a new (or preempted) sequence must leave free,
  // so that the running sequences can keep growing for a while without preemption (as in vLLM).
  BlockManager(int64_t num_blocks, int32_t block_size, double watermark = 0.01,
               bool prefix_caching = false);

  int32_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return static_cast<int64_t>(ref_count_.size()); }
  // Blocks nobody holds: never used or forgotten, and cached ones (taken after the others).
  int64_t num_free() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t num_cached_free() const { return static_cast<int64_t>(lru_.size()); }
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

  bool prefix_caching() const { return caching_; }
  // Prefix caching: `seq`, holding no blocks and nothing computed, takes the cached blocks that
  // hold its first tokens, as far as they match, leaving at least one token to compute (the one
  // that samples); they count as computed. Returns how many tokens they hold (0 without caching).
  int64_t match_prefix(Sequence& seq);
  // The tokens match_prefix looks up for `seq`: its full blocks, less the one holding its last
  // token (that token is computed, to sample the next).
  int64_t prefix_lookup_tokens(const Sequence& seq) const {
    return (seq.num_tokens() - 1) / block_size_ * block_size_;
  }
  // Prefix caching: remembers the full blocks of `seq` computed in [from, to) tokens.
  void remember_computed(const Sequence& seq, int64_t from, int64_t to);

  // Throws Error(kInternal) naming the first violation of: every block is either free (count 0, in
  // the pool exactly once) or used (count = number of table entries naming it across `live`); no
  // table names a block twice; each table covers its computed tokens; free + used = total.
  void check_invariants(const std::vector<const Sequence*>& live) const;

 private:
  int32_t block_size_;
  int64_t watermark_blocks_;
  // A block for new content: a never-cached one if any, else the least recently used cached one.
  int32_t take_block();
  // Logical block `block` of `seq`'s tokens, into key_tokens_.
  void gather(const Sequence& seq, int64_t block) const;
  uint64_t key_hash(int32_t parent, uint64_t parent_epoch) const;  // of key_tokens_

  std::vector<int32_t> ref_count_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first

  bool caching_ = false;
  std::vector<uint64_t> epoch_;         // bumped whenever a block's slots get other content
  std::vector<char> cached_;            // the block's key below is in `index_`
  std::vector<int32_t> parent_;         // key: the block before it (-1 for a sequence's first)
  std::vector<uint64_t> parent_epoch_;  // key: that block's epoch
  std::vector<int32_t> tokens_;         // key: its block_size tokens, block by block
  std::vector<uint64_t> hash_;          // of its key
  std::unordered_map<uint64_t, int32_t> index_;  // key hash -> block
  mutable std::vector<int32_t> key_tokens_;      // scratch
  std::list<int32_t> lru_;  // cached blocks nobody holds, least recently freed first
  std::vector<std::list<int32_t>::iterator> lru_at_;
};

}  // namespace flashserve::serve
