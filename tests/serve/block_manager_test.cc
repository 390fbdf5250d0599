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

// ---- prefix caching ----

// A sequence with `prompt`, its blocks grown and all of it computed, remembered by the cache (as
// the scheduler does after each step).
std::unique_ptr<fs::Sequence> computed(fs::BlockManager& bm, int64_t id,
                                       std::vector<int32_t> prompt) {
  auto s = make_seq(id);
  s->prompt = std::move(prompt);
  bm.match_prefix(*s);
  const int64_t from = s->num_computed;
  bm.grow(*s, s->num_tokens());
  s->num_computed = s->num_tokens();
  bm.remember_computed(*s, from, s->num_computed);
  return s;
}

std::vector<int32_t> tokens(int64_t n, int32_t first = 100) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = first + static_cast<int32_t>(i);
  return t;
}

TEST(PrefixCache, ASecondSequenceTakesTheFullBlocksOfTheSamePrompt) {
  fs::BlockManager bm(20, 16, 0.0, true);
  auto a = computed(bm, 1, tokens(40));  // blocks 0..1 full, the third partial
  auto b = make_seq(2);
  b->prompt = tokens(40);
  EXPECT_EQ(bm.match_prefix(*b), 32);
  EXPECT_EQ(b->num_computed, 32);
  EXPECT_EQ(b->block_table,
            std::vector<int32_t>(a->block_table.begin(), a->block_table.begin() + 2));
  EXPECT_EQ(bm.ref_count(a->block_table[0]), 2);
  bm.check_invariants({a.get(), b.get()});
  // A prompt that differs in its second block shares only the first.
  auto c = make_seq(3);
  c->prompt = tokens(40);
  c->prompt[20] = 7;
  EXPECT_EQ(bm.match_prefix(*c), 16);
  // The same tokens at other positions are another prefix: nothing.
  auto d = make_seq(4);
  d->prompt = tokens(40, 116);  // what a holds from position 16 on
  EXPECT_EQ(bm.match_prefix(*d), 0);
  // A prompt that is exactly two cached blocks keeps its last token to compute (it samples).
  auto e = make_seq(5);
  e->prompt = tokens(32);
  EXPECT_EQ(bm.match_prefix(*e), 16);
  bm.check_invariants({a.get(), b.get(), c.get(), d.get(), e.get()});
}

TEST(PrefixCache, FreedCachedBlocksAreTakenLastAndForgottenThen) {
  fs::BlockManager bm(6, 4, 0.0, true);
  auto a = computed(bm, 1, tokens(9));  // 2 full blocks + 1
  const std::vector<int32_t> a_blocks = a->block_table;
  bm.release(*a);
  EXPECT_EQ(bm.num_free(), 6);
  EXPECT_EQ(bm.num_cached_free(), 2);
  bm.check_invariants({});
  // Found again after its owner is gone.
  auto b = make_seq(2);
  b->prompt = tokens(12);
  EXPECT_EQ(bm.match_prefix(*b), 8);
  EXPECT_EQ(b->block_table, std::vector<int32_t>(a_blocks.begin(), a_blocks.begin() + 2));
  bm.release(*b);
  // New content takes the never-cached blocks first (4 of them), then the cached ones, the one
  // freed longest ago first: after 5 blocks, the first block of the prefix is forgotten, and with
  // it everything after it (its key names the first block's old epoch).
  auto c = make_seq(3);
  c->prompt = tokens(20, 5000);
  bm.grow(*c, 16);
  auto probe = make_seq(4);
  probe->prompt = tokens(12);
  EXPECT_EQ(bm.match_prefix(*probe), 8);  // all 4 never-cached blocks used: the prefix is intact
  bm.release(*probe);
  bm.grow(*c, 20);  // a fifth block: the LRU one
  probe = make_seq(5);
  probe->prompt = tokens(12);
  EXPECT_EQ(bm.match_prefix(*probe), 0);
  bm.check_invariants({c.get(), probe.get()});
}

TEST(PrefixCache, OffByDefaultAndUnmatchedAdmissionGivesTheBlocksBack) {
  fs::BlockManager off(10, 4);
  auto a = computed(off, 1, tokens(9));
  auto b = make_seq(2);
  b->prompt = tokens(9);
  EXPECT_EQ(off.match_prefix(*b), 0);
  EXPECT_EQ(off.num_cached_free(), 0);
  fs::BlockManager bm(10, 4, 0.0, true);
  auto x = computed(bm, 1, tokens(9));
  bm.release(*x);
  auto y = make_seq(2);
  y->prompt = tokens(9);
  EXPECT_EQ(bm.match_prefix(*y), 8);
  EXPECT_EQ(bm.num_cached_free(), 0);  // taken from the LRU pool
  bm.release(*y);                      // not admitted after all
  EXPECT_EQ(bm.num_cached_free(), 2);
  bm.check_invariants({});
}

// Random sequences of grow / compute / release / match over a small pool and a few shared
// prompts, against an independent record of each cached block's content: every match must name
// blocks whose tokens are the sequence's own, and the invariants must hold throughout.
TEST(PrefixCache, RandomOperationsMatchOnlyTheirOwnTokens) {
  std::mt19937 rng(4242);
  fs::BlockManager bm(12, 4, 0.0, true);
  // Prompts that agree on some blocks and differ in others, so that blocks are freed, forgotten
  // and reused under keys that name reused parents.
  std::vector<std::vector<int32_t>> prompts;
  for (int v = 0; v < 6; ++v) {
    std::vector<int32_t> t = tokens(24);
    if (v & 1) t[5] = 1;
    if (v & 2) t[13] = 2;
    if (v & 4) t[18] = 3;
    prompts.push_back(t);
  }
  std::map<int32_t, std::vector<int32_t>> content;  // block -> the prefix its KV was computed for
  std::vector<std::unique_ptr<fs::Sequence>> live;
  int64_t next = 1, hits = 0;
  for (int op = 0; op < 30000; ++op) {
    const int kind = static_cast<int>(rng() % 3);
    if (kind == 0 || live.empty()) {
      auto s = make_seq(next++);
      s->prompt = prompts[rng() % prompts.size()];
      s->prompt.resize(5 + rng() % 20);
      const int64_t hit = bm.match_prefix(*s);
      hits += hit > 0;
      for (int64_t i = 0; i < hit / 4; ++i)
        ASSERT_EQ(content.at(s->block_table[i]),
                  std::vector<int32_t>(s->prompt.begin(), s->prompt.begin() + (i + 1) * 4))
            << "op " << op;
      if (!bm.can_grow(*s, s->num_tokens())) {
        bm.release(*s);
        continue;
      }
      const int64_t from = s->num_computed;
      bm.grow(*s, s->num_tokens());
      // The forward pass writes the new tokens' slots. A block's K and V depend on every token
      // before it too (attention), so each full block is recorded with the whole prefix it ends;
      // a partly written one holds nothing a match may name.
      for (int64_t i = from / 4; i < static_cast<int64_t>(s->block_table.size()); ++i)
        content[s->block_table[i]] =
            (i + 1) * 4 <= s->num_tokens()
                ? std::vector<int32_t>(s->prompt.begin(), s->prompt.begin() + (i + 1) * 4)
                : std::vector<int32_t>{};
      s->num_computed = s->num_tokens();
      bm.remember_computed(*s, from, s->num_computed);
      live.push_back(std::move(s));
    } else {
      const size_t i = rng() % live.size();
      bm.release(*live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    std::vector<const fs::Sequence*> view;
    for (const auto& s : live) view.push_back(s.get());
    bm.check_invariants(view);
  }
  EXPECT_GT(hits, 3000);
}

}  // namespace
