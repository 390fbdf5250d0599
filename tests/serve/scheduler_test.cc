// Scheduler: the five policies on thousands of small random workloads (block invariants after every
// step, the token budget, max_running, exact output lengths, sarathi never skipping a running
// decode, vllm-v1's chunk sizes and victims), plus targeted cases: vllm-v0's decode stall,
// sarathi's chunk sizes, orca's mixing, static's request-level batches, preemption by recompute,
// and the errors for bad requests and configs. The hand-traced batches of each policy are in
// policy_golden_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "flashserve/error.h"
#include "serve/batch_layout.h"
#include "serve/metrics.h"
#include "serve/scheduler.h"

namespace fs = flashserve::serve;
using flashserve::Error;

namespace {

std::unique_ptr<fs::Sequence> make_req(int64_t id, int64_t prompt, int64_t output,
                                       double arrival = 0) {
  auto s = std::make_unique<fs::Sequence>();
  s->id = id;
  for (int64_t i = 0; i < prompt; ++i) s->prompt.push_back(static_cast<int32_t>(1000 + i));
  s->max_output_tokens = output;
  s->arrival_time = arrival;
  return s;
}

struct Case {
  fs::Policy policy;
  fs::SchedulerConfig cfg;
  int32_t block_size;
  int64_t num_blocks;
  double watermark;
  double abort_prob = 0;  // per step, drop a random request as a departing client would
  struct Req {
    int64_t step, prompt, output;
  };
  std::vector<Req> reqs;
};

Case random_case(fs::Policy policy, std::mt19937_64& rng) {
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Case c;
  c.policy = policy;
  c.cfg.policy = policy;
  c.cfg.max_model_len = uni(16, 160);
  c.cfg.max_running = uni(1, 12);
  c.cfg.chunk_tile = std::vector<int64_t>{1, 4, 16}[uni(0, 2)];
  const bool chunks = policy == fs::Policy::kSarathi || policy == fs::Policy::kVllmV1;
  c.cfg.max_tokens_per_step =
      chunks ? uni(c.cfg.max_running, c.cfg.max_running + 96) : c.cfg.max_model_len + uni(0, 64);
  if (policy == fs::Policy::kVllmV1 && uni(0, 1)) c.cfg.long_prefill_token_threshold = uni(1, 48);
  c.block_size = static_cast<int32_t>(std::vector<int64_t>{1, 4, 16}[uni(0, 2)]);
  c.watermark = uni(0, 1) ? 0.0 : 0.05;
  // Between "barely one max-length sequence" (lots of preemption) and plenty.
  const int64_t min_blocks = (c.cfg.max_model_len + c.block_size - 1) / c.block_size;
  // The watermark's blocks come on top (the scheduler rejects a cache that lacks them).
  c.num_blocks =
      static_cast<int64_t>(static_cast<double>(min_blocks + 1) *
                           (1.0 + static_cast<double>(uni(0, 30)) / 10.0) / (1.0 - c.watermark)) +
      2;
  if (uni(0, 4) == 0) c.abort_prob = 0.02;
  const int64_t n = uni(1, 24);
  int64_t step = 0;
  for (int64_t i = 0; i < n; ++i) {
    step += uni(0, 6);
    const int64_t out = uni(1, std::min<int64_t>(40, c.cfg.max_model_len - 1));
    const int64_t prompt = uni(1, c.cfg.max_model_len - out);
    c.reqs.push_back({step, prompt, out});
  }
  return c;
}

// A stand-in for the KV cache memory: what (sequence, position, token) each slot holds.
struct Slot {
  int64_t seq = -1;
  int32_t pos = -1, token = -1;
  bool operator==(const Slot&) const = default;
};

// Writes the step's new tokens through the layout's slot mapping, then reads every key of every
// entry back through its block table: each must be that sequence's own token at that position. A
// block handed to two sequences, or a stale block after preemption, shows up here.
void check_paged_kv(const fs::Batch& batch, int32_t bs, std::vector<Slot>& kv) {
  const flashserve::model::ForwardBatch l = fs::layout_batch(batch, bs);
  l.validate();  // sizes, offsets and positions consistent as the model runner requires
  ASSERT_EQ(l.cu_seqlens_q.size(), batch.entries.size() + 1);
  ASSERT_EQ(l.total_q, batch.num_tokens());
  size_t sample = 0;
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    const auto& e = batch.entries[i];
    const fs::Sequence& s = *e.seq;
    ASSERT_EQ(l.cu_seqlens_q[i + 1] - l.cu_seqlens_q[i], e.q_len);
    ASSERT_EQ(l.seqused_k[i], e.kv_len);
    for (int64_t r = l.cu_seqlens_q[i], p = e.q_start; r < l.cu_seqlens_q[i + 1]; ++r, ++p) {
      ASSERT_EQ(l.positions[r], p);
      ASSERT_EQ(l.input_ids[r], s.token_at(p));
      kv.at(l.slot_mapping[r]) = Slot{s.id, static_cast<int32_t>(p), s.token_at(p)};
    }
    if (e.samples) {
      ASSERT_LT(sample, l.sample_rows.size());
      ASSERT_EQ(l.sample_rows[sample++], l.cu_seqlens_q[i + 1] - 1);
    }
  }
  ASSERT_EQ(sample, l.sample_rows.size());
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    const fs::Sequence& s = *batch.entries[i].seq;
    for (int64_t j = 0; j < batch.entries[i].kv_len; ++j) {
      const int32_t block = l.block_table[i * l.pages_per_seq + j / bs];
      ASSERT_EQ(kv.at(block * bs + j % bs), (Slot{s.id, static_cast<int32_t>(j), s.token_at(j)}))
          << "sequence " << s.id << " key " << j;
    }
  }
}

// The first chunk vllm-v1 gives a request with `remaining` tokens to compute and `left` of the
// budget unused: capped by long_prefill_token_threshold when set.
int64_t v1_chunk(int64_t remaining, int64_t left, int64_t threshold) {
  return std::min(threshold > 0 ? std::min(remaining, threshold) : remaining, left);
}

// Whether the head of the waiting queue could be admitted now: a running slot, its blocks (with
// the watermark, except for orca and vllm-v1), and room in the step (a whole prompt for vllm-v0,
// one token for sarathi and vllm-v1, none for orca and static, which have no token cap).
bool head_admissible(const fs::Scheduler& s, const fs::BlockManager& bm, int64_t tokens_left) {
  if (s.num_waiting() == 0 || s.num_running() >= s.config().max_running) return false;
  const fs::Sequence& head = *s.live()[static_cast<size_t>(s.num_running())];
  const fs::Policy p = s.config().policy;
  if (p == fs::Policy::kOrca)  // max_model_len of KV reserved per request, no watermark
    return bm.can_grow(head, std::max(head.num_tokens(), s.config().max_model_len));
  if (p == fs::Policy::kVllmV1)  // blocks for the first chunk only, no watermark
    return tokens_left > 0 && bm.can_grow(head, v1_chunk(head.num_tokens(), tokens_left,
                                                         s.config().long_prefill_token_threshold));
  if (p == fs::Policy::kStatic) return bm.can_admit(head, head.num_tokens());
  const int64_t step_need = p == fs::Policy::kSarathi ? 1 : head.num_uncomputed();
  return bm.can_admit(head, head.num_tokens()) && step_need <= tokens_left;
}

// Sarathi's chunk for a prefill with `remaining` tokens when `left` of the budget is unused.
int64_t sarathi_chunk(int64_t remaining, int64_t left, int64_t tile) {
  const int64_t c = std::min(remaining, left);
  return c < remaining && c >= tile ? c - c % tile : c;
}

struct RunStats {
  int64_t steps = 0, preemptions = 0, max_tokens = 0, chunked_prefills = 0, aborts = 0;
};

// Drives the scheduler step by step (one time unit per step) and checks every property we promise.
RunStats run_case(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  fs::BlockManager bm(c.num_blocks, c.block_size, c.watermark);
  auto sched = fs::Scheduler::create(c.cfg, bm);
  std::map<int64_t, std::vector<int32_t>> fed;  // the tokens we "sampled" for each request
  std::map<int64_t, int64_t> want_out;
  std::vector<std::unique_ptr<fs::Sequence>> done;
  std::vector<Slot> kv(static_cast<size_t>(c.num_blocks * c.block_size));
  RunStats st;
  size_t next = 0;
  for (int64_t step = 0; next < c.reqs.size() || sched->has_work(); ++step) {
    if (step > 200000) {
      ADD_FAILURE() << "no progress";
      return st;
    }
    for (; next < c.reqs.size() && c.reqs[next].step <= step; ++next) {
      const auto& r = c.reqs[next];
      sched->add(make_req(static_cast<int64_t>(next), r.prompt, r.output, double(step)));
      want_out[static_cast<int64_t>(next)] = r.output;
    }
    if (c.abort_prob > 0 && std::uniform_real_distribution<double>(0, 1)(rng) < c.abort_prob) {
      const auto live = sched->live();
      if (!live.empty()) {
        const int64_t id = live[rng() % live.size()]->id;
        auto gone = sched->abort(id, double(step));
        EXPECT_TRUE(gone && gone->aborted && gone->block_table.empty());
        want_out.erase(id);
        ++st.aborts;
        EXPECT_NO_THROW(bm.check_invariants(sched->live()));
      }
    }
    std::set<int64_t> decoding_before;
    const int64_t running_before = sched->num_running();
    std::vector<int64_t> priority_before;  // running, highest priority first
    std::set<int64_t> half_done_before;    // prefills with some chunks computed
    for (const fs::Sequence* s : sched->running()) {
      priority_before.push_back(s->id);
      if (s->state == fs::SeqState::kRunningPrefill && s->num_computed > 0)
        half_done_before.insert(s->id);
      if (s->state == fs::SeqState::kRunningDecode) decoding_before.insert(s->id);
    }
    std::vector<int64_t> waiting_before;  // in queue order
    for (const fs::Sequence* s : sched->live())
      if (!s->is_running()) waiting_before.push_back(s->id);
    const bool admissible_before = head_admissible(*sched, bm, c.cfg.max_tokens_per_step);

    fs::Batch batch = sched->schedule(double(step));
    ++st.steps;
    st.preemptions += static_cast<int64_t>(batch.preempted.size());
    st.max_tokens = std::max(st.max_tokens, batch.num_tokens());

    // The budget (orca and static have none), the running limit, and the shape of every entry.
    if (c.policy != fs::Policy::kOrca && c.policy != fs::Policy::kStatic)
      EXPECT_LE(batch.num_tokens(), c.cfg.max_tokens_per_step);
    EXPECT_LE(sched->num_running(), c.cfg.max_running);
    std::set<int64_t> in_batch;
    bool has_prefill = false, has_decode = false;
    for (const auto& e : batch.entries) {
      EXPECT_TRUE(in_batch.insert(e.seq->id).second) << "sequence scheduled twice";
      EXPECT_TRUE(e.seq->is_running());
      EXPECT_EQ(e.q_start, e.seq->num_computed);
      EXPECT_EQ(e.kv_len, e.q_start + e.q_len);
      EXPECT_GE(e.q_len, 1);
      EXPECT_LE(e.kv_len, e.seq->num_tokens());
      EXPECT_EQ(e.samples, e.kv_len == e.seq->num_tokens());
      // The block table covers every key of the step.
      EXPECT_GE(static_cast<int64_t>(e.block_table().size()) * c.block_size, e.kv_len);
      if (e.is_prefill) {
        has_prefill = true;
        if (c.policy != fs::Policy::kSarathi && c.policy != fs::Policy::kVllmV1) {
          EXPECT_EQ(e.q_start, 0) << "a baseline chunked a prompt";
          EXPECT_TRUE(e.samples);
        } else if (c.policy == fs::Policy::kVllmV1) {
          st.chunked_prefills += !e.samples;
        } else if (!e.samples) {
          ++st.chunked_prefills;
          // A non-final chunk is a multiple of the tile unless the budget left was below a tile.
          if (e.q_len >= c.cfg.chunk_tile) {
            EXPECT_EQ(e.q_len % c.cfg.chunk_tile, 0);
          }
        }
      } else {
        has_decode = true;
        EXPECT_EQ(e.q_len, 1);
      }
    }
    for (int64_t id : batch.preempted) EXPECT_EQ(in_batch.count(id), 0u);
    // New requests are admitted from the front of the queue, in order (FIFO): the prefills that
    // start at token 0 are exactly the first waiting requests.
    std::vector<int64_t> admitted;
    for (const auto& e : batch.entries)
      if (e.is_prefill && e.q_start == 0) admitted.push_back(e.seq->id);
    EXPECT_TRUE(admitted.size() <= waiting_before.size() &&
                std::equal(admitted.begin(), admitted.end(), waiting_before.begin()))
        << "admission out of FIFO order at step " << step;
    // Preempted sequences go back to the front of the queue, highest priority first, and no step
    // that preempts admits anyone: the queue is now the preempted, then what was not admitted.
    std::vector<int64_t> want_waiting(batch.preempted.rbegin(), batch.preempted.rend());
    if (admitted.size() <= waiting_before.size())
      want_waiting.insert(want_waiting.end(), waiting_before.begin() + admitted.size(),
                          waiting_before.end());
    std::vector<int64_t> waiting_after;
    for (const fs::Sequence* s : sched->live())
      if (!s->is_running()) waiting_after.push_back(s->id);
    EXPECT_EQ(waiting_after, want_waiting) << "step " << step;
    // A victim is the lowest-priority sequence not in the step: everything below it was spared
    // only because it runs in the step (or was preempted too), or is a prefill under way (spared
    // while another victim exists) when the victim is not one.
    std::set<int64_t> preempted_set(batch.preempted.begin(), batch.preempted.end());
    for (int64_t v : batch.preempted) {
      auto it = std::find(priority_before.begin(), priority_before.end(), v);
      EXPECT_TRUE(it != priority_before.end()) << "preempted a sequence that was not running";
      const bool victim_half_done = half_done_before.count(v) > 0;
      for (; it != priority_before.end(); ++it)
        if (c.policy == fs::Policy::kVllmV1)  // strictly the latest admitted, whatever it runs
          EXPECT_TRUE(preempted_set.count(*it))
              << "vllm-v1 preempted " << v << " ahead of later-admitted " << *it;
        else
          EXPECT_TRUE(in_batch.count(*it) || preempted_set.count(*it) ||
                      (!victim_half_done && half_done_before.count(*it)))
              << "preempted " << v << " ahead of lower-priority " << *it << " at step " << step;
      if (c.policy == fs::Policy::kOrca) ADD_FAILURE() << "orca reserved its KV, yet preempted";
    }
    // Sarathi reserves a prompt's blocks at admission: its prefills never run the cache short.
    if (c.policy == fs::Policy::kSarathi)
      for (const auto& e : batch.entries)
        if (e.is_prefill)
          EXPECT_GE(int64_t(e.block_table().size()) * c.block_size, e.seq->num_tokens());
    const int64_t left = c.cfg.max_tokens_per_step - batch.num_tokens();
    check_paged_kv(batch, c.block_size, kv);
    if (c.policy == fs::Policy::kSarathi || c.policy == fs::Policy::kOrca) {
      // Stall-free: every decode running before the step is in it, unless it lost its blocks.
      std::set<int64_t> preempted(batch.preempted.begin(), batch.preempted.end());
      for (int64_t id : decoding_before)
        EXPECT_TRUE(in_batch.count(id) || preempted.count(id))
            << fs::to_string(c.policy) << " skipped running decode " << id << " at step " << step;
    }
    if (c.policy == fs::Policy::kSarathi) {
      // Decodes, then partial prefills, then new requests; each prefill takes exactly the chunk
      // the budget left to it allows.
      int phase = 0;
      int64_t tokens_before = 0;
      for (const auto& e : batch.entries) {
        const int p = !e.is_prefill ? 0 : e.q_start > 0 ? 1 : 2;
        EXPECT_GE(p, phase) << "sarathi's order broken at step " << step;
        phase = p;
        if (e.is_prefill)
          EXPECT_EQ(e.q_len,
                    sarathi_chunk(e.seq->num_tokens() - e.q_start,
                                  c.cfg.max_tokens_per_step - tokens_before, c.cfg.chunk_tile));
        tokens_before += e.q_len;
      }
      // Work-conserving: with budget left, every running sequence is in the step, and the
      // queue's head could not be admitted (or the step preempted).
      if (left > 0) {
        for (const fs::Sequence* s : sched->running()) EXPECT_TRUE(in_batch.count(s->id));
        if (batch.preempted.empty()) EXPECT_FALSE(head_admissible(*sched, bm, left));
      }
    }
    if (c.policy == fs::Policy::kVllmV1) {
      // The running requests in admission order, then the admitted ones; each gets exactly
      // min(what it has left, the threshold, the budget left).
      std::vector<int64_t> order;
      int64_t tokens_before = 0;
      for (const auto& e : batch.entries) {
        order.push_back(e.seq->id);
        EXPECT_EQ(e.q_len, v1_chunk(e.seq->num_tokens() - e.q_start,
                                    c.cfg.max_tokens_per_step - tokens_before,
                                    c.cfg.long_prefill_token_threshold))
            << "vllm-v1's chunk for " << e.seq->id << " at step " << step;
        tokens_before += e.q_len;
      }
      std::vector<int64_t> want_order;
      for (int64_t id : priority_before)
        if (in_batch.count(id)) want_order.push_back(id);
      want_order.insert(want_order.end(), admitted.begin(), admitted.end());
      EXPECT_EQ(order, want_order) << "vllm-v1's order at step " << step;
      // Work-conserving unless it preempted: budget left means every running request ran and
      // the head could not be admitted.
      if (left > 0 && batch.preempted.empty()) {
        for (const fs::Sequence* s : sched->running()) EXPECT_TRUE(in_batch.count(s->id));
        EXPECT_FALSE(head_admissible(*sched, bm, left)) << "step " << step;
      }
    }
    if (c.policy == fs::Policy::kOrca && batch.preempted.empty()) {
      EXPECT_FALSE(head_admissible(*sched, bm, left)) << "orca left a fitting prompt waiting";
    }
    if (c.policy == fs::Policy::kVllmV0) {
      EXPECT_FALSE(has_prefill && has_decode);
      // Prefill-first: a step runs prompts exactly when the queue's head can be admitted.
      EXPECT_EQ(has_prefill, admissible_before) << "step " << step;
    }
    if (c.policy == fs::Policy::kStatic && has_prefill) {
      EXPECT_EQ(running_before, 0) << "static admitted into a running batch";
      EXPECT_FALSE(has_decode);
    }
    if (c.policy == fs::Policy::kStatic && running_before == 0) {
      // A new batch takes every waiting prompt that fits.
      EXPECT_EQ(has_prefill, !waiting_before.empty());
      EXPECT_FALSE(head_admissible(*sched, bm, left));
    }
    if (batch.empty()) {
      // Only allowed while nothing runs and we are waiting for arrivals.
      EXPECT_EQ(sched->num_running(), 0);
    }

    std::vector<int32_t> sampled(batch.entries.size());
    for (size_t i = 0; i < sampled.size(); ++i) {
      sampled[i] = static_cast<int32_t>(rng() % 32000);
      if (batch.entries[i].samples) fed[batch.entries[i].seq->id].push_back(sampled[i]);
    }
    for (auto& s : sched->complete(batch, sampled, double(step + 1))) done.push_back(std::move(s));
    // Block invariants after every step (finished sequences hold nothing any more).
    EXPECT_NO_THROW(bm.check_invariants(sched->live()));
    if (::testing::Test::HasFailure()) return st;
  }
  EXPECT_EQ(bm.num_free(), bm.num_blocks()) << "blocks leaked at the end";
  EXPECT_EQ(static_cast<int64_t>(done.size()) + st.aborts, static_cast<int64_t>(c.reqs.size()));
  for (const auto& s : done) {
    EXPECT_EQ(s->state, fs::SeqState::kFinished);
    EXPECT_EQ(s->num_generated(), want_out[s->id]) << "request " << s->id;
    EXPECT_EQ(s->generated, fed[s->id]);
    EXPECT_EQ(s->token_times.size(), s->generated.size());
    for (size_t i = 1; i < s->token_times.size(); ++i)
      EXPECT_GT(s->token_times[i], s->token_times[i - 1]);
    EXPECT_TRUE(s->block_table.empty());
    EXPECT_GE(s->first_scheduled_time, s->arrival_time);
  }
  return st;
}

class RandomWorkloads : public ::testing::TestWithParam<fs::Policy> {};

TEST_P(RandomWorkloads, InvariantsBudgetAndExactLengths) {
  std::mt19937_64 rng(static_cast<uint64_t>(GetParam()) * 7919 + 17);
  RunStats total;
  constexpr int kWorkloads = 600;  // x 5 policies = 3000 random workloads
  for (int w = 0; w < kWorkloads; ++w) {
    const Case c = random_case(GetParam(), rng);
    const RunStats st = run_case(c, rng());
    total.steps += st.steps;
    total.preemptions += st.preemptions;
    total.chunked_prefills += st.chunked_prefills;
    total.aborts += st.aborts;
    if (HasFailure()) {
      ADD_FAILURE() << "workload " << w << " (" << c.reqs.size() << " requests, " << c.num_blocks
                    << " blocks of " << c.block_size << ")";
      return;
    }
  }
  RecordProperty("steps", std::to_string(total.steps));
  RecordProperty("preemptions", std::to_string(total.preemptions));
  RecordProperty("chunked_prefills", std::to_string(total.chunked_prefills));
  RecordProperty("aborts", std::to_string(total.aborts));
  // The tight caches must actually have exercised preemption (orca reserves max_model_len per
  // request and never preempts), and sarathi must have chunked.
  if (GetParam() == fs::Policy::kOrca)
    EXPECT_EQ(total.preemptions, 0);
  else
    EXPECT_GT(total.preemptions, 0);
  EXPECT_GT(total.aborts, 0);
  if (GetParam() == fs::Policy::kSarathi || GetParam() == fs::Policy::kVllmV1) {
    EXPECT_GT(total.chunked_prefills, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, RandomWorkloads,
                         ::testing::Values(fs::Policy::kSarathi, fs::Policy::kVllmV1,
                                           fs::Policy::kVllmV0, fs::Policy::kOrca,
                                           fs::Policy::kStatic),
                         [](const auto& info) {
                           std::string name = fs::to_string(info.param);
                           for (char& ch : name)
                             if (ch == '-') ch = '_';  // a test name is an identifier
                           return name;
                         });

// One long-running decode, then a long prompt arrives. Returns, for each step after the arrival
// until the prompt's first token, whether the decode was in the step.
std::vector<bool> decode_presence(fs::Policy policy) {
  fs::SchedulerConfig cfg;
  cfg.policy = policy;
  cfg.max_model_len = 4096;
  cfg.max_tokens_per_step = policy == fs::Policy::kSarathi ? 256 : 4096;
  cfg.chunk_tile = 1;
  fs::BlockManager bm(1024, 16);
  auto sched = fs::Scheduler::create(cfg, bm);
  sched->add(make_req(0, 8, 100));
  std::vector<int32_t> tok(8, 7);
  double t = 0;
  for (int i = 0; i < 3; ++i) sched->complete(sched->schedule(t), tok, t + 1), t += 1;
  sched->add(make_req(1, 2000, 10));
  std::vector<bool> present;
  for (;;) {
    fs::Batch b = sched->schedule(t);
    bool decode = false, prompt_done = false;
    for (const auto& e : b.entries) {
      decode |= e.seq->id == 0;
      prompt_done |= e.seq->id == 1 && e.samples;
    }
    present.push_back(decode);
    sched->complete(b, tok, t + 1);
    t += 1;
    if (prompt_done) break;
  }
  return present;
}

TEST(Scheduler, VllmV0StallsDecodesWhileAPromptRuns) {
  const auto p = decode_presence(fs::Policy::kVllmV0);
  ASSERT_EQ(p.size(), 1u);  // the whole prompt in one step...
  EXPECT_FALSE(p[0]);       // ...in which the running decode does not advance
}

TEST(Scheduler, SarathiKeepsDecodingThroughAChunkedPrompt) {
  const auto p = decode_presence(fs::Policy::kSarathi);
  // 2000 prompt tokens at 255 a step (256 minus the decode): 8 chunks, the decode in each.
  EXPECT_EQ(p.size(), 8u);
  for (bool b : p) EXPECT_TRUE(b);
}

TEST(Scheduler, OrcaMixesWholePromptsWithDecodes) {
  const auto p = decode_presence(fs::Policy::kOrca);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(p[0]);
}

TEST(Scheduler, SarathiChunksAreTileMultiplesAndFillTheBudget) {
  fs::SchedulerConfig cfg;
  cfg.max_tokens_per_step = 256;
  cfg.max_running = 8;
  cfg.chunk_tile = 64;
  cfg.max_model_len = 2048;
  fs::BlockManager bm(512, 16);
  auto sched = fs::Scheduler::create(cfg, bm);
  std::vector<int32_t> tok(16, 3);
  // Three short requests become decodes first.
  for (int i = 0; i < 3; ++i) sched->add(make_req(i, 10, 50));
  sched->complete(sched->schedule(0), tok, 1);
  sched->add(make_req(9, 500, 5));
  std::vector<int64_t> chunks;
  for (int step = 0; step < 3; ++step) {
    fs::Batch b = sched->schedule(step + 1);
    EXPECT_EQ(b.num_decode_tokens(), 3);
    for (const auto& e : b.entries)
      if (e.seq->id == 9) chunks.push_back(e.q_len);
    sched->complete(b, tok, step + 2);
  }
  // 253 tokens left each step -> 192 (a multiple of 64); the last chunk (116) is not rounded.
  EXPECT_EQ(chunks, (std::vector<int64_t>{192, 192, 116}));
}

TEST(Scheduler, StaticWaitsForTheWholeBatchToFinish) {
  fs::SchedulerConfig cfg;
  cfg.policy = fs::Policy::kStatic;
  cfg.max_model_len = 256;
  cfg.max_tokens_per_step = 256;
  fs::BlockManager bm(256, 16);
  auto sched = fs::Scheduler::create(cfg, bm);
  sched->add(make_req(0, 10, 2));
  sched->add(make_req(1, 10, 6));
  std::vector<int32_t> tok(4, 1);
  double t = 0;
  sched->complete(sched->schedule(t), tok, t + 1), t += 1;
  sched->add(make_req(2, 10, 1));  // arrives while the first batch runs
  int steps_until_admitted = 0;
  for (;; ++steps_until_admitted) {
    fs::Batch b = sched->schedule(t);
    bool admitted = false;
    for (const auto& e : b.entries) admitted |= e.seq->id == 2;
    sched->complete(b, tok, t + 1), t += 1;
    if (admitted) break;
  }
  EXPECT_EQ(steps_until_admitted, 5);  // request 1 needs 5 more decodes after its first token
}

TEST(Scheduler, PreemptionRecomputesAndStillFinishesExactly) {
  fs::SchedulerConfig cfg;
  cfg.max_tokens_per_step = 64;
  cfg.max_running = 4;
  cfg.max_model_len = 64;
  cfg.chunk_tile = 1;
  fs::BlockManager bm(5, 16, 0.0);  // 80 slots: two 40-token sequences cannot both finish
  auto sched = fs::Scheduler::create(cfg, bm);
  sched->add(make_req(0, 20, 20));
  sched->add(make_req(1, 20, 20));
  std::vector<int32_t> tok(4, 5);
  int64_t preempted = 0;
  std::vector<std::unique_ptr<fs::Sequence>> done;
  for (double t = 0; sched->has_work() && t < 1000; t += 1) {
    fs::Batch b = sched->schedule(t);
    preempted += static_cast<int64_t>(b.preempted.size());
    for (auto& s : sched->complete(b, tok, t + 1)) done.push_back(std::move(s));
    bm.check_invariants(sched->live());
  }
  EXPECT_GT(preempted, 0);
  ASSERT_EQ(done.size(), 2u);
  for (auto& s : done) EXPECT_EQ(s->num_generated(), 20);
  // The later request is the victim: it recomputed its prompt and what it had generated.
  EXPECT_EQ(done[1]->id, 1);
  EXPECT_GT(done[1]->num_preemptions, 0);
  EXPECT_EQ(done[0]->num_preemptions, 0);
}

TEST(Scheduler, PreemptsTheLowestPrioritySequenceFirst) {
  // A (4-token prompt), B (2) and C, D (1) each take one block of 4; one block is left, which A's
  // fifth token takes. When B then needs its second block (C and D need theirs a step later), C
  // and D are both outside the batch so far; the victim must be D, the most recently admitted.
  fs::SchedulerConfig cfg;
  cfg.max_tokens_per_step = 64;
  cfg.max_running = 4;
  cfg.max_model_len = 16;
  cfg.chunk_tile = 1;
  fs::BlockManager bm(5, 4, 0.0);
  auto sched = fs::Scheduler::create(cfg, bm);
  sched->add(make_req(0, 4, 10));
  sched->add(make_req(1, 2, 10));
  for (int64_t id = 2; id <= 3; ++id) sched->add(make_req(id, 1, 10));
  std::vector<int32_t> tok(4, 5);
  std::vector<int64_t> first_preempted;
  for (int step = 0; step < 10 && first_preempted.empty(); ++step) {
    fs::Batch b = sched->schedule(step);
    first_preempted = b.preempted;
    sched->complete(b, tok, step + 1);
    bm.check_invariants(sched->live());
  }
  EXPECT_EQ(first_preempted, (std::vector<int64_t>{3}));
}

TEST(Scheduler, RejectsRequestsLongerThanTheModel) {
  fs::SchedulerConfig cfg;
  cfg.max_model_len = 1000;
  fs::BlockManager bm(100, 16);
  auto sched = fs::Scheduler::create(cfg, bm);
  try {
    sched->add(make_req(42, 900, 101));
    FAIL() << "accepted a request longer than max_model_len";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "request 42");
    EXPECT_NE(std::string(e.what()).find("exceeds max_model_len 1000"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(sched->add(make_req(1, 0, 10)), Error);  // empty prompt
  EXPECT_THROW(sched->add(make_req(2, 10, 0)), Error);  // no output
  EXPECT_NO_THROW(sched->add(make_req(3, 900, 100)));   // exactly the limit
  EXPECT_EQ(sched->num_waiting(), 1);
}

TEST(Scheduler, BadConfigsNameTheField) {
  auto field_of = [](fs::SchedulerConfig cfg, int64_t blocks = 1000) {
    try {
      fs::BlockManager bm(blocks, 16);
      fs::Scheduler::create(cfg, bm);
    } catch (const Error& e) {
      return e.argument();
    }
    return std::string("accepted");
  };
  fs::SchedulerConfig ok;
  EXPECT_EQ(field_of(ok), "accepted");
  fs::SchedulerConfig c = ok;
  c.max_tokens_per_step = 100;
  c.max_running = 200;  // sarathi could not fit every decode
  EXPECT_EQ(field_of(c), "max_tokens_per_step");
  c = ok;
  c.policy = fs::Policy::kVllmV0;  // 512 < max_model_len 8192: a prompt might never fit
  EXPECT_EQ(field_of(c), "max_tokens_per_step");
  c = ok;
  c.policy = fs::Policy::kVllmV1;
  c.max_running = 600;  // vLLM refuses max_num_batched_tokens < max_num_seqs
  EXPECT_EQ(field_of(c), "max_tokens_per_step");
  c = ok;
  c.long_prefill_token_threshold = 64;  // sarathi has no such cap
  EXPECT_EQ(field_of(c), "long_prefill_token_threshold");
  c = ok;
  c.policy = fs::Policy::kVllmV1;
  c.long_prefill_token_threshold = -1;
  EXPECT_EQ(field_of(c), "long_prefill_token_threshold");
  c.long_prefill_token_threshold = 64;
  EXPECT_EQ(field_of(c), "accepted");
  c = ok;
  c.max_running = 0;
  EXPECT_EQ(field_of(c), "max_running");
  c = ok;
  c.chunk_tile = 0;
  EXPECT_EQ(field_of(c), "chunk_tile");
  EXPECT_EQ(field_of(ok, 100), "num_blocks");  // 1600 slots < max_model_len 8192
  try {
    fs::parse_policy("fcfs");
    ADD_FAILURE() << "accepted policy fcfs";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "policy");
    EXPECT_NE(std::string(e.what()).find("vllm-v1"), std::string::npos) << e.what();
  }
  for (fs::Policy p : fs::all_policies()) EXPECT_EQ(fs::parse_policy(fs::to_string(p)), p);
}

}  // namespace

namespace {

TEST(Scheduler, StopTokenFinishesEarly) {
  fs::SchedulerConfig cfg;
  cfg.max_model_len = 256;
  fs::BlockManager bm(64, 16);
  auto sched = fs::Scheduler::create(cfg, bm);
  auto r = make_req(0, 10, 50);
  r->stop_tokens = {2};
  sched->add(std::move(r));
  std::vector<std::unique_ptr<fs::Sequence>> done;
  const std::vector<int32_t> tokens = {7, 9, 2, 5};
  for (size_t step = 0; done.empty() && step < tokens.size(); ++step) {
    fs::Batch b = sched->schedule(double(step));
    done = sched->complete(b, {tokens[step]}, double(step + 1));
  }
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->generated, (std::vector<int32_t>{7, 9, 2}));
  EXPECT_EQ(done[0]->finish_reason, fs::FinishReason::kStop);
  EXPECT_EQ(bm.num_free(), 64);
}

TEST(Scheduler, AbortFreesBlocksFromEitherQueue) {
  fs::SchedulerConfig cfg;
  cfg.max_model_len = 256;
  cfg.max_running = 1;
  fs::BlockManager bm(64, 16);
  auto sched = fs::Scheduler::create(cfg, bm);
  sched->add(make_req(0, 40, 10));
  sched->add(make_req(1, 40, 10));
  fs::Batch b = sched->schedule(0);  // 0 runs, 1 waits (max_running 1)
  sched->complete(b, {1}, 1);
  EXPECT_GT(bm.num_used(), 0);
  auto w = sched->abort(1, 1.5);
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->aborted);
  auto r = sched->abort(0, 1.5);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state, fs::SeqState::kFinished);
  EXPECT_TRUE(r->block_table.empty());
  EXPECT_EQ(bm.num_free(), 64);
  EXPECT_FALSE(sched->has_work());
  EXPECT_EQ(sched->abort(0, 2), nullptr);
  bm.check_invariants(sched->live());
  EXPECT_THROW(fs::compute_metrics({r.get()}), Error);  // aborted requests are not measured
}

}  // namespace
