// BlockManager: allocation, reference counts, the watermark and the invariant checker, including a
// long random sequence of operations checked against an independent model of who owns what.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <set>

#include "flashserve/error.h"
#include "serve/block_manager.h"

namespace fs = flashserve::serve;
using flashserve::Error;

namespace {

std::unique_ptr<fs::Sequence> make_seq(int64_t id) {
  auto s = std::make_unique<fs::Sequence>();
  s->id = id;
  return s;
}

TEST(BlockManager, GrowAndReleaseCountBlocks) {
  fs::BlockManager bm(10, 16);
  auto s = make_seq(1);
  EXPECT_EQ(bm.blocks_needed(*s, 33), 3);
  bm.grow(*s, 33);
  EXPECT_EQ(s->block_table.size(), 3u);
  EXPECT_EQ(bm.num_free(), 7);
  EXPECT_EQ(bm.num_used(), 3);
  bm.grow(*s, 48);  // still fits in 3 blocks
  EXPECT_EQ(s->block_table.size(), 3u);
  bm.grow(*s, 49);
  EXPECT_EQ(s->block_table.size(), 4u);
  bm.check_invariants({s.get()});
  bm.release(*s);
  EXPECT_TRUE(s->block_table.empty());
  EXPECT_EQ(bm.num_free(), 10);
  bm.check_invariants({});
}

TEST(BlockManager, GrowBeyondFreeThrows) {
  fs::BlockManager bm(4, 8);
  auto s = make_seq(1);
  EXPECT_FALSE(bm.can_grow(*s, 33));
  EXPECT_THROW(bm.grow(*s, 33), Error);
  EXPECT_TRUE(bm.can_grow(*s, 32));
}

TEST(BlockManager, WatermarkOnlyLimitsAdmission) {
  fs::BlockManager bm(100, 1, 0.1);  // 10 blocks of watermark
  EXPECT_EQ(bm.watermark_blocks(), 10);
  auto a = make_seq(1);
  EXPECT_TRUE(bm.can_admit(*a, 90));
  EXPECT_FALSE(bm.can_admit(*a, 91));
  bm.grow(*a, 90);
  // A running sequence may eat into the watermark.
  EXPECT_TRUE(bm.can_grow(*a, 100));
  auto b = make_seq(2);
  EXPECT_FALSE(bm.can_admit(*b, 1));
}

TEST(BlockManager, SharedPrefixFreedByLastOwner) {
  fs::BlockManager bm(8, 4);
  auto parent = make_seq(1), child = make_seq(2);
  bm.grow(*parent, 10);  // 3 blocks
  parent->num_computed = 10;
  bm.share_prefix(*parent, *child, 10);  // 2 full blocks shared
  EXPECT_EQ(child->block_table.size(), 2u);
  EXPECT_EQ(child->num_computed, 8);
  EXPECT_EQ(bm.ref_count(parent->block_table[0]), 2);
  EXPECT_EQ(bm.ref_count(parent->block_table[2]), 1);
  bm.check_invariants({parent.get(), child.get()});
  bm.grow(*child, 12);  // its own third block
  EXPECT_NE(child->block_table[2], parent->block_table[2]);
  bm.release(*parent);
  EXPECT_EQ(bm.num_used(), 3);  // the two shared blocks and the child's own
  bm.check_invariants({child.get()});
  bm.release(*child);
  EXPECT_EQ(bm.num_free(), 8);
  bm.check_invariants({});
}

TEST(BlockManager, InvariantCheckerCatchesCorruption) {
  fs::BlockManager bm(6, 2);
  auto a = make_seq(1), b = make_seq(2);
  bm.grow(*a, 4);
  bm.grow(*b, 2);
  bm.check_invariants({a.get(), b.get()});
  // A leak: b is forgotten by the caller.
  EXPECT_THROW(bm.check_invariants({a.get()}), Error);
  // A block owned twice without its count saying so.
  auto c = make_seq(3);
  c->block_table = {a->block_table[0]};
  EXPECT_THROW(bm.check_invariants({a.get(), b.get(), c.get()}), Error);
  // A free block claimed by a table.
  c->block_table = {5};
  EXPECT_THROW(bm.check_invariants({a.get(), b.get(), c.get()}), Error);
  // A table naming a block twice.
  c->block_table = {a->block_table[0], a->block_table[0]};
  EXPECT_THROW(bm.check_invariants({c.get(), b.get()}), Error);
  // Computed tokens not covered by blocks.
  a->num_computed = 5;
  EXPECT_THROW(bm.check_invariants({a.get(), b.get()}), Error);
}

TEST(BlockManager, BadArgumentsNameTheArgument) {
  try {
    fs::BlockManager bm(0, 16);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "num_blocks");
  }
  try {
    fs::BlockManager bm(4, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "block_size");
  }
  try {                                  // more token slots than int32 slot indices address
    fs::BlockManager bm(2048, 1 << 20);  // 2^31 slots
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "num_blocks");
  }
  EXPECT_NO_THROW(fs::BlockManager(2047, 1 << 20));
  EXPECT_THROW(fs::BlockManager(4, 4, 1.0), Error);
  fs::BlockManager bm(4, 4);
  auto p = make_seq(1), c = make_seq(2);
  bm.grow(*p, 8);
  p->num_computed = 8;
  EXPECT_THROW(bm.share_prefix(*p, *c, 9), Error);  // more than the parent computed
}

// Thousands of random grow / release / share operations; after each one the manager's counts must
// match an independent tally of the tables, and free + used = total.
TEST(BlockManager, RandomOperationsKeepInvariants) {
  std::mt19937_64 rng(1234);
  for (int trial = 0; trial < 40; ++trial) {
    const int32_t bs = std::uniform_int_distribution<int32_t>(1, 8)(rng);
    const int64_t nb = std::uniform_int_distribution<int64_t>(4, 64)(rng);
    fs::BlockManager bm(nb, bs);
    std::vector<std::unique_ptr<fs::Sequence>> seqs;
    int64_t next_id = 0;
    for (int op = 0; op < 300; ++op) {
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      if (kind < 5 || seqs.empty()) {  // grow a new or existing sequence
        if (seqs.empty() || kind == 0) seqs.push_back(make_seq(next_id++));
        auto& s = seqs[std::uniform_int_distribution<size_t>(0, seqs.size() - 1)(rng)];
        const int64_t want = static_cast<int64_t>(s->block_table.size()) * bs +
                             std::uniform_int_distribution<int64_t>(0, 3 * bs)(rng);
        const int64_t need = bm.blocks_needed(*s, want);
        const int64_t before = bm.num_free();
        if (bm.can_grow(*s, want)) {
          bm.grow(*s, want);
          EXPECT_EQ(bm.num_free(), before - need);
          s->num_computed = want;
        } else {
          EXPECT_GT(need, before);
          EXPECT_THROW(bm.grow(*s, want), Error);
        }
      } else if (kind < 8) {  // release one
        const size_t i = std::uniform_int_distribution<size_t>(0, seqs.size() - 1)(rng);
        bm.release(*seqs[i]);
        seqs.erase(seqs.begin() + static_cast<std::ptrdiff_t>(i));
      } else {  // share a prefix into a new sequence
        auto& p = seqs[std::uniform_int_distribution<size_t>(0, seqs.size() - 1)(rng)];
        auto c = make_seq(next_id++);
        bm.share_prefix(*p, *c, std::uniform_int_distribution<int64_t>(0, p->num_computed)(rng));
        seqs.push_back(std::move(c));
      }
      std::vector<const fs::Sequence*> live;
      std::map<int32_t, int32_t> owners;
      for (auto& s : seqs) {
        live.push_back(s.get());
        for (int32_t b : s->block_table) ++owners[b];
      }
      ASSERT_NO_THROW(bm.check_invariants(live)) << "trial " << trial << " op " << op;
      for (auto [b, n] : owners) ASSERT_EQ(bm.ref_count(b), n);
      ASSERT_EQ(bm.num_used(), static_cast<int64_t>(owners.size()));
      ASSERT_EQ(bm.num_free() + bm.num_used(), nb);
    }
  }
}

}  // namespace
