// The CUDA path's plan (src/attention/cuda/plan.h) on the H200's figures, without a GPU: how a
// step's sequences are grouped into a decode launch and a prefill launch, the splits each group
// gets (those of the group launched alone), the ranges and partial rows, and the workspace; the
// kernel family (FLASHSERVE_KERNEL's request, the sm90 rules) and the tile of each launch.
#include "attention/cuda/plan.h"

#include <gtest/gtest.h>

#include "attention/sm80/tile_config.h"
#include "attention/sm90/tile_config.h"
#include "flashserve/error.h"
#include "support/plan_step.h"

#include <algorithm>
#include <climits>
#include <random>
#include <utility>
#include <vector>

namespace flashserve::testing {
namespace {

using attention::HostLengths;
using attention::LaunchPlan;
using attention::make_plan;
using attention::Plan;
using attention::PlanContext;
using attention::Problem;
using attention::SeqGroup;

constexpr attention::SplitDevice kH200 = kPlanH200;

// A varlen, causal, 32/8-head d128 step with these (q_len, kv_len) sequences.
using StepShape = PlanStep;

// A 0/1 environment switch's parser (common/env_switch.h through plan.h): unset or empty gives the
// default, "1" and "0" on and off, and anything else throws kInvalidArgument naming `variable`.
void expect_strict_switch(bool (*parse)(const char*), bool by_default, const char* variable) {
  EXPECT_EQ(parse(nullptr), by_default) << variable;
  EXPECT_EQ(parse(""), by_default) << variable;
  EXPECT_TRUE(parse("1")) << variable;
  EXPECT_FALSE(parse("0")) << variable;
  for (const char* bad : {"true", "yes", "on", "2", " 1", "1 ", "01", "auto"}) {
    try {
      parse(bad);
      ADD_FAILURE() << variable << "=\"" << bad << "\" accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << bad;
      EXPECT_EQ(e.argument(), variable) << bad;
      EXPECT_NE(std::string(e.what()).find("must be 0 or 1"), std::string::npos) << e.what();
    }
  }
}

StepShape step(const std::vector<std::pair<int64_t, int64_t>>& seqs, int32_t num_splits = 0) {
  return plan_step(seqs, 128, num_splits);
}

Plan plan_of(const StepShape& s) {
  return make_plan(s.pr, s.ctx, s.lens);
}

std::vector<std::pair<int64_t, int64_t>> decodes(int n, int64_t kv) {
  return std::vector<std::pair<int64_t, int64_t>>(n, {1, kv});
}

TEST(Plan, DecodeOnlyStepIsOneDecodeLaunchWithItsSplits) {
  const Plan p = plan_of(step(decodes(64, 2048)));
  ASSERT_EQ(p.launches.size(), 1u);
  const LaunchPlan& l = p.launches[0];
  EXPECT_TRUE(l.kernel.decode);
  EXPECT_FALSE(l.kernel.masked);  // one bottom-right query sees every key
  EXPECT_TRUE(l.kernel.paged);
  EXPECT_EQ(l.group, SeqGroup::kAll);
  EXPECT_EQ(l.kernel.splits, 2);  // as split_policy gives 64 x 2k decodes alone
  EXPECT_EQ(l.seq_begin, 0);
  EXPECT_EQ(l.seq_end, 64);
  EXPECT_EQ(l.rows, 64);
  EXPECT_EQ(p.workspace_bytes, attention::partial_bytes(2, 64, 32, 128));
}

TEST(Plan, MixedStepGetsADecodeLaunchAndAPrefillLaunchEachSplitAsAlone) {
  // 1 chunk of 512 over 4k cached, then 64 decodes over 2k: the Sarathi step of issue 15.
  auto seqs = decodes(64, 2048);
  seqs.insert(seqs.begin(), {512, 4096 + 512});
  const Plan mixed = plan_of(step(seqs));
  ASSERT_EQ(mixed.launches.size(), 2u);
  const Plan chunk_alone = plan_of(step({{512, 4096 + 512}}));
  const Plan decodes_alone = plan_of(step(decodes(64, 2048)));
  const LaunchPlan& d = mixed.launches[0];
  const LaunchPlan& c = mixed.launches[1];
  EXPECT_TRUE(d.kernel.decode);
  EXPECT_EQ(d.group, SeqGroup::kAll);  // decodes are contiguous: nothing to skip
  EXPECT_EQ(d.seq_begin, 1);
  EXPECT_EQ(d.seq_end, 65);
  EXPECT_EQ(d.rows, 64);  // partials by sequence
  EXPECT_EQ(d.max_kv_len, 2048);
  EXPECT_EQ(d.kernel.splits, decodes_alone.launches[0].kernel.splits);
  EXPECT_FALSE(c.kernel.decode);
  EXPECT_TRUE(c.kernel.masked);
  EXPECT_EQ(c.seq_begin, 0);
  EXPECT_EQ(c.seq_end, 1);
  EXPECT_EQ(c.row_begin, 0);
  EXPECT_EQ(c.rows, 512);
  EXPECT_EQ(c.max_q_len, 512);
  EXPECT_EQ(c.kernel.splits, chunk_alone.launches[0].kernel.splits);
  EXPECT_GT(c.kernel.splits, 1);  // 128 tiles do not fill 132 SMs twice
  // Each launch's partials have their own, aligned part of the workspace.
  EXPECT_EQ(d.workspace_offset, 0u);
  EXPECT_GE(c.workspace_offset, attention::partial_bytes(d.kernel.splits, 64, 32, 128));
  EXPECT_EQ(c.workspace_offset % 256, 0u);
  EXPECT_GE(mixed.workspace_bytes,
            c.workspace_offset + attention::partial_bytes(c.kernel.splits, 512, 32, 128));
}

TEST(Plan, InterleavedKindsSkipTheOtherKindInTheirRange) {
  // decode, chunk, decode, empty, chunk: both ranges hold the other kind.
  const Plan p = plan_of(step({{1, 300}, {40, 90}, {1, 5000}, {0, 7}, {17, 17}}));
  ASSERT_EQ(p.launches.size(), 2u);
  EXPECT_EQ(p.launches[0].group, SeqGroup::kDecodes);
  EXPECT_EQ(p.launches[0].seq_begin, 0);
  EXPECT_EQ(p.launches[0].seq_end, 3);
  EXPECT_EQ(p.launches[0].max_kv_len, 5000);
  EXPECT_EQ(p.launches[1].group, SeqGroup::kPrefills);
  EXPECT_EQ(p.launches[1].seq_begin, 1);
  EXPECT_EQ(p.launches[1].seq_end, 5);
  EXPECT_EQ(p.launches[1].row_begin, 1);
  EXPECT_EQ(p.launches[1].rows, 40 + 1 + 0 + 17);
  EXPECT_EQ(p.launches[1].max_q_len, 40);
  // An empty sequence between two of one kind does not make the range mixed.
  const Plan q = plan_of(step({{40, 90}, {1, 300}, {0, 7}, {1, 70}}));
  ASSERT_EQ(q.launches.size(), 2u);
  EXPECT_EQ(q.launches[0].group, SeqGroup::kAll);
  EXPECT_EQ(q.launches[0].seq_begin, 1);
  EXPECT_EQ(q.launches[0].seq_end, 4);
}

TEST(Plan, LeftWindowKeepsDecodesOnDecodeTiles) {
  // Mistral's sliding window: a decode's heads share its one query, so the window bounds them
  // alike and the decode launch takes them (per-row prefill tiles would read 16x the rows).
  StepShape w = step({{1, 300}, {40, 90}});
  w.pr.mask.left = 50;
  const Plan p = plan_of(w);
  ASSERT_EQ(p.launches.size(), 2u);
  EXPECT_TRUE(p.launches[0].kernel.decode);
  EXPECT_FALSE(p.launches[1].kernel.decode);
  EXPECT_TRUE(p.launches[1].kernel.masked);
  StepShape d = step({{1, 9000}, {1, 3000}});
  d.pr.mask.left = 4095;
  const Plan only = plan_of(d);
  ASSERT_EQ(only.launches.size(), 1u);
  EXPECT_TRUE(only.launches[0].kernel.decode);
  EXPECT_EQ(only.launches[0].group, SeqGroup::kAll);
}

TEST(Plan, OnlyChunksIsOnePrefillLaunch) {
  const Plan chunks = plan_of(step({{512, 1536}, {512, 2560}, {512, 4608}, {512, 8704}}));
  ASSERT_EQ(chunks.launches.size(), 1u);
  EXPECT_FALSE(chunks.launches[0].kernel.decode);
  EXPECT_EQ(chunks.launches[0].max_kv_len, 8704);
}

TEST(Plan, UnknownLengthsSplitTheBatchByKindOnTheDevice) {
  // attention_forward's plan: only max_seqlen_q/k. A varlen batch with longer queries may hold
  // decodes: both launches over the whole batch, the decode one split as if all were decodes
  // (its partials take one row per sequence, not the rows of q).
  StepShape s = step({{512, 4608}, {1, 2048}, {1, 2048}});
  const Plan p = make_plan(s.pr, s.ctx, HostLengths{});
  ASSERT_EQ(p.launches.size(), 2u);
  EXPECT_EQ(p.launches[0].group, SeqGroup::kDecodes);
  EXPECT_GT(p.launches[0].kernel.splits, 1);
  EXPECT_EQ(p.launches[0].rows, 3);
  EXPECT_EQ(p.launches[1].group, SeqGroup::kPrefills);
  EXPECT_EQ(p.launches[1].rows, s.ctx.q_rows);
  for (const LaunchPlan& l : p.launches) {
    EXPECT_EQ(l.seq_begin, 0);
    EXPECT_EQ(l.seq_end, 3);
  }
  // Decodes only (max_seqlen_q 1): one decode launch, split as before.
  StepShape d = step(decodes(8, 32768));
  const Plan dp = make_plan(d.pr, d.ctx, HostLengths{});
  ASSERT_EQ(dp.launches.size(), 1u);
  EXPECT_TRUE(dp.launches[0].kernel.decode);
  EXPECT_GT(dp.launches[0].kernel.splits, 1);
  // No workspace: no automatic splits (attention_forward without one).
  d.ctx.workspace_available = false;
  EXPECT_EQ(make_plan(d.pr, d.ctx, HostLengths{}).launches[0].kernel.splits, 1);
  EXPECT_EQ(make_plan(d.pr, d.ctx, HostLengths{}).workspace_bytes, 0u);
}

TEST(Plan, ExplicitSplitsApplyToEveryLaunch) {
  auto seqs = decodes(3, 900);
  seqs.push_back({33, 900});
  const Plan p = plan_of(step(seqs, 5));
  ASSERT_EQ(p.launches.size(), 2u);
  for (const LaunchPlan& l : p.launches) EXPECT_EQ(l.kernel.splits, 5);
}

TEST(Plan, RandomBatchesCoverEverySequenceOnceWithinLimits) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 1 + int(rng() % 40);
    std::vector<std::pair<int64_t, int64_t>> seqs;
    for (int i = 0; i < n; ++i) {
      const int kind = int(rng() % 3);
      const int64_t q = kind == 0 ? 1 : kind == 1 ? 0 : 2 + int64_t(rng() % 700);
      seqs.push_back({q, q + int64_t(rng() % 9000)});
    }
    const StepShape s = step(seqs, trial % 7 == 0 ? 3 : 0);
    const Plan p = plan_of(s);
    ASSERT_LE(p.launches.size(), 2u);
    std::vector<int> taken(n, 0);
    size_t end = 0;
    for (const LaunchPlan& l : p.launches) {
      EXPECT_GE(l.kernel.splits, 1);
      EXPECT_LE(l.kernel.splits, 128);
      if (l.kernel.decode) {
        EXPECT_EQ(l.rows, l.seq_end - l.seq_begin);  // partials by sequence
      } else {
        EXPECT_EQ(l.row_begin, s.lens.q_start[l.seq_begin]);
        EXPECT_EQ(l.rows, s.lens.q_start[l.seq_end] - l.row_begin);
      }
      EXPECT_GE(l.workspace_offset, end);
      end = l.workspace_offset +
            attention::partial_bytes(l.kernel.splits, l.rows, s.pr.h_q, s.pr.head_dim);
      for (int64_t b = l.seq_begin; b < l.seq_end; ++b) {
        const int64_t q = seqs[b].first;
        const bool takes = l.group == SeqGroup::kAll || (l.group == SeqGroup::kDecodes) == (q <= 1);
        if (takes && q > 0) {
          ++taken[b];
          if (l.kernel.decode) EXPECT_EQ(q, 1);
          EXPECT_LE(q, l.max_q_len);
          EXPECT_LE(seqs[b].second, l.max_kv_len);
        }
      }
    }
    EXPECT_LE(end, p.workspace_bytes);
    for (int b = 0; b < n; ++b)
      EXPECT_EQ(taken[b], seqs[b].first > 0 ? 1 : 0) << "sequence " << b << " of trial " << trial;
  }
}

// A plan for replay (AttentionLengths::for_replay, the CUDA runner's mixed-step graphs): the
// kernels, tiles, splits and ranges of the step's own plan (the same replay key), each launch's
// grid and partials widened to the bounds; and for other steps of the same key, every sequence
// inside a widened launch's grid and partial rows.
TEST(Plan, WidenedPlanKeepsItsLaunchesAndCoversEveryStepOfItsKey) {
  std::mt19937 rng(9);
  int pairs = 0, sm90_launches = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + int(rng() % 12);
    std::vector<std::pair<int64_t, int64_t>> seqs;
    for (int i = 0; i < n; ++i) {
      const bool decode = rng() % 2;
      const int64_t q = decode ? 1 : 2 + int64_t(rng() % 300);
      seqs.push_back({q, q + int64_t(rng() % 3000)});
    }
    // Decodes alone split for the bound when widened (the next test).
    if (std::all_of(seqs.begin(), seqs.end(), [](const auto& s) { return s.first == 1; })) continue;
    int64_t rows = 0;
    for (auto [q, kv] : seqs) rows += q;
    const int64_t q_bound = rows + int64_t(rng() % 64), kv_bound = 3400;
    auto widened = [&](const std::vector<std::pair<int64_t, int64_t>>& v, bool widen) {
      StepShape s = step(v);
      s.pr.max_q_len = q_bound;
      s.pr.max_kv_len = kv_bound;
      s.ctx.q_rows = q_bound;
      s.ctx.sm90_unavailable = trial % 2 ? "" : "no sm90";
      s.lens.widen = widen;
      return std::pair{s, plan_of(s)};
    };
    const auto [ws, w] = widened(seqs, true);
    const auto [os, own] = widened(seqs, false);
    ASSERT_EQ(w.launches.size(), own.launches.size());
    EXPECT_EQ(attention::replay_key(w), attention::replay_key(own));
    size_t end = 0;
    for (size_t i = 0; i < w.launches.size(); ++i) {
      const LaunchPlan &l = w.launches[i], &o = own.launches[i];
      EXPECT_EQ(l.kernel.splits, o.kernel.splits);
      EXPECT_EQ(l.kernel.family, o.kernel.family);
      EXPECT_EQ(l.kernel.block_n, o.kernel.block_n);
      EXPECT_EQ(l.seq_begin, o.seq_begin);
      EXPECT_EQ(l.seq_end, o.seq_end);
      EXPECT_EQ(l.group, o.group);
      const bool sm90 = l.kernel.family == attention::KernelFamily::kSm90;
      sm90_launches += sm90;
      if (sm90 && attention::sm90::short_keys(o.max_kv_len))
        EXPECT_EQ(l.max_kv_len, attention::sm90::kShortKeys);  // stays on the short-key tile
      else
        EXPECT_EQ(l.max_kv_len, kv_bound);
      if (l.kernel.decode) {
        EXPECT_EQ(l.rows, l.seq_end - l.seq_begin);
      } else {
        EXPECT_EQ(l.max_q_len, q_bound);
        EXPECT_EQ(l.row_begin, 0);
        EXPECT_EQ(l.rows, q_bound);
      }
      EXPECT_GE(l.workspace_offset, end);
      end = l.workspace_offset + (l.kernel.tile_counter
                                      ? sizeof(int32_t)
                                      : attention::partial_bytes(l.kernel.splits, l.rows, 32, 128));
    }
    EXPECT_LE(end, w.workspace_bytes);
    // Another step of the same kinds in the same order, other lengths within the bounds.
    std::vector<std::pair<int64_t, int64_t>> other;
    int64_t other_rows = 0;
    for (auto [q, kv] : seqs) {
      const int64_t q2 = q == 1 ? 1 : 2 + int64_t(rng() % 300);
      other.push_back({q2, q2 + int64_t(rng() % 3000)});
      other_rows += q2;
    }
    if (other_rows > q_bound) continue;
    const auto [os2, own2] = widened(other, false);
    if (attention::replay_key(own2) != attention::replay_key(w)) continue;
    ++pairs;
    for (const LaunchPlan& l : w.launches)
      for (int64_t b = l.seq_begin; b < l.seq_end; ++b) {
        const auto [q, kv] = other[b];
        const bool takes = l.group == SeqGroup::kAll || (l.group == SeqGroup::kDecodes) == (q <= 1);
        if (!takes) continue;
        EXPECT_LE(q, l.max_q_len);
        EXPECT_LE(kv, l.max_kv_len) << attention::replay_key(w);
        const int64_t row0 = os2.lens.q_start[b];
        if (!l.kernel.decode) {
          EXPECT_GE(row0, l.row_begin);
          EXPECT_LE(row0 + q, l.row_begin + l.rows);
        }
      }
  }
  EXPECT_GT(pairs, 20);
  EXPECT_GT(sm90_launches, 0);
}

// A widened plan of decodes alone (the CUDA runner's decode graphs) splits for the bound as a plan
// without lengths does, whatever the step's own longest; by length where its lengths are unequal
// (DecodeBalance::kUnequal, the default), and then with the same replay key for every unequal step
// of the bound, which a step of equal lengths does not share.
TEST(Plan, WidenedDecodesSplitForTheBoundAndByLengthWhereUnequal) {
  constexpr int64_t kBound = 16384;
  auto widened = [](const std::vector<std::pair<int64_t, int64_t>>& v, bool widen) {
    StepShape s = step(v);
    s.pr.max_kv_len = kBound;
    s.lens.widen = widen;
    return plan_of(s);
  };
  StepShape unknown = step(decodes(64, 1500));
  unknown.pr.max_kv_len = kBound;
  unknown.lens = HostLengths{};
  const Plan bound = plan_of(unknown);
  ASSERT_EQ(bound.launches.size(), 1u);
  const Plan equal = widened(decodes(64, 1500), true);
  ASSERT_EQ(equal.launches.size(), 1u);
  EXPECT_EQ(equal.launches[0].kernel.splits, bound.launches[0].kernel.splits);
  EXPECT_EQ(equal.launches[0].kernel.split_min_blocks, 0);
  EXPECT_EQ(attention::replay_key(equal), attention::replay_key(bound));
  // Not widened, the step's own 1500 keys choose fewer splits than the bound's 16384.
  EXPECT_LT(widened(decodes(64, 1500), false).launches[0].kernel.splits,
            bound.launches[0].kernel.splits);
  std::vector<std::pair<int64_t, int64_t>> skewed = decodes(63, 1024), other = decodes(63, 700);
  skewed.push_back({1, 16384});
  other.push_back({1, 9000});
  const Plan a = widened(skewed, true), b = widened(other, true);
  EXPECT_GT(a.launches[0].kernel.split_min_blocks, 0);
  EXPECT_EQ(attention::replay_key(a), attention::replay_key(b));
  EXPECT_NE(attention::replay_key(a), attention::replay_key(equal));
  // The items: one more than the bound's even split a sequence.
  EXPECT_EQ(a.launches[0].kernel.splits, bound.launches[0].kernel.splits + 1);
}

// A dense call on a device where the sm90 kernel can run (the dispatch's sm90_unavailable ""):
// batch x seqlen x heads at head dim d.
StepShape dense(int64_t batch, int64_t len, int64_t heads, int64_t d, bool causal) {
  StepShape s;
  s.pr.batch = batch;
  s.pr.h_q = s.pr.h_kv = heads;
  s.pr.head_dim = s.pr.head_dim_v = d;
  s.pr.max_q_len = s.pr.max_kv_len = len;
  if (causal) s.pr.mask.right = 0;
  s.pr.num_splits = 0;
  s.ctx.device = kH200;
  s.ctx.q_rows = batch * len;
  s.ctx.sm90_unavailable = "";
  return s;
}

// The family of every launch of the plan (with unknown lengths: a varlen batch gets a decode and
// a prefill launch), which must agree.
attention::KernelFamily family_of(const StepShape& s) {
  const Plan p = make_plan(s.pr, s.ctx, HostLengths{});
  EXPECT_FALSE(p.launches.empty());
  for (const LaunchPlan& l : p.launches)
    EXPECT_EQ(l.kernel.family, p.launches[0].kernel.family) << p.summary();
  return p.launches.empty() ? attention::KernelFamily::kSm80 : p.launches[0].kernel.family;
}

// The default family: sm90 for prefill-sized calls (a full 128-row tile, >= 512 keys), dense,
// varlen, paged or windowed, unless the sm80 plan packs them as decodes or splits keys that
// sm90's unsplit tiles would leave most SMs without; sm80 elsewhere, and wherever the sm90 kernel
// cannot run.
TEST(PlanFamily, AutoTakesSm90WhereMeasuredFaster) {
  using attention::KernelFamily;
  EXPECT_EQ(family_of(dense(4, 512, 16, 128, true)), KernelFamily::kSm90);
  EXPECT_EQ(family_of(dense(1, 2048, 32, 64, false)), KernelFamily::kSm90);
  EXPECT_EQ(family_of(dense(2, 2048, 8, 256, true)), KernelFamily::kSm90);
  EXPECT_EQ(family_of(dense(4, 256, 16, 128, true)), KernelFamily::kSm80);  // short keys
  EXPECT_EQ(family_of(dense(4, 64, 16, 128, false)), KernelFamily::kSm80);  // no full tile
  StepShape split = dense(1, 32768, 8, 128, false);  // 8 tiles: sm80 splits, sm90 would idle
  split.pr.max_q_len = 128;
  split.ctx.q_rows = 128;
  EXPECT_EQ(family_of(split), KernelFamily::kSm80);
  StepShape chunk = dense(1, 4096, 32, 128, true);  // 128 tiles: sm80 splits, sm90 fills the SMs
  chunk.pr.max_q_len = 512;
  chunk.ctx.q_rows = 512;
  EXPECT_GT(attention::choose_kernel(chunk.pr, kH200, false, 1, 512, 4096, true).splits, 1);
  EXPECT_EQ(family_of(chunk), KernelFamily::kSm90);
  StepShape chunk64 = dense(1, 4096, 32, 64, true);  // 96 tiles of 192 rows: 73% of the SMs
  chunk64.pr.max_q_len = 512;
  chunk64.ctx.q_rows = 512;
  EXPECT_GT(attention::choose_kernel(chunk64.pr, kH200, false, 1, 512, 4096, true).splits, 1);
  EXPECT_EQ(family_of(chunk64), KernelFamily::kSm90);
  StepShape window = dense(1, 1024, 8, 128, true);
  window.pr.mask.left = 256;
  EXPECT_EQ(family_of(window), KernelFamily::kSm80);  // 64 tiles: sm80 splits, sm90 would idle
  window = dense(2, 1024, 8, 128, true);              // 128 tiles
  window.pr.mask.left = 256;
  EXPECT_EQ(family_of(window), KernelFamily::kSm90);
  StepShape paged = dense(4, 512, 16, 128, true);
  paged.pr.paged = true;
  paged.pr.page_size = 256;
  EXPECT_EQ(family_of(paged), KernelFamily::kSm90);
  paged.pr.page_size = 16;  // pages shorter than a key block: still faster
  EXPECT_EQ(family_of(paged), KernelFamily::kSm90);
  StepShape paged64 = dense(4, 2048, 32, 64, true);
  paged64.pr.paged = true;
  paged64.pr.page_size = 16;  // at d64 too, with cp.async (session 14)
  EXPECT_EQ(family_of(paged64), KernelFamily::kSm90);
  paged64.pr.page_size = 256;
  EXPECT_EQ(family_of(paged64), KernelFamily::kSm90);
  StepShape unavailable = dense(4, 512, 16, 128, true);
  unavailable.ctx.sm90_unavailable = "needs a compute capability 9.0 device, this one is 8.0";
  EXPECT_EQ(family_of(unavailable), KernelFamily::kSm80);
  StepShape forced80 = dense(4, 512, 16, 128, true);
  forced80.ctx.family = attention::FamilyRequest::kSm80;
  EXPECT_EQ(family_of(forced80), KernelFamily::kSm80);
  // A varlen batch of unknown lengths gets a decode launch (sm80) and a prefill launch (sm90).
  StepShape varlen = dense(4, 512, 16, 128, true);
  varlen.pr.varlen_q = varlen.pr.varlen_k = true;
  const Plan p = make_plan(varlen.pr, varlen.ctx, HostLengths{});
  ASSERT_EQ(p.launches.size(), 2u);
  EXPECT_TRUE(p.launches[0].kernel.decode);
  EXPECT_EQ(p.launches[0].kernel.family, KernelFamily::kSm80);
  EXPECT_EQ(p.launches[1].kernel.family, KernelFamily::kSm90);
}

// FLASHSERVE_KERNEL=sm90 runs what the kernel can (varlen and windows too, short calls too) and
// refuses the rest naming the variable and what is missing. (Paged K/V too, on pages of a multiple
// of 8 keys.)
TEST(PlanFamily, ForcedSm90RunsWhatItCanAndRefusesTheRestByName) {
  using attention::KernelFamily;
  auto forced = [](StepShape s) {
    s.ctx.family = attention::FamilyRequest::kSm90;
    return s;
  };
  StepShape window = forced(dense(1, 300, 2, 64, false));
  window.pr.mask.left = 40;
  window.pr.mask.right = 17;
  EXPECT_EQ(family_of(window), KernelFamily::kSm90);
  EXPECT_EQ(family_of(forced(dense(1, 17, 2, 256, true))), KernelFamily::kSm90);
  auto refusal = [](const StepShape& s) {
    try {
      make_plan(s.pr, s.ctx, HostLengths{});
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
      EXPECT_EQ(e.argument(), "FLASHSERVE_KERNEL");
      return std::string(e.what());
    }
    ADD_FAILURE() << "no refusal";
    return std::string();
  };
  StepShape paged = forced(dense(2, 64, 4, 128, false));
  paged.pr.paged = true;
  paged.pr.page_size = 16;
  EXPECT_EQ(family_of(paged), KernelFamily::kSm90);
  paged.pr.page_size = 12;
  EXPECT_NE(refusal(paged).find("page size 12"), std::string::npos);
  StepShape split = forced(dense(1, 1000, 2, 128, false));
  split.pr.num_splits = 3;
  EXPECT_NE(refusal(split).find("split-KV"), std::string::npos);
  StepShape unavailable = forced(dense(1, 1000, 2, 128, false));
  unavailable.ctx.sm90_unavailable = "this build has no sm90 kernels";
  EXPECT_NE(refusal(unavailable).find("no sm90 kernels"), std::string::npos);
  // Nothing to compute is no refusal.
  StepShape empty = forced(dense(0, 64, 4, 128, false));
  empty.pr.paged = true;
  EXPECT_TRUE(make_plan(empty.pr, empty.ctx, HostLengths{}).launches.empty());
}

// Score modifiers (softcap, ALiBi) run on the sm80 kernels only: the default plan keeps such a
// call on sm80 where it would take sm90 without them, on the masked prefill tiles (the only
// prefill tiles with modifier kernels) even without a mask, or on the decode tiles; a forced
// sm90 refuses them by the argument's name, before anything else it lacks.
TEST(PlanFamily, ScoreModifiersPlanSm80AndForcedSm90RefusesThemByName) {
  using attention::KernelFamily;
  static const float slopes[16] = {};  // only the pointer's presence matters to the plan
  auto capped = [](StepShape s) {
    s.pr.score_mod.softcap = 30.0f;
    return s;
  };
  auto alibi = [](StepShape s) {
    s.pr.score_mod.alibi = slopes;
    s.pr.score_mod.alibi_head_stride = 1;
    return s;
  };
  for (const StepShape& plain : {dense(4, 512, 16, 128, true), dense(1, 2048, 32, 64, false),
                                 dense(2, 2048, 8, 256, true)}) {
    ASSERT_EQ(family_of(plain), KernelFamily::kSm90);
    for (const StepShape& s : {capped(plain), alibi(plain)}) {
      const Plan p = make_plan(s.pr, s.ctx, HostLengths{});
      ASSERT_EQ(p.launches.size(), 1u);
      EXPECT_EQ(p.launches[0].kernel.family, KernelFamily::kSm80) << p.summary();
      EXPECT_TRUE(p.launches[0].kernel.masked) << p.summary();
      // The tile is the masked one (what the launcher instantiates for modifiers).
      const attention::sm80::Tiles t = attention::sm80::fwd_tiles(int(s.pr.head_dim), true);
      EXPECT_EQ(p.launches[0].kernel.block_m, t.block_m);
      EXPECT_EQ(p.launches[0].kernel.block_n, t.block_n);
    }
  }
  // Decodes keep their packed decode tiles; a mixed step keeps its groups, both on sm80.
  auto seqs = decodes(64, 2048);
  seqs.insert(seqs.begin(), {512, 4096 + 512});
  StepShape mixed = capped(step(seqs));
  mixed.ctx.sm90_unavailable = "";
  const Plan p = plan_of(mixed);
  ASSERT_EQ(p.launches.size(), 2u);
  EXPECT_TRUE(p.launches[0].kernel.decode);
  EXPECT_FALSE(p.launches[0].kernel.masked);
  EXPECT_FALSE(p.launches[1].kernel.decode);
  EXPECT_TRUE(p.launches[1].kernel.masked);
  for (const LaunchPlan& l : p.launches) EXPECT_EQ(l.kernel.family, KernelFamily::kSm80);

  auto forced = [](StepShape s) {
    s.ctx.family = attention::FamilyRequest::kSm90;
    return s;
  };
  auto refused_by = [](const StepShape& s) {
    try {
      make_plan(s.pr, s.ctx, HostLengths{});
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
      return e.argument();
    }
    ADD_FAILURE() << "no refusal";
    return std::string();
  };
  EXPECT_EQ(refused_by(forced(capped(dense(4, 512, 16, 128, true)))), "softcap");
  EXPECT_EQ(refused_by(forced(alibi(dense(4, 512, 16, 128, true)))), "alibi_slopes");
  EXPECT_EQ(refused_by(forced(capped(step(decodes(8, 300))))), "softcap");
  StepShape unavailable = forced(alibi(dense(1, 1000, 2, 128, false)));
  unavailable.ctx.sm90_unavailable = "this build has no sm90 kernels";
  EXPECT_EQ(refused_by(unavailable), "alibi_slopes");
  // A forced sm80 runs them.
  StepShape sm80 = capped(dense(4, 512, 16, 128, true));
  sm80.ctx.family = attention::FamilyRequest::kSm80;
  EXPECT_EQ(family_of(sm80), KernelFamily::kSm80);
}

// A mixed step (chunks over a paged cache beside decodes) forced to sm90: the plan's grouping
// stays, each launch runs the sm90 kernel over its own range, unsplit, with its own tile counter
// (causal); by default the decodes stay on sm80 and the chunk (512 rows x 32 heads: 128 tiles)
// takes sm90.
TEST(PlanFamily, MixedStepsKeepTheirGroupsOnEitherFamily) {
  using attention::KernelFamily;
  auto seqs = decodes(64, 2048);
  seqs.insert(seqs.begin(), {512, 4096 + 512});
  StepShape s = step(seqs);
  s.ctx.sm90_unavailable = "";
  const Plan by_default = plan_of(s);
  ASSERT_EQ(by_default.launches.size(), 2u);
  for (const LaunchPlan& l : by_default.launches)
    EXPECT_EQ(l.kernel.family, l.kernel.decode ? KernelFamily::kSm80 : KernelFamily::kSm90);
  s.ctx.family = attention::FamilyRequest::kSm90;
  const Plan forced = plan_of(s);
  ASSERT_EQ(forced.launches.size(), 2u);
  size_t offset_seen = 0;
  for (size_t i = 0; i < forced.launches.size(); ++i) {
    const LaunchPlan& l = forced.launches[i];
    const LaunchPlan& same = by_default.launches[i];
    EXPECT_EQ(l.kernel.family, KernelFamily::kSm90);
    EXPECT_EQ(l.kernel.splits, 1);
    EXPECT_TRUE(l.kernel.tile_counter);  // causal
    EXPECT_TRUE(l.kernel.paged);
    EXPECT_EQ(l.group, same.group);
    EXPECT_EQ(l.seq_begin, same.seq_begin);
    EXPECT_EQ(l.seq_end, same.seq_end);
    EXPECT_EQ(l.max_q_len, same.max_q_len);
    EXPECT_EQ(l.max_kv_len, same.max_kv_len);
    if (i > 0) EXPECT_GT(l.workspace_offset, offset_seen);  // a counter each
    offset_seen = l.workspace_offset;
  }
  EXPECT_EQ(forced.launches[1].kernel.block_n, 128);  // d128 causal
  EXPECT_EQ(forced.workspace_bytes, 512u);            // two 256-byte aligned counters
}

// attention_forward without a workspace: a causal sm90 prefill keeps its tile counter (the run
// allocates the plan's bytes stream-ordered), so its CTAs stay persistent; a non-causal one needs
// none, and the decodes still do not split.
TEST(PlanFamily, CausalSm90TakesItsTileCounterWithoutAWorkspace) {
  for (bool causal : {true, false}) {
    StepShape s = dense(8, 512, 16, 64, causal);
    s.ctx.sm90_unavailable = "";
    s.ctx.workspace_available = false;
    const Plan p = plan_of(s);
    ASSERT_EQ(p.launches.size(), 1u);
    EXPECT_EQ(p.launches[0].kernel.family, attention::KernelFamily::kSm90) << p.summary();
    EXPECT_EQ(p.launches[0].kernel.tile_counter, causal) << p.summary();
    EXPECT_EQ(p.workspace_bytes, causal ? 256u : 0u);
  }
  StepShape d = step(decodes(8, 32768));
  d.ctx.workspace_available = false;
  EXPECT_EQ(plan_of(d).launches[0].kernel.splits, 1);
}

// Each launch names the tile it runs, from the family's tile configuration: sm80's prefill and
// decode tiles; sm90's per head dim and mask, the short-key tile up to 1024 keys.
TEST(PlanFamily, LaunchesCarryTheTileTheKernelRuns) {
  auto tile = [](const StepShape& s) {
    const Plan p = make_plan(s.pr, s.ctx, HostLengths{});
    EXPECT_EQ(p.launches.size(), 1u);
    return p.launches.empty()
               ? std::pair{0, 0}
               : std::pair{p.launches[0].kernel.block_m, p.launches[0].kernel.block_n};
  };
  auto sm80 = [](StepShape s) {
    s.ctx.family = attention::FamilyRequest::kSm80;
    return s;
  };
  auto sm90 = [](StepShape s) {
    s.ctx.family = attention::FamilyRequest::kSm90;
    return s;
  };
  using P = std::pair<int, int>;
  EXPECT_EQ(tile(sm80(dense(4, 2048, 16, 64, false))), P(128, 128));
  EXPECT_EQ(tile(sm80(dense(4, 2048, 16, 128, true))), P(128, 64));
  EXPECT_EQ(tile(sm80(dense(4, 2048, 16, 256, false))), P(64, 64));
  StepShape decode = sm80(dense(64, 1, 32, 128, false));
  decode.pr.h_kv = 8;
  decode.pr.max_kv_len = 2048;
  EXPECT_EQ(tile(decode), P(16, 64));
  EXPECT_EQ(tile(sm90(dense(4, 2048, 16, 128, false))), P(128, 176));
  EXPECT_EQ(tile(sm90(dense(4, 1024, 16, 128, false))), P(128, 128));  // short keys
  EXPECT_EQ(tile(sm90(dense(4, 2048, 16, 128, true))), P(128, 128));
  EXPECT_EQ(tile(sm90(dense(4, 2048, 16, 64, true))), P(192, 128));
  EXPECT_EQ(tile(sm90(dense(4, 1024, 16, 64, true))), P(128, 128));  // short keys, causal
  EXPECT_EQ(tile(sm90(dense(4, 2048, 16, 256, false))), P(128, 80));
}

// FLASHSERVE_SM90_EPILOGUE (session 18's tile boundary, sm90/tile_config.h OverlappedEpilogue):
// read strictly, on by default; its value reaches every sm90 launch of the plan and its replay key
// (so that CUDA graphs of the two never stand in for each other), and no sm80 launch.
TEST(PlanFamily, Sm90EpilogueSwitchReachesTheSm90LaunchesOnly) {
  expect_strict_switch(attention::parse_sm90_epilogue, attention::kSm90EpilogueByDefault,
                       "FLASHSERVE_SM90_EPILOGUE");
  EXPECT_TRUE(PlanContext{}.sm90_epilogue == attention::kSm90EpilogueByDefault);
  for (bool causal : {false, true}) {
    StepShape s = dense(4, 512, 16, 128, causal);
    s.ctx.family = attention::FamilyRequest::kSm90;
    s.ctx.sm90_epilogue = true;
    const Plan on = make_plan(s.pr, s.ctx, HostLengths{});
    s.ctx.sm90_epilogue = false;
    const Plan off = make_plan(s.pr, s.ctx, HostLengths{});
    ASSERT_EQ(on.launches.size(), 1u);
    ASSERT_EQ(off.launches.size(), 1u);
    EXPECT_TRUE(on.launches[0].kernel.epilogue) << on.summary();
    EXPECT_FALSE(off.launches[0].kernel.epilogue) << off.summary();
    EXPECT_NE(attention::replay_key(on), attention::replay_key(off));
    s.ctx.family = attention::FamilyRequest::kSm80;
    s.ctx.sm90_epilogue = true;
    const Plan sm80 = make_plan(s.pr, s.ctx, HostLengths{});
    for (const LaunchPlan& l : sm80.launches) EXPECT_FALSE(l.kernel.epilogue) << sm80.summary();
  }
  // A mixed step: the decodes stay on sm80 without it, the chunk on sm90 with it.
  StepShape m = step({{1, 4096}, {512, 4096}, {1, 2048}});
  m.ctx.sm90_unavailable = "";
  m.ctx.sm90_epilogue = true;  // whatever the default (kSm90EpilogueByDefault)
  const Plan mixed = plan_of(m);
  for (const LaunchPlan& l : mixed.launches)
    EXPECT_EQ(l.kernel.epilogue, l.kernel.family == attention::KernelFamily::kSm90)
        << mixed.summary();
}

// FLASHSERVE_DECODE_CLUSTER (split decode tiles merged in a thread-block cluster, sm80/
// cluster_combine.h): read strictly, off by default. With it on and a device with clusters, a
// decode launch split 2-16 ways takes it, keeps no partials in the workspace (so it splits
// without one too) and says so in its summary and replay key; nothing else does (one split, more
// than 16, prefill launches, padded head dims, score modifiers, no clusters, the switch off).
TEST(PlanFamily, DecodeClusterSwitchReachesSplitDecodeLaunchesOnly) {
  expect_strict_switch(attention::parse_decode_cluster, attention::kDecodeClusterByDefault,
                       "FLASHSERVE_DECODE_CLUSTER");
  EXPECT_FALSE(attention::kDecodeClusterByDefault);  // unmeasured on a GPU
  EXPECT_FALSE(PlanContext{}.clusters);              // the dispatch says where there are
  auto with = [](StepShape s, bool cluster, bool clusters) {
    s.ctx.decode_cluster = cluster;
    s.ctx.clusters = clusters;
    return plan_of(s);
  };
  // Batch 1 over 1k keys: 16 splits, one key block each (the short-keys rule).
  const StepShape one = step(decodes(1, 1024));
  const Plan on = with(one, true, true);
  ASSERT_EQ(on.launches.size(), 1u);
  EXPECT_EQ(on.launches[0].kernel.splits, 16);
  EXPECT_TRUE(on.launches[0].kernel.cluster_combine) << on.summary();
  EXPECT_EQ(on.workspace_bytes, 0u);
  EXPECT_NE(on.summary().find("cluster combine"), std::string::npos) << on.summary();
  const Plan off = with(one, false, true);
  EXPECT_FALSE(off.launches[0].kernel.cluster_combine);
  EXPECT_EQ(off.workspace_bytes, attention::partial_bytes(16, 1, 32, 128));
  EXPECT_NE(attention::replay_key(on), attention::replay_key(off));
  EXPECT_FALSE(with(one, true, false).launches[0].kernel.cluster_combine);  // no clusters
  // Without a workspace (attention_forward without one) the cluster still splits: it keeps no
  // partials; the combine kernel's splits need one.
  StepShape bare = one;
  bare.ctx.workspace_available = false;
  EXPECT_EQ(with(bare, false, true).launches[0].kernel.splits, 1);
  const Plan bare_on = with(bare, true, true);
  EXPECT_EQ(bare_on.launches[0].kernel.splits, 16);
  EXPECT_TRUE(bare_on.launches[0].kernel.cluster_combine) << bare_on.summary();
  EXPECT_EQ(bare_on.workspace_bytes, 0u);
  // A decode graph's bound of 2k keys: 32 automatic splits, brought down to the cluster's 16.
  const StepShape bound = step(decodes(1, 2048));
  EXPECT_EQ(with(bound, false, true).launches[0].kernel.splits, 32);
  const Plan clamped = with(bound, true, true);
  EXPECT_EQ(clamped.launches[0].kernel.splits, 16);
  EXPECT_TRUE(clamped.launches[0].kernel.cluster_combine) << clamped.summary();
  // Forced splits: 2 and 16 take it, 17 (past the cluster's 16 CTAs) and 1 do not.
  for (int32_t splits : {2, 16, 17, 1}) {
    const Plan f = with(step(decodes(3, 4096), splits), true, true);
    ASSERT_EQ(f.launches.size(), 1u);
    EXPECT_EQ(f.launches[0].kernel.cluster_combine, splits >= 2 && splits <= 16) << f.summary();
  }
  // A mixed step: the decodes take it, the chunk does not (its partials stay in the workspace).
  StepShape m = step({{1, 1024}, {512, 4096}}, 3);
  const Plan mixed = with(m, true, true);
  ASSERT_EQ(mixed.launches.size(), 2u);
  size_t partials = 0;
  for (const LaunchPlan& l : mixed.launches) {
    EXPECT_EQ(l.kernel.cluster_combine, l.kernel.decode) << mixed.summary();
    if (!l.kernel.decode) partials = attention::partial_bytes(3, l.rows, 32, 128);
  }
  EXPECT_GE(mixed.workspace_bytes, partials);
  EXPECT_LT(mixed.workspace_bytes, partials + 1024);  // nothing for the decodes but alignment
  // Padded head dims and score modifiers have no cluster kernel.
  StepShape padded = plan_step(decodes(1, 1024), 96);
  EXPECT_FALSE(with(padded, true, true).launches[0].kernel.cluster_combine);
  StepShape capped = one;
  capped.pr.score_mod.softcap = 30.0f;
  EXPECT_FALSE(with(capped, true, true).launches[0].kernel.cluster_combine);
}

// FLASHSERVE_DECODE_BALANCE (decode splits by length, kernel/split_items.h): read strictly; unset,
// where the host lengths are unequal (the next test); "1" always, "0" never. Always, an sm80
// decode launch of two or more sequences with automatic splits and a
// workspace holds one more item a sequence than the even split's count, shares of at least the
// split choice's floor, with the partials sized for the items; its summary and replay key say so.
// Batch 1, forced splits, no workspace, the fp8 KV cache's register tiles, a cluster's merge and
// prefill launches keep the even split.
TEST(PlanFamily, DecodeBalanceSwitchReachesAutomaticDecodeSplitsOnly) {
  using attention::DecodeBalance;
  expect_strict_switch(
      [](const char* v) { return attention::parse_decode_balance(v) == DecodeBalance::kAlways; },
      false, "FLASHSERVE_DECODE_BALANCE");
  EXPECT_EQ(attention::parse_decode_balance(nullptr), DecodeBalance::kUnequal);
  EXPECT_EQ(attention::parse_decode_balance(""), DecodeBalance::kUnequal);
  EXPECT_EQ(attention::parse_decode_balance("0"), DecodeBalance::kOff);
  EXPECT_EQ(attention::kDecodeBalanceByDefault, DecodeBalance::kUnequal);
  EXPECT_EQ(PlanContext{}.decode_balance, attention::kDecodeBalanceByDefault);
  auto with = [](StepShape s, bool balance) {
    s.ctx.decode_balance = balance ? DecodeBalance::kAlways : DecodeBalance::kOff;
    return plan_of(s);
  };
  // 64 x 2k: the even split's 2, so 3 items a sequence in shares of >= 16 blocks (1024 keys).
  const StepShape even = step(decodes(64, 2048));
  const Plan on = with(even, true), off = with(even, false);
  ASSERT_EQ(on.launches.size(), 1u);
  EXPECT_EQ(off.launches[0].kernel.splits, 2);
  EXPECT_EQ(off.launches[0].kernel.split_min_blocks, 0);
  EXPECT_EQ(on.launches[0].kernel.splits, 3);
  EXPECT_EQ(on.launches[0].kernel.split_min_blocks, 16);
  // The partials of 3 items a sequence, then the item map (256-byte aligned each).
  const auto aligned = [](size_t n) { return (n + 255) / 256 * 256; };
  EXPECT_EQ(on.workspace_bytes, aligned(attention::partial_bytes(3, 64, 32, 128)) +
                                    aligned(attention::split_map_bytes(64, 3)));
  EXPECT_NE(on.summary().find("by length (shares of >= 16 blocks)"), std::string::npos)
      << on.summary();
  EXPECT_NE(attention::replay_key(on), attention::replay_key(off));
  // 128 x 2k runs unsplit evenly (enough tiles): by length it still gets 2 items a sequence, so
  // that a long sequence's keys spread over the launch.
  const Plan many = with(step(decodes(128, 2048)), true);
  EXPECT_EQ(many.launches[0].kernel.splits, 2);
  EXPECT_EQ(many.launches[0].kernel.split_min_blocks, 16);
  // Short keys (1k, 64 decodes): unsplit evenly, shares of >= 1 block by length.
  const Plan short_keys = with(step(decodes(64, 1024)), true);
  EXPECT_EQ(short_keys.launches[0].kernel.splits, 2);
  EXPECT_EQ(short_keys.launches[0].kernel.split_min_blocks, 1);
  // Batch 1 has nothing to balance; forced splits and a missing workspace are the caller's.
  EXPECT_EQ(with(step(decodes(1, 2048)), true).launches[0].kernel.split_min_blocks, 0);
  EXPECT_EQ(with(step(decodes(64, 2048), 5), true).launches[0].kernel.splits, 5);
  EXPECT_EQ(with(step(decodes(64, 2048), 5), true).launches[0].kernel.split_min_blocks, 0);
  StepShape bare = even;
  bare.ctx.workspace_available = false;
  EXPECT_EQ(with(bare, true).launches[0].kernel.splits, 1);
  EXPECT_EQ(with(bare, true).launches[0].kernel.split_min_blocks, 0);
  // The cluster's merge keeps its sequence's splits adjacent: no balance with it.
  StepShape cluster = even;
  cluster.ctx.decode_cluster = cluster.ctx.clusters = true;
  const Plan merged = with(cluster, true);
  EXPECT_TRUE(merged.launches[0].kernel.cluster_combine);
  EXPECT_EQ(merged.launches[0].kernel.split_min_blocks, 0);
  // A mixed step: the decodes by length, the chunk as before.
  const Plan mixed = with(step({{1, 1024}, {512, 4096}, {1, 3000}}), true);
  ASSERT_EQ(mixed.launches.size(), 2u);
  for (const LaunchPlan& l : mixed.launches)
    EXPECT_EQ(l.kernel.split_min_blocks > 0, l.kernel.decode) << mixed.summary();
}

// By default (DecodeBalance::kUnequal) a decode launch splits by length where its decodes' key
// blocks (64-key blocks here) have a longest of at least 1.5x their mean (split_policy.h
// decodes_unequal), counted under the window and over the launch's decodes only; equal lengths
// and plans without host lengths (a decode graph's, for its bound) split evenly.
TEST(PlanFamily, DecodeBalanceByDefaultFollowsTheHostLengths) {
  const auto by_length = [](const StepShape& s) {
    const Plan p = plan_of(s);
    for (const LaunchPlan& l : p.launches)
      if (l.kernel.decode) return l.kernel.split_min_blocks > 0;
    ADD_FAILURE() << "no decode launch: " << p.summary();
    return false;
  };
  EXPECT_FALSE(by_length(step(decodes(64, 2048))));
  // 4 decodes of 16, 16, 16 and x blocks: by length from x = 29 (29 >= 1.5 x 77 / 4 = 28.9), not
  // at 28 (28 < 1.5 x 76 / 4 = 28.5).
  EXPECT_TRUE(by_length(step({{1, 1024}, {1, 1024}, {1, 1024}, {1, 29 * 64}})));
  EXPECT_FALSE(by_length(step({{1, 1024}, {1, 1024}, {1, 1024}, {1, 28 * 64}})));
  // Two sequences: by length once the longer has 3x the shorter's blocks (2 x 48 x 2 >= 3 x 64).
  EXPECT_TRUE(by_length(step({{1, 1024}, {1, 48 * 64}})));
  EXPECT_FALSE(by_length(step({{1, 1024}, {1, 47 * 64}})));
  // Exponential-like: one long decode among short ones.
  std::vector<std::pair<int64_t, int64_t>> skewed = decodes(15, 1024);
  skewed.push_back({1, 16384});
  EXPECT_TRUE(by_length(step(skewed)));
  // The same lengths without the host lengths (a plan for the bound): even.
  StepShape bound = step(skewed);
  bound.lens = HostLengths{};
  EXPECT_FALSE(by_length(bound));
  // A 3072-key window: 3 x 2048 keys and one of 16384 are 32, 32, 32 and 48 blocks (48 < 1.5 x
  // 144 / 4 = 54): even; without the window 256 blocks (256 >= 1.5 x 352 / 4 = 132): by length.
  StepShape windowed = step({{1, 2048}, {1, 2048}, {1, 2048}, {1, 16384}});
  EXPECT_TRUE(by_length(windowed));
  windowed.pr.mask.left = 3071;
  EXPECT_FALSE(by_length(windowed));
  // A mixed step: the decodes' lengths alone decide (the chunk's 4096 keys are not a decode's).
  EXPECT_TRUE(by_length(step({{1, 1024}, {512, 4096}, {1, 16384}, {1, 1024}})));
  EXPECT_FALSE(by_length(step({{1, 1024}, {512, 65536}, {1, 1024}, {1, 1024}})));
}

// FLASHSERVE_SM90_EXP2_FMA (part of the softmax's exponentials on the FMA pipe, sm90/tile_config.h
// Exp2Fma): read strictly, off by default; it reaches the sm90 launches at d64 and their replay
// key, and no other: d128 and d256 (GEMM-bound, no Exp2Fma tiles) and sm80 plan as without it,
// replay key included (their CUDA graphs stay valid across the switch).
TEST(PlanFamily, Sm90Exp2FmaSwitchReachesTheD64Sm90LaunchesOnly) {
  expect_strict_switch(attention::parse_sm90_exp2_fma, attention::kSm90Exp2FmaByDefault,
                       "FLASHSERVE_SM90_EXP2_FMA");
  EXPECT_TRUE(PlanContext{}.sm90_exp2_fma == attention::kSm90Exp2FmaByDefault);
  const auto on_and_off = [](StepShape s) {
    s.ctx.sm90_exp2_fma = true;
    Plan on = plan_of(s);
    s.ctx.sm90_exp2_fma = false;
    return std::pair{on, plan_of(s)};
  };
  for (int64_t d : {64, 128, 256})
    for (bool causal : {false, true})
      for (int64_t len : {512, 4096}) {  // ShortTile and DefaultTile
        StepShape s = dense(2, len, 16, d, causal);
        s.ctx.family = attention::FamilyRequest::kSm90;
        const auto [on, off] = on_and_off(s);
        ASSERT_EQ(on.launches.size(), 1u);
        ASSERT_EQ(off.launches.size(), 1u);
        EXPECT_EQ(on.launches[0].kernel.exp2_fma, d == 64) << on.summary();
        EXPECT_FALSE(off.launches[0].kernel.exp2_fma) << off.summary();
        EXPECT_EQ(attention::replay_key(on) != attention::replay_key(off), d == 64)
            << attention::replay_key(on);
        s.ctx.family = attention::FamilyRequest::kSm80;
        const auto [sm80_on, sm80_off] = on_and_off(s);
        for (const LaunchPlan& l : sm80_on.launches)
          EXPECT_FALSE(l.kernel.exp2_fma) << sm80_on.summary();
        EXPECT_EQ(attention::replay_key(sm80_on), attention::replay_key(sm80_off));
      }
  // A mixed d64 step: the decodes stay on sm80 without it, the chunk on sm90 with it.
  StepShape m = step({{1, 4096}, {512, 4096}, {1, 2048}});
  m.pr.head_dim = m.pr.head_dim_v = 64;
  m.ctx.sm90_unavailable = "";
  m.ctx.sm90_exp2_fma = true;  // whatever the default (kSm90Exp2FmaByDefault)
  const Plan mixed = plan_of(m);
  int sm90_launches = 0;
  for (const LaunchPlan& l : mixed.launches) {
    const bool sm90 = l.kernel.family == attention::KernelFamily::kSm90;
    sm90_launches += sm90;
    EXPECT_EQ(l.kernel.exp2_fma, sm90) << mixed.summary();
  }
  EXPECT_GT(sm90_launches, 0) << mixed.summary();
}

// FLASHSERVE_KERNEL / FLASHSERVE_BWD_KERNEL's values.
TEST(PlanFamily, ParsesTheFamilyVariables) {
  using attention::FamilyRequest;
  using attention::parse_family_request;
  EXPECT_EQ(parse_family_request(nullptr, "FLASHSERVE_BWD_KERNEL"), FamilyRequest::kAuto);
  EXPECT_EQ(parse_family_request("", "FLASHSERVE_BWD_KERNEL"), FamilyRequest::kAuto);
  EXPECT_EQ(parse_family_request("auto", "FLASHSERVE_BWD_KERNEL"), FamilyRequest::kAuto);
  EXPECT_EQ(parse_family_request("sm80", "FLASHSERVE_BWD_KERNEL"), FamilyRequest::kSm80);
  EXPECT_EQ(parse_family_request("sm90", "FLASHSERVE_KERNEL"), FamilyRequest::kSm90);
  try {
    parse_family_request("hopper", "FLASHSERVE_BWD_KERNEL");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_EQ(e.argument(), "FLASHSERVE_BWD_KERNEL");
  }
}

// The backward's one decision (backward_cuda.cu): auto takes the sm90 kernel (once
// kSm90BackwardByDefault) wherever it can run the call (head dims 64 and 128, no modifiers, not
// deterministic, a 9.0 device of a 90a build), else sm80; sm80 forced is sm80 whatever sm90 lacks;
// sm90 forced refuses what it lacks by the variable's name.
TEST(PlanFamily, BackwardTakesSm90WhereItCanAndDeterministicStaysOnSm80) {
  using attention::choose_backward_family;
  using attention::FamilyRequest;
  using attention::KernelFamily;
  using attention::sm90_backward_lacks;
  Problem pr = dense(2, 2048, 16, 128, true).pr;
  const std::string here = "";  // a 9.0 device, a build with 90a, strides TMA takes
  const std::string a100 = "needs a compute capability 9.0 device, this one is 8.0";
  EXPECT_EQ(sm90_backward_lacks(pr, false, here, false), "");
  const KernelFamily by_default =
      attention::kSm90BackwardByDefault ? KernelFamily::kSm90 : KernelFamily::kSm80;
  EXPECT_EQ(choose_backward_family(pr, false, FamilyRequest::kAuto, here, false), by_default);
  EXPECT_EQ(choose_backward_family(pr, false, FamilyRequest::kSm80, here, false),
            KernelFamily::kSm80);
  EXPECT_EQ(choose_backward_family(pr, false, FamilyRequest::kAuto, a100, false),
            KernelFamily::kSm80);
  // deterministic: sm80's fixed-order dq kernel.
  EXPECT_NE(sm90_backward_lacks(pr, true, here, false).find("deterministic"), std::string::npos);
  EXPECT_EQ(choose_backward_family(pr, true, FamilyRequest::kAuto, here, false),
            KernelFamily::kSm80);
  EXPECT_EQ(choose_backward_family(pr, true, FamilyRequest::kSm80, here, false),
            KernelFamily::kSm80);
  Problem d64 = dense(2, 2048, 16, 64, false).pr;
  EXPECT_EQ(choose_backward_family(d64, false, FamilyRequest::kAuto, here, false), by_default);
  Problem d256 = dense(2, 2048, 16, 256, false).pr;
  EXPECT_NE(sm90_backward_lacks(d256, false, here, false).find("head_dim 256"), std::string::npos);
  EXPECT_EQ(choose_backward_family(d256, false, FamilyRequest::kAuto, here, false),
            KernelFamily::kSm80);
  auto forced_refusal = [&](const Problem& p, bool deterministic, const std::string& unavailable) {
    try {
      choose_backward_family(p, deterministic, FamilyRequest::kSm90, unavailable, false);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
      EXPECT_EQ(e.argument(), "FLASHSERVE_BWD_KERNEL") << e.what();
    }
  };
  forced_refusal(pr, true, here);
  forced_refusal(d256, false, here);
  forced_refusal(pr, false, a100);
  EXPECT_EQ(choose_backward_family(pr, false, FamilyRequest::kSm90, here, false),
            KernelFamily::kSm90);
}

// FLASHSERVE_SM90_BWD_D256 (sm90/bwd_swapped_kernel.h): with the switch on, head dim 256 (and
// 136-248, padded) takes the sm90 backward as 64 and 128 do (auto and forced), deterministic
// still sm80; off, they stay on sm80 and a forced sm90 refuses them naming the switch; the padded
// head dims below 128 stay on sm80 either way; 64 and 128 do not depend on it.
TEST(PlanFamily, BackwardD256TakesSm90OnlyWithItsSwitch) {
  using attention::choose_backward_family;
  using attention::FamilyRequest;
  using attention::KernelFamily;
  using attention::sm90_backward_lacks;
  const std::string here = "";
  const KernelFamily by_default =
      attention::kSm90BackwardByDefault ? KernelFamily::kSm90 : KernelFamily::kSm80;
  for (bool causal : {false, true}) {
    Problem d256 = dense(2, 2048, 16, 256, causal).pr;
    EXPECT_EQ(sm90_backward_lacks(d256, false, here, true), "");
    EXPECT_EQ(choose_backward_family(d256, false, FamilyRequest::kAuto, here, true), by_default);
    EXPECT_EQ(choose_backward_family(d256, false, FamilyRequest::kSm90, here, true),
              KernelFamily::kSm90);
    EXPECT_EQ(choose_backward_family(d256, false, FamilyRequest::kSm80, here, true),
              KernelFamily::kSm80);
    EXPECT_NE(sm90_backward_lacks(d256, true, here, true).find("deterministic"), std::string::npos);
    EXPECT_EQ(choose_backward_family(d256, true, FamilyRequest::kAuto, here, true),
              KernelFamily::kSm80);
    const std::string off = sm90_backward_lacks(d256, false, here, false);
    EXPECT_NE(off.find("FLASHSERVE_SM90_BWD_D256"), std::string::npos) << off;
    EXPECT_EQ(choose_backward_family(d256, false, FamilyRequest::kAuto, here, false),
              KernelFamily::kSm80);
    try {
      choose_backward_family(d256, false, FamilyRequest::kSm90, here, false);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("FLASHSERVE_SM90_BWD_D256"), std::string::npos)
          << e.what();
    }
    // Not the device: the switch does not make sm90 run elsewhere.
    EXPECT_EQ(choose_backward_family(d256, false, FamilyRequest::kAuto, "not 9.0", true),
              KernelFamily::kSm80);
  }
  // 136-248 run the d256 kernel padded, with the switch; the padded dims below 128 stay sm80.
  for (int64_t d : {136, 192, 248}) {
    Problem p = dense(2, 2048, 16, d, false).pr;
    EXPECT_EQ(sm90_backward_lacks(p, false, here, true), "") << d;
    EXPECT_EQ(choose_backward_family(p, false, FamilyRequest::kAuto, here, true), by_default) << d;
    EXPECT_NE(sm90_backward_lacks(p, false, here, false).find("FLASHSERVE_SM90_BWD_D256"),
              std::string::npos)
        << d;
    EXPECT_EQ(choose_backward_family(p, false, FamilyRequest::kAuto, here, false),
              KernelFamily::kSm80)
        << d;
  }
  for (int64_t d : {40, 96, 120}) {
    Problem p = dense(2, 2048, 16, d, false).pr;
    EXPECT_NE(sm90_backward_lacks(p, false, here, true).find("head_dim"), std::string::npos) << d;
    EXPECT_EQ(choose_backward_family(p, false, FamilyRequest::kAuto, here, true),
              KernelFamily::kSm80)
        << d;
  }
  for (int64_t d : {64, 128}) {
    Problem p = dense(2, 2048, 16, d, true).pr;
    for (bool on : {false, true})
      EXPECT_EQ(choose_backward_family(p, false, FamilyRequest::kAuto, here, on), by_default) << d;
  }
}

// ---------------------------------------------------------------------------------------------
// The sm90 float8_e4m3fn forward (issue 23): FLASHSERVE_FP8_ATTENTION's values, the refusal while
// it is off (saying how to turn it on), the one launch it plans and its workspace (V^T after the
// tile counter), and the refusals by name of what it lacks.

// A dense all-e4m3 call on a device where the sm90 kernel runs.
StepShape fp8_call(int64_t batch, int64_t q_len, int64_t kv_len, int64_t h_q, int64_t h_kv,
                   int64_t d, bool causal) {
  StepShape s;
  s.pr.batch = batch;
  s.pr.h_q = h_q;
  s.pr.h_kv = h_kv;
  s.pr.head_dim = s.pr.head_dim_v = d;
  s.pr.max_q_len = q_len;
  s.pr.max_kv_len = kv_len;
  if (causal) s.pr.mask.right = 0;
  s.pr.dtype = s.pr.kv_dtype = DType::kFloat8E4M3;
  s.pr.out_dtype = DType::kBFloat16;
  s.ctx.device = kH200;
  s.ctx.q_rows = batch * q_len;
  s.ctx.sm90_unavailable = "";
  s.ctx.fp8_attention = true;
  return s;
}

// make_plan's error for s: {kind, argument, message}; kind kPlanned when it plans.
constexpr ErrorKind kPlanned = static_cast<ErrorKind>(0);
struct Refusal {
  ErrorKind kind = kPlanned;
  std::string argument, what;
};
Refusal refusal_of(const StepShape& s) {
  try {
    plan_of(s);
  } catch (const Error& e) {
    return {e.kind(), e.argument(), e.what()};
  }
  return {};
}

template <typename F>
StepShape with(StepShape s, F f) {
  f(s);
  return s;
}

// FLASHSERVE_SM90_EXP2_FMA reaches the fp8 tiles (their Exp2Fma variant, fwd_fp8_exp2_fma.cu) at
// every fp8 head dim, causal or not, both d128 key blocks, and their replay key; the rest of the
// launch (tile, workspace, V^T) is the same with it and without.
TEST(PlanFp8, Exp2FmaSwitchReachesTheFp8Tiles) {
  for (int64_t d : {64, 128, 256})
    for (int block_n : {128, 192})
      for (bool causal : {false, true}) {
        StepShape s = fp8_call(2, 512, 4096, 8, 2, d, causal);
        s.ctx.fp8_block_n = block_n;
        const Plan off = plan_of(s);
        s.ctx.sm90_exp2_fma = true;
        const Plan on = plan_of(s);
        ASSERT_EQ(on.launches.size(), 1u);
        ASSERT_EQ(off.launches.size(), 1u);
        const LaunchPlan &a = on.launches[0], &b = off.launches[0];
        EXPECT_TRUE(a.kernel.fp8) << on.summary();
        EXPECT_TRUE(a.kernel.exp2_fma) << on.summary();
        EXPECT_FALSE(b.kernel.exp2_fma) << off.summary();
        EXPECT_NE(on.summary().find("exp2 on fma"), std::string::npos) << on.summary();
        EXPECT_NE(attention::replay_key(on), attention::replay_key(off));
        EXPECT_NE(attention::replay_key(on).find("sm90 fp8"), std::string::npos);
        EXPECT_NE(attention::replay_key(on).find("exp2-fma"), std::string::npos);
        EXPECT_EQ(a.kernel.block_m, b.kernel.block_m);
        EXPECT_EQ(a.kernel.block_n, b.kernel.block_n);
        EXPECT_EQ(a.kernel.block_n, d == 128 ? block_n : 128) << on.summary();
        EXPECT_EQ(a.kernel.masked, causal);
        EXPECT_EQ(a.vt_offset, b.vt_offset);
        EXPECT_EQ(on.workspace_bytes, off.workspace_bytes);
      }
}

TEST(PlanFp8, ParsesTheSwitchStrictly) {
  expect_strict_switch(attention::parse_fp8_attention, attention::kFp8AttentionByDefault,
                       "FLASHSERVE_FP8_ATTENTION");
}

TEST(PlanBackward, ParsesTheSm90DqBulkSwitchStrictly) {
  expect_strict_switch(attention::parse_sm90_bwd_dq_bulk, attention::kSm90BwdDqBulkByDefault,
                       "FLASHSERVE_SM90_BWD_DQ_BULK");
}

// FLASHSERVE_SM90_BWD_OVERLAP: the bulk-dQ kernel's step in FlashAttention-3's order, on by
// default at d128 only (measured there; d64 was not faster).
TEST(PlanBackward, ParsesTheSm90OverlapSwitchStrictly) {
  EXPECT_TRUE(attention::sm90_bwd_overlap_by_default(128));
  EXPECT_FALSE(attention::sm90_bwd_overlap_by_default(64));
  expect_strict_switch(
      +[](const char* v) { return attention::parse_sm90_bwd_overlap(v, 128); }, true,
      "FLASHSERVE_SM90_BWD_OVERLAP");
  expect_strict_switch(
      +[](const char* v) { return attention::parse_sm90_bwd_overlap(v, 64); }, false,
      "FLASHSERVE_SM90_BWD_OVERLAP");
}

// FLASHSERVE_SM90_BWD_HEAVY_FIRST: a masked call's key blocks heaviest first.
TEST(PlanBackward, ParsesTheSm90HeavyFirstSwitchStrictly) {
  expect_strict_switch(attention::parse_sm90_bwd_heavy_first,
                       attention::kSm90BwdHeavyFirstByDefault, "FLASHSERVE_SM90_BWD_HEAVY_FIRST");
}

// FLASHSERVE_SM90_BWD_PERSISTENT: the bulk-dQ kernel on a persistent grid, by default where it
// measured faster (session 41): every d64 call, d128 unmasked below 4096 keys and masked from 1024.
TEST(PlanBackward, ParsesTheSm90PersistentSwitchStrictly) {
  for (int64_t d : {32, 64}) {
    for (bool masked : {false, true})
      for (int64_t keys : {1, 512, 1024, 4096, 65536})
        EXPECT_TRUE(attention::sm90_bwd_persistent_by_default(d, masked, keys)) << d << keys;
  }
  for (int64_t d : {72, 128}) {
    EXPECT_TRUE(attention::sm90_bwd_persistent_by_default(d, false, 512));
    EXPECT_TRUE(attention::sm90_bwd_persistent_by_default(d, false, 4095));
    EXPECT_FALSE(attention::sm90_bwd_persistent_by_default(d, false, 4096));
    EXPECT_FALSE(attention::sm90_bwd_persistent_by_default(d, true, 512));
    EXPECT_FALSE(attention::sm90_bwd_persistent_by_default(d, true, 1023));
    EXPECT_TRUE(attention::sm90_bwd_persistent_by_default(d, true, 1024));
    EXPECT_TRUE(attention::sm90_bwd_persistent_by_default(d, true, 8192));
  }
  expect_strict_switch(
      +[](const char* v) { return attention::parse_sm90_bwd_persistent(v, 64, false, 8192); }, true,
      "FLASHSERVE_SM90_BWD_PERSISTENT");
  expect_strict_switch(
      +[](const char* v) { return attention::parse_sm90_bwd_persistent(v, 128, true, 512); }, false,
      "FLASHSERVE_SM90_BWD_PERSISTENT");
}

// FLASHSERVE_SM90_BWD_FUSED_DQ: the last CTA of each unit converts dQ, off until measured.
TEST(PlanBackward, ParsesTheSm90FusedDqSwitchStrictly) {
  EXPECT_FALSE(attention::kSm90BwdFusedDqByDefault);
  expect_strict_switch(attention::parse_sm90_bwd_fused_dq, attention::kSm90BwdFusedDqByDefault,
                       "FLASHSERVE_SM90_BWD_FUSED_DQ");
}

// FLASHSERVE_SM90_BWD_D256: head dim 256 on the sm90 backward, on since its device runs.
TEST(PlanBackward, ParsesTheSm90D256SwitchStrictly) {
  EXPECT_TRUE(attention::kSm90BwdD256ByDefault);
  expect_strict_switch(attention::parse_sm90_bwd_d256, attention::kSm90BwdD256ByDefault,
                       "FLASHSERVE_SM90_BWD_D256");
}

TEST(PlanFp8, KeyBlockSwitchTakes128Or192AndOnlyD128Takes192) {
  using attention::parse_fp8_block_n;
  EXPECT_EQ(parse_fp8_block_n(nullptr), 0);  // the plan's choice (next test)
  EXPECT_EQ(parse_fp8_block_n(""), 0);
  EXPECT_EQ(parse_fp8_block_n("128"), 128);
  EXPECT_EQ(parse_fp8_block_n("192"), 192);
  for (const char* bad : {"224", "64", "auto", "192 "}) {
    try {
      parse_fp8_block_n(bad);
      ADD_FAILURE() << "\"" << bad << "\" accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << bad;
      EXPECT_EQ(e.argument(), "FLASHSERVE_FP8_BLOCK_N") << bad;
    }
  }
  for (int64_t d : {64, 128, 256}) {
    StepShape s = fp8_call(2, 300, 1000, 8, 2, d, true);
    s.ctx.fp8_block_n = 192;
    const Plan p = plan_of(s);
    ASSERT_EQ(p.launches.size(), 1u);
    EXPECT_EQ(p.launches[0].kernel.block_n, d == 128 ? 192 : 128) << d;
    EXPECT_EQ(p.launches[0].kernel.block_m, d == 64 ? 192 : 128) << d;
    // V^T's workspace does not depend on the block: keys round up to 128 whatever it is.
    EXPECT_EQ(p.workspace_bytes, p.launches[0].vt_offset + attention::fp8_vt_bytes(s.pr));
  }
}

// Left to the plan (FLASHSERVE_FP8_BLOCK_N unset), d128 takes 192-key blocks from kFp8LongKeys
// keys in the call's longest sequence (causal: above them) and 128 below; d64 and d256 keep their
// one tile; a forced value wins at any length.
TEST(PlanFp8, D128TakesLongKeyBlocksFromFp8LongKeys) {
  const int64_t at = attention::sm90::kFp8LongKeys;
  for (int64_t d : {64, 128, 256})
    for (bool causal : {false, true})
      for (int64_t kv : {int64_t{512}, at - 1, at, at + 1, 2 * at, 4 * at}) {
        StepShape s = fp8_call(2, std::min<int64_t>(kv, 1000), kv, 8, 2, d, causal);
        const Plan p = plan_of(s);
        ASSERT_EQ(p.launches.size(), 1u);
        const bool long_keys = causal ? kv > at : kv >= at;
        EXPECT_EQ(p.launches[0].kernel.block_n, d == 128 && long_keys ? 192 : 128)
            << "d " << d << " kv " << kv << " causal " << causal << "\n"
            << p.summary();
        for (int forced : {128, 192}) {
          s.ctx.fp8_block_n = forced;
          EXPECT_EQ(plan_of(s).launches[0].kernel.block_n, d == 128 ? forced : 128)
              << "forced " << forced << " d " << d << " kv " << kv;
        }
      }
}

// FLASHSERVE_SM90_EPILOGUE reaches the fp8 tiles (O staged and stored by TMA) at every head dim
// and key block, except with FLASHSERVE_SM90_EXP2_FMA, whose tiles keep the register stores.
TEST(PlanFp8, EpilogueSwitchReachesTheFp8TilesButNotTheirExp2FmaVariant) {
  for (int64_t d : {64, 128, 256})
    for (int block_n : {128, 192})
      for (bool causal : {false, true}) {
        StepShape s = fp8_call(2, 512, 4096, 8, 2, d, causal);
        s.ctx.fp8_block_n = block_n;
        s.ctx.sm90_epilogue = true;
        const Plan on = plan_of(s);
        s.ctx.sm90_epilogue = false;
        const Plan off = plan_of(s);
        ASSERT_EQ(on.launches.size(), 1u);
        ASSERT_EQ(off.launches.size(), 1u);
        EXPECT_TRUE(on.launches[0].kernel.epilogue) << on.summary();
        EXPECT_FALSE(off.launches[0].kernel.epilogue) << off.summary();
        EXPECT_EQ(on.workspace_bytes, off.workspace_bytes);
        s.ctx.sm90_epilogue = true;
        s.ctx.sm90_exp2_fma = true;
        const Plan fma = plan_of(s);
        EXPECT_TRUE(fma.launches[0].kernel.exp2_fma) << fma.summary();
        EXPECT_FALSE(fma.launches[0].kernel.epilogue) << fma.summary();
      }
}

TEST(PlanFp8, OnByDefaultSinceItsDeviceRunAndTheRefusalWhenOffSaysHowToTurnItOn) {
  EXPECT_TRUE(attention::kFp8AttentionByDefault);
  StepShape s = fp8_call(2, 1000, 1000, 8, 2, 128, false);
  s.ctx.fp8_attention = false;
  const Refusal r = refusal_of(s);
  EXPECT_EQ(r.kind, ErrorKind::kUnsupported);
  EXPECT_EQ(r.argument, "q");
  EXPECT_NE(r.what.find("FLASHSERVE_FP8_ATTENTION=1"), std::string::npos) << r.what;
  // refuse_fp8_if_off (what the dispatch calls before it looks at the device) says the same,
  // and leaves every other call alone.
  try {
    attention::refuse_fp8_if_off(s.pr, false);
    ADD_FAILURE() << "no refusal";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), r.what);
  }
  attention::refuse_fp8_if_off(s.pr, true);
  StepShape bf16 = s;
  bf16.pr.dtype = bf16.pr.kv_dtype = bf16.pr.out_dtype = DType::kBFloat16;
  attention::refuse_fp8_if_off(bf16.pr, false);
  EXPECT_EQ(refusal_of(bf16).kind, kPlanned);  // a bf16 call never reads the switch
}

TEST(PlanFp8, OneSm90Fp8LaunchOverTheBatchWithVtInTheWorkspace) {
  for (int64_t d : {64, 128, 256})
    for (bool causal : {false, true})
      for (bool workspace : {true, false}) {
        StepShape s = fp8_call(3, 129, 1000, 32, 8, d, causal);
        s.ctx.workspace_available = workspace;
        const Plan p = plan_of(s);
        ASSERT_EQ(p.launches.size(), 1u);
        const LaunchPlan& l = p.launches[0];
        EXPECT_EQ(l.kernel.family, attention::KernelFamily::kSm90);
        EXPECT_TRUE(l.kernel.fp8);
        EXPECT_EQ(l.kernel.masked, causal);
        EXPECT_FALSE(l.kernel.decode);
        EXPECT_EQ(l.kernel.splits, 1);
        EXPECT_EQ(l.kernel.tile_counter, causal);  // with or without a workspace
        EXPECT_EQ(l.kernel.block_m, d == 64 ? 192 : 128);
        EXPECT_EQ(l.kernel.block_n, 128);
        EXPECT_EQ(l.group, SeqGroup::kAll);
        EXPECT_EQ(l.seq_begin, 0);
        EXPECT_EQ(l.seq_end, 3);
        EXPECT_EQ(l.max_q_len, 129);
        EXPECT_EQ(l.max_kv_len, 1000);
        // V^T: 3 sequences x 8 KV heads x d rows x 1024 keys (1000 rounded up to 128), after the
        // tile counter's 256 bytes when there is one; 256-byte aligned.
        const size_t vt = size_t{3} * 8 * d * 1024;
        EXPECT_EQ(attention::fp8_vt_bytes(s.pr), vt);
        EXPECT_EQ(l.vt_offset, l.kernel.tile_counter ? 256u : 0u);
        EXPECT_EQ(l.vt_offset % 256, 0u);
        EXPECT_EQ(p.workspace_bytes, l.vt_offset + vt);
        EXPECT_NE(p.summary().find("sm90 fp8"), std::string::npos) << p.summary();
      }
}

TEST(PlanFp8, VtSizesRoundEachSequenceUpToWholeBoxes) {
  StepShape s = fp8_call(1, 1, 1, 1, 1, 128, false);
  EXPECT_EQ(attention::fp8_vt_bytes(s.pr), 128u * 128u);  // one key still takes a box
  s.pr.max_kv_len = 128;
  EXPECT_EQ(attention::fp8_vt_bytes(s.pr), 128u * 128u);
  s.pr.max_kv_len = 129;
  EXPECT_EQ(attention::fp8_vt_bytes(s.pr), 2u * 128u * 128u);
  s.pr.max_kv_len = 0;
  EXPECT_EQ(attention::fp8_vt_bytes(s.pr), 0u);
  // Varlen: every sequence gets the longest one's slab (the kernel addresses V^T by sequence).
  StepShape v = fp8_call(4, 300, 5000, 16, 16, 256, true);
  v.pr.varlen_q = v.pr.varlen_k = true;
  EXPECT_EQ(attention::fp8_vt_bytes(v.pr), size_t{4} * 16 * 256 * 5120);
}

TEST(PlanFp8, DecodesAndMixedStepsStayInTheOneLaunch) {
  // Known lengths with decodes among the chunks: no decode launch (the fp8 path has no decode
  // tiles); the sm90 tile takes every sequence.
  StepShape s = step({{1, 300}, {200, 700}, {1, 50}});
  s.pr.paged = false;
  s.pr.dtype = s.pr.kv_dtype = DType::kFloat8E4M3;
  s.pr.out_dtype = DType::kBFloat16;
  s.ctx.sm90_unavailable = "";
  s.ctx.fp8_attention = true;
  const Plan p = plan_of(s);
  ASSERT_EQ(p.launches.size(), 1u);
  EXPECT_TRUE(p.launches[0].kernel.fp8);
  EXPECT_EQ(p.launches[0].group, SeqGroup::kAll);
  EXPECT_EQ(p.launches[0].seq_end, 3);
  EXPECT_EQ(p.launches[0].rows, s.ctx.q_rows);
  EXPECT_NE(attention::replay_key(p).find("sm90 fp8"), std::string::npos);
}

TEST(PlanFp8, RefusesWhatItLacksByName) {
  const auto expect = [](StepShape s, const char* argument, const char* what) {
    const Refusal r = refusal_of(s);
    EXPECT_EQ(r.kind, ErrorKind::kUnsupported) << argument;
    EXPECT_EQ(r.argument, argument) << r.what;
    EXPECT_NE(r.what.find(what), std::string::npos) << r.what;
  };
  const StepShape base = fp8_call(2, 256, 256, 8, 8, 128, true);
  ASSERT_EQ(refusal_of(base).kind, kPlanned);
  expect(with(base, [](StepShape& s) { s.pr.head_dim = s.pr.head_dim_v = 96; }), "q",
         "head_dim 96 (64, 128 and 256 only)");
  expect(with(base,
              [](StepShape& s) {
                s.pr.paged = true;
                s.pr.page_size = 16;
              }),
         "block_table", "paged K/V");
  expect(with(base, [](StepShape& s) { s.pr.num_splits = 2; }), "num_splits", "split-KV");
  expect(with(base, [](StepShape& s) { s.pr.score_mod.softcap = 30.0f; }), "softcap",
         "soft-capping");
  static const float slope = 0.5f;
  expect(with(base, [](StepShape& s) { s.pr.score_mod.alibi = &slope; }), "alibi_slopes", "ALiBi");
  // An sm80 device or a build without 90a: what sm90 lacks, named on q.
  expect(with(base,
              [](StepShape& s) {
                s.ctx.sm90_unavailable = "needs a compute capability 9.0 device, this one is 8.0";
              }),
         "q", "compute capability 9.0");
  // FLASHSERVE_KERNEL=sm80 has no fp8 kernel; sm90 and auto both plan it.
  expect(with(base, [](StepShape& s) { s.ctx.family = attention::FamilyRequest::kSm80; }),
         "FLASHSERVE_KERNEL", "no float8_e4m3fn forward");
  EXPECT_EQ(
      refusal_of(with(base, [](StepShape& s) { s.ctx.family = attention::FamilyRequest::kSm90; }))
          .kind,
      kPlanned);
  // Windows and varlen run (the sm90 machinery has them).
  EXPECT_EQ(refusal_of(with(base,
                            [](StepShape& s) {
                              s.pr.mask.left = 100;
                              s.pr.varlen_q = s.pr.varlen_k = true;
                            }))
                .kind,
            kPlanned);
}

// The fp8 P V product without a GPU: a warpgroup's 64 x 32 block of P laid out as the S
// accumulator (wgmma.h: thread lane of warp w holds rows 16 w + lane / 4 (+ 8), columns
// 8 g + 2 (lane % 4) + {0, 1}), packed into the A registers by fp8_p_element, read back through
// the 8-bit A fragment (CUTLASS's ALayout_64x32: row 16 w + lane / 4 + 8 v1, column
// 4 (lane % 4) + v0 + 16 v2 for register v1 + 2 v2, byte v0), against V^T whose column a holds
// key fp8_vt_key(a): every A element is a P element of its own row, and sum_a A B = P V exactly.
TEST(PlanFp8, PFragmentAndVtKeyOrderGiveTheSameSumOverTheKeys) {
  using attention::sm90::fp8_p_element;
  using attention::sm90::fp8_vt_key;
  std::vector<bool> seen(32, false);
  for (int a = 0; a < 32; ++a) {
    ASSERT_GE(fp8_vt_key(a), 0);
    ASSERT_LT(fp8_vt_key(a), 32);
    EXPECT_FALSE(seen[fp8_vt_key(a)]) << "fp8_vt_key is not a permutation at " << a;
    seen[fp8_vt_key(a)] = true;
  }
  std::mt19937 rng(23);
  std::uniform_int_distribution<int> small(-8, 8);
  constexpr int kN = 16;  // columns of V (any N: the permutation is over the keys)
  int P[64][32], V[32][kN], A[64][32];
  for (auto& row : P)
    for (int& x : row) x = small(rng);
  for (auto& row : V)
    for (int& x : row) x = small(rng);
  for (auto& row : A)
    for (int& x : row) x = INT32_MIN;
  for (int w = 0; w < 4; ++w)
    for (int lane = 0; lane < 32; ++lane) {
      const int q = lane % 4, r0 = 16 * w + lane / 4;
      int sc[16];  // the thread's accumulator elements of the 32-key step
      for (int g = 0; g < 4; ++g)
        for (int h = 0; h < 2; ++h)
          for (int e = 0; e < 2; ++e) sc[4 * g + 2 * h + e] = P[r0 + 8 * h][8 * g + 2 * q + e];
      for (int reg = 0; reg < 4; ++reg)
        for (int byte = 0; byte < 4; ++byte) {
          const int v1 = reg % 2, v2 = reg / 2;
          const int row = r0 + 8 * v1, col = 4 * q + byte + 16 * v2;
          const int element = fp8_p_element(4 * reg + byte);
          ASSERT_EQ((element / 2) % 2, v1) << "register " << reg << " takes the other row half";
          A[row][col] = sc[element];
          // The accumulator column it came from is the key V^T holds at this column.
          EXPECT_EQ(8 * (element / 4) + 2 * q + element % 2, fp8_vt_key(col))
              << "thread " << lane << " register " << reg << " byte " << byte;
        }
    }
  for (int r = 0; r < 64; ++r)
    for (int n = 0; n < kN; ++n) {
      long got = 0, want = 0;
      for (int a = 0; a < 32; ++a) {
        ASSERT_NE(A[r][a], INT32_MIN) << "A element " << r << ", " << a << " not written";
        got += long{A[r][a]} * V[fp8_vt_key(a)][n];
        want += long{P[r][a]} * V[a][n];
      }
      EXPECT_EQ(got, want) << "row " << r << " column " << n;
    }
}

// Head dims (issue 24): multiples of 8 from 32 to 256, q/k's and v's equal or not. 64, 128 and 256
// with equal dims keep their kernels (sm80 or sm90); every other pair runs on sm80's padded kernel
// of the next compiled head dim, on its masked prefill tiles (mask or not) or its decode tiles,
// with split-KV partials of the kernel's head dim. A forced sm90 refuses them naming
// FLASHSERVE_KERNEL; score modifiers with them are refused by the modifier's name.

StepShape dims(StepShape s, int64_t d, int64_t dv) {
  s.pr.head_dim = d;
  s.pr.head_dim_v = dv;
  return s;
}

TEST(PlanHeadDims, CudaTakesMultiplesOf8From32To256AndRefusesOthersByName) {
  for (int64_t d = 32; d <= 256; d += 8)
    for (int64_t dv : {int64_t{32}, d, int64_t{256}}) {
      Problem pr = dense(1, 64, 2, d, false).pr;
      pr.head_dim_v = dv;
      EXPECT_NO_THROW(attention::check_cuda_head_dims(pr)) << d << "/" << dv;
    }
  auto refused = [](int64_t d, int64_t dv) {
    Problem pr = dense(1, 64, 2, d, false).pr;
    pr.head_dim_v = dv;
    try {
      attention::check_cuda_head_dims(pr);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
      return std::string(e.what());
    }
    ADD_FAILURE() << "no refusal of " << d << "/" << dv;
    return std::string();
  };
  for (int64_t d : {1, 8, 16, 24, 36, 100, 255, 264, 512}) {
    EXPECT_NE(refused(d, 128).find("head_dim " + std::to_string(d) +
                                   " is not supported by the CUDA kernels (a multiple of 8 from "
                                   "32 to 256)"),
              std::string::npos)
        << refused(d, 128);
    EXPECT_EQ(refused(d, 128).rfind("q: ", 0), 0u) << refused(d, 128);
    EXPECT_EQ(refused(128, d).rfind("v: ", 0), 0u) << refused(128, d);
  }
}

// The padded kernels run unless FLASHSERVE_PADDED_HEAD_DIMS=0 (kPaddedHeadDimsByDefault): off,
// refused naming q, saying how to turn them on; the variable read strictly; the compiled head
// dims never look at it.
TEST(PlanHeadDims, PaddedHeadDimsRunUnlessTurnedOff) {
  EXPECT_TRUE(attention::kPaddedHeadDimsByDefault);
  Problem padded = dense(1, 64, 2, 192, false).pr;
  padded.head_dim_v = 128;
  for (const char* value : {static_cast<const char*>(nullptr), "", "0"}) {
    try {
      attention::refuse_padded_if_off(padded, value);
      EXPECT_TRUE(attention::kPaddedHeadDimsByDefault && (value == nullptr || *value == '\0'))
          << "ran with " << (value ? value : "(unset)");
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
      EXPECT_EQ(e.argument(), "q");
      EXPECT_NE(std::string(e.what()).find("FLASHSERVE_PADDED_HEAD_DIMS=1"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_NO_THROW(attention::refuse_padded_if_off(padded, "1"));
  for (const char* bad : {"yes", "2", " 1", "on"}) {
    try {
      attention::refuse_padded_if_off(padded, bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHSERVE_PADDED_HEAD_DIMS") << e.what();
    }
  }
  for (int64_t d : {64, 128, 256})
    EXPECT_NO_THROW(attention::refuse_padded_if_off(dense(1, 64, 2, d, false).pr, "bad"));
}

TEST(PlanHeadDims, KernelHeadDimIsTheNextCompiledOne) {
  using attention::sm80::kernel_head_dim;
  using attention::sm80::padded_head_dims;
  EXPECT_EQ(kernel_head_dim(32, 32), 64);
  EXPECT_EQ(kernel_head_dim(64, 64), 64);
  EXPECT_EQ(kernel_head_dim(72, 72), 128);
  EXPECT_EQ(kernel_head_dim(128, 128), 128);
  EXPECT_EQ(kernel_head_dim(136, 136), 256);
  EXPECT_EQ(kernel_head_dim(192, 128), 256);
  EXPECT_EQ(kernel_head_dim(64, 128), 128);  // the larger of the two
  EXPECT_EQ(kernel_head_dim(248, 248), 256);
  for (int d : {64, 128, 256}) EXPECT_FALSE(padded_head_dims(d, d)) << d;
  EXPECT_TRUE(padded_head_dims(96, 96));
  EXPECT_TRUE(padded_head_dims(128, 64));
  EXPECT_TRUE(padded_head_dims(64, 128));
  EXPECT_TRUE(padded_head_dims(192, 128));
}

TEST(PlanHeadDims, OtherDimsRunPaddedOnSm80) {
  using attention::KernelFamily;
  struct Want {
    int64_t d, dv;
    int kernel;
  };
  const Want wants[] = {{32, 32, 64},    {40, 40, 64},    {72, 72, 128},   {96, 96, 128},
                        {136, 136, 256}, {160, 160, 256}, {192, 192, 256}, {224, 224, 256},
                        {248, 248, 256}, {192, 128, 256}, {128, 64, 128},  {64, 128, 128},
                        {256, 128, 256}};
  for (const Want& w : wants)
    for (bool causal : {false, true}) {
      // A prefill the default plan would run on sm90 at a compiled head dim.
      const StepShape s = dims(dense(4, 2048, 16, 128, causal), w.d, w.dv);
      const Plan p = make_plan(s.pr, s.ctx, HostLengths{});
      ASSERT_EQ(p.launches.size(), 1u);
      const auto& k = p.launches[0].kernel;
      EXPECT_EQ(k.family, KernelFamily::kSm80) << p.summary();
      EXPECT_TRUE(k.padded) << p.summary();
      EXPECT_EQ(k.head_dim, w.kernel) << p.summary();
      EXPECT_TRUE(k.masked) << p.summary();  // the padded prefill kernels are the masked ones
      const attention::sm80::Tiles t = attention::sm80::fwd_tiles(w.kernel, true);
      EXPECT_EQ(k.block_m, t.block_m);
      EXPECT_EQ(k.block_n, t.block_n);
      EXPECT_NE(p.summary().find("padded d" + std::to_string(w.kernel)), std::string::npos)
          << p.summary();
      // Decodes: the padded kernel's decode tiles, split over its head dim's partials.
      StepShape decode = dims(step(decodes(4, 8192)), w.d, w.dv);
      const Plan dp = plan_of(decode);
      ASSERT_EQ(dp.launches.size(), 1u);
      const auto& dk = dp.launches[0].kernel;
      EXPECT_TRUE(dk.decode && dk.padded && !dk.masked) << dp.summary();
      EXPECT_EQ(dk.head_dim, w.kernel);
      EXPECT_EQ(dk.block_n, attention::sm80::decode_tiles(w.kernel).block_n);
      ASSERT_GT(dk.splits, 1) << dp.summary();
      EXPECT_EQ(dp.workspace_bytes, attention::partial_bytes(dk.splits, 4, 32, w.kernel));
    }
  // The compiled head dims with equal q and v dims are not padded, and keep their families.
  for (int64_t d : {64, 128, 256}) {
    const StepShape s = dense(4, 2048, 16, d, false);
    const Plan p = make_plan(s.pr, s.ctx, HostLengths{});
    ASSERT_EQ(p.launches.size(), 1u);
    EXPECT_EQ(p.launches[0].kernel.family, KernelFamily::kSm90);
    EXPECT_FALSE(p.launches[0].kernel.padded);
    EXPECT_EQ(p.launches[0].kernel.head_dim, d);
    EXPECT_EQ(p.summary().find("padded"), std::string::npos);
    StepShape sm80 = s;
    sm80.ctx.family = attention::FamilyRequest::kSm80;
    const Plan p80 = make_plan(sm80.pr, sm80.ctx, HostLengths{});
    EXPECT_FALSE(p80.launches[0].kernel.padded);
    EXPECT_FALSE(p80.launches[0].kernel.masked);  // unmasked tiles as before
  }
  // A mixed step keeps its two groups, both padded on sm80; the widened plan too.
  auto seqs = decodes(64, 2048);
  seqs.insert(seqs.begin(), {512, 4096 + 512});
  StepShape mixed = dims(step(seqs), 192, 128);
  mixed.ctx.sm90_unavailable = "";
  mixed.lens.widen = true;
  const Plan mp = plan_of(mixed);
  ASSERT_EQ(mp.launches.size(), 2u);
  size_t workspace = 0;
  for (const LaunchPlan& l : mp.launches) {
    EXPECT_EQ(l.kernel.family, KernelFamily::kSm80);
    EXPECT_TRUE(l.kernel.padded);
    EXPECT_EQ(l.kernel.head_dim, 256);
    workspace = std::max(
        workspace, l.workspace_offset + attention::partial_bytes(l.kernel.splits, l.rows, 32, 256));
  }
  EXPECT_GE(mp.workspace_bytes, workspace);
  EXPECT_NE(attention::replay_key(mp).find("padded d256"), std::string::npos);
}

TEST(PlanHeadDims, ForcedSm90AndScoreModifiersRefuseThemByName) {
  auto refusal = [](const StepShape& s) {
    try {
      make_plan(s.pr, s.ctx, HostLengths{});
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
      return std::string(e.what());
    }
    ADD_FAILURE() << "no refusal";
    return std::string();
  };
  StepShape forced = dims(dense(4, 2048, 16, 128, true), 96, 96);
  forced.ctx.family = attention::FamilyRequest::kSm90;
  EXPECT_EQ(refusal(forced).rfind("FLASHSERVE_KERNEL: ", 0), 0u) << refusal(forced);
  EXPECT_NE(refusal(forced).find("sm90: head_dim 96 (64, 128 and 256 only"), std::string::npos)
      << refusal(forced);
  forced = dims(forced, 128, 64);
  EXPECT_NE(refusal(forced).find("sm90: head_dim_v 64 differs from head_dim 128"),
            std::string::npos)
      << refusal(forced);
  // A forced sm80 runs them.
  forced.ctx.family = attention::FamilyRequest::kSm80;
  EXPECT_TRUE(make_plan(forced.pr, forced.ctx, HostLengths{}).launches[0].kernel.padded);

  static const float slopes[16] = {};
  for (auto family : {attention::FamilyRequest::kAuto, attention::FamilyRequest::kSm80,
                      attention::FamilyRequest::kSm90}) {
    StepShape capped = dims(dense(2, 300, 4, 128, true), 192, 128);
    capped.ctx.family = family;
    capped.pr.score_mod.softcap = 30.0f;
    EXPECT_EQ(refusal(capped).rfind("softcap: logit soft-capping is not supported by the CUDA "
                                    "kernels with head dims 192/128",
                                    0),
              0u)
        << refusal(capped);
    StepShape alibi = dims(step(decodes(8, 300)), 72, 72);
    alibi.ctx.family = family;
    alibi.pr.score_mod.alibi = slopes;
    alibi.pr.score_mod.alibi_head_stride = 1;
    EXPECT_EQ(refusal(alibi).rfind("alibi_slopes: ", 0), 0u) << refusal(alibi);
  }
  // The compiled head dims keep their modifiers.
  StepShape capped = dense(2, 300, 4, 128, true);
  capped.pr.score_mod.softcap = 30.0f;
  EXPECT_FALSE(make_plan(capped.pr, capped.ctx, HostLengths{}).launches.empty());
}

// What the first device run of the fp8 forward could not say (it hung at d128 and d256), checked
// from the tiles' own constexprs for every fp8 tile: the bytes each stage's barrier expects
// (arrive_expect_tx) are the bytes of the boxes the producer issues into it (fwd_mainloop.h:
// kChunks boxes of kRowBytes x rows for Q and K, load_vt's kVChunks boxes of kVtBoxKeys x d for
// V^T, which tile the block's keys exactly); every box is one TMA accepts (at most 256 per
// dimension, inner bytes the swizzle's width); and the setmaxnreg budgets fit the registers of
// the CTA (128 x 32 + 256 x 240 = 65536 > 64512 was the hang: setmaxnreg.inc waits forever).
template <class Cfg>
void check_fp8_tile_bytes() {
  SCOPED_TRACE(::testing::Message() << "d" << Cfg::kHeadDim << " " << Cfg::kBlockM << "x"
                                    << Cfg::kBlockN << " V^T box " << Cfg::kVtBoxKeys);
  EXPECT_TRUE(Cfg::kFp8);
  // Q: one box per column chunk of kRowBytes (1-byte elements) x kBlockM rows.
  EXPECT_EQ(Cfg::kChunks * Cfg::kRowBytes, Cfg::kHeadDim);
  EXPECT_EQ(Cfg::kChunks * Cfg::kRowBytes * Cfg::kBlockM, Cfg::kQBytes);
  // K: the same boxes of kBlockN rows.
  EXPECT_EQ(Cfg::kChunks * Cfg::kRowBytes * Cfg::kBlockN, Cfg::kKVBytes);
  // V^T: load_vt's boxes, key coordinates block * kBlockN + kVtBoxKeys * c, c < kVChunks.
  int64_t vt_bytes = 0;
  std::vector<bool> covered(Cfg::kBlockN, false);
  for (int c = 0; c < Cfg::kVChunks; ++c) {
    vt_bytes += int64_t{Cfg::kVtBoxKeys} * Cfg::kHeadDim;
    for (int k = 0; k < Cfg::kVtBoxKeys; ++k) {
      const int key = Cfg::kVtBoxKeys * c + k;
      ASSERT_LT(key, Cfg::kBlockN);
      EXPECT_FALSE(covered[key]) << "key " << key << " in two boxes";
      covered[key] = true;
    }
  }
  for (int key = 0; key < Cfg::kBlockN; ++key) EXPECT_TRUE(covered[key]) << "key " << key;
  EXPECT_EQ(vt_bytes, Cfg::kKVBytes) << "V^T's barrier expects K's block's bytes";
  EXPECT_EQ(int64_t{Cfg::kVChunks} * Cfg::kVChunkBytes, vt_bytes);
  // The boxes TMA takes: at most 256 per dimension; the inner extent the swizzle's width (128
  // bytes, or 64 with the 64-byte swizzle), as make_map / make_vt_map encode them.
  for (int rows : {Cfg::kBlockM, Cfg::kBlockN, Cfg::kHeadDim}) EXPECT_LE(rows, 256);
  EXPECT_TRUE(Cfg::kRowBytes == 128 || Cfg::kRowBytes == 64);
  EXPECT_TRUE(Cfg::kVtBoxKeys == 128 || Cfg::kVtBoxKeys == 64);
  // The shared-memory descriptors' atoms: 8 rows of the swizzle's width, 1024-byte aligned chunks.
  EXPECT_EQ(Cfg::kVChunkBytes % 1024, 0);
  EXPECT_EQ(Cfg::kKVChunkBytes % 1024, 0);
  EXPECT_EQ(Cfg::kQChunkBytes % 1024, 0);
  // P V's k-steps (32 keys) within whole boxes; S Q K^T's (32 columns) within whole rows.
  EXPECT_EQ(Cfg::kPSteps * 32, Cfg::kBlockN);
  EXPECT_EQ(Cfg::kVtBoxKeys % 32, 0);
  EXPECT_EQ(Cfg::kQkSteps * 32, Cfg::kHeadDim);
  // Registers.
  EXPECT_EQ(Cfg::kThreads, 128 * (1 + Cfg::kConsumers));
  EXPECT_LE(128 * Cfg::kProducerRegs + 128 * Cfg::kConsumers * Cfg::kConsumerRegs,
            attention::sm90::cta_registers(Cfg::kThreads));
}

TEST(PlanFp8, StageBytesEqualTheBoxesAndRegisterBudgetsFitForEveryFp8Tile) {
  using attention::sm90::Fp8Tile;
  check_fp8_tile_bytes<Fp8Tile<64, 128>::type>();
  check_fp8_tile_bytes<Fp8Tile<128, 128>::type>();
  check_fp8_tile_bytes<Fp8Tile<128, 192>::type>();
  check_fp8_tile_bytes<Fp8Tile<256, 128>::type>();
  EXPECT_EQ(attention::sm90::cta_registers(384), 64512);
  EXPECT_EQ(attention::sm90::cta_registers(512), 65536);
  EXPECT_FALSE(attention::sm90::setmaxnreg_fits(32, 240, 2)) << "the budget that hung";
  EXPECT_TRUE(attention::sm90::setmaxnreg_fits(24, 240, 2));
  EXPECT_TRUE(attention::sm90::setmaxnreg_fits(32, 232, 2));
  EXPECT_TRUE(attention::sm90::setmaxnreg_fits(32, 160, 3));
}

// The V^T pre-pass's extent (fp8_vt.h, fp8_vt_writes) for both key blocks: every key a kernel
// block reads below the slab's end is written; nothing past the last 128-key piece the kernel
// reaches is.
TEST(PlanFp8, VtPrepassWritesEveryKeyTheKernelReads) {
  using attention::sm90::fp8_vt_keys;
  using attention::sm90::fp8_vt_writes;
  for (int block_n : {128, 192})
    for (int max_kv : {1, 100, 127, 128, 129, 191, 192, 193, 256, 300, 384, 385, 1000})
      for (int kv : {0, 1, 33, 100, 128, 129, 192, 200, 256, 385, 1000}) {
        if (kv > max_kv) continue;
        const int64_t keys = fp8_vt_keys(max_kv);
        ASSERT_EQ(keys % 128, 0);
        ASSERT_GE(keys, max_kv);
        const int64_t read_end = (kv + block_n - 1) / block_n * block_n;  // the kernel's blocks
        for (int64_t key = 0; key < keys; ++key) {
          const bool written = fp8_vt_writes(key / 128 * 128, kv, block_n);
          if (key < read_end) EXPECT_TRUE(written) << block_n << " " << kv << " " << key;
          if (key >= (read_end + 127) / 128 * 128)
            EXPECT_FALSE(written) << block_n << " " << kv << " " << key;
        }
      }
}
}  // namespace
}  // namespace flashserve::testing
