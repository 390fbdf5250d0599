// The CPU path's extra memory does not grow with the sequence length. Measured, not estimated: this
// file replaces the global operator new/delete for the test_attention binary (heap_tracker.h), and
// each test records the peak of live heap bytes during one attention call, with the inputs and
// outputs allocated beforehand. Counted: every operator-new allocation in any thread (the library
// uses std::vector for all its scratch). Not counted: stacks and direct malloc (the library has
// none).
#define FLASHSERVE_DEFINE_HEAP_TRACKER
#include "common/heap_tracker.h"

#include <gtest/gtest.h>

#include "attention/backends.h"
#include "attention/reference/combine.h"
#include "attention/reference/cpu_forward.h"
#include "common/thread_pool.h"
#include "support/attention_case.h"
#include "support/compare.h"

namespace flashserve::testing {
namespace {

CaseSpec square(int64_t n) {
  CaseSpec s;
  s.q_lens = {n};
  s.kv_lens = {n};
  s.h_q = 2;
  s.h_kv = 2;
  s.head_dim = 32;
  s.seed = static_cast<uint64_t>(n);
  return s;
}

// Peak extra heap bytes of one call, beyond what was live before it.
template <typename F>
int64_t peak_extra(F&& call) {
  const int64_t before = heap::current_bytes();
  heap::reset_peak();
  call();
  return heap::peak_bytes() - before;
}

TEST(CpuMemory, TrackerSeesAllocations) {
  const int64_t extra = peak_extra([] { std::vector<char> v(1 << 20); });
  EXPECT_GE(extra, 1 << 20);
  EXPECT_LT(extra, (1 << 20) + 4096);
}

TEST(CpuMemory, ExtraMemoryIsFlatInSequenceLength) {
  {
    AttentionCase warm(square(8));
    attention_forward(warm.params());
  }  // start the pool
  const int workers = ThreadPool::global().size();
  std::vector<int64_t> extras;
  for (int64_t n : {128, 512, 1536}) {
    AttentionCase c(square(n));
    const AttentionParams p = c.params();
    const int64_t extra = peak_extra([&] { attention_forward(p); });
    extras.push_back(extra);
    const auto pr = attention::describe(p);
    const int64_t reported = static_cast<int64_t>(attention::cpu_scratch_bytes(pr, n, workers));
    // The report is what is allocated, up to small bookkeeping (lengths per sequence, and per
    // worker the headers of its workspace vectors and its task: measured 2.8 KB with 16 workers).
    EXPECT_GE(extra, reported) << "n=" << n;
    EXPECT_LE(extra, reported + 2048 + 256 * workers) << "n=" << n;
  }
  EXPECT_EQ(extras[0], extras[1]);
  EXPECT_EQ(extras[1], extras[2]);
  // A long sequence with a sliding window (cheap to run) holds the same.
  CaseSpec s = square(16384);
  s.causal = true;
  s.window_left = 100;
  AttentionCase c(s);
  const AttentionParams p = c.params();
  EXPECT_EQ(peak_extra([&] { attention_forward(p); }), extras[0]);
}

TEST(CpuMemory, NaiveReferenceIsQuadratic) {
  // The same measurement shows the float64 reference holding the N x N score matrix.
  for (int64_t n : {64, 256}) {
    AttentionCase c(square(n));
    const AttentionParams p = c.params();
    const int64_t extra = peak_extra([&] { attention::reference::naive_forward(p); });
    EXPECT_GE(extra, n * n * 8) << "n=" << n;
    EXPECT_LT(extra, n * n * 8 + 64 * n * 32 * 8) << "n=" << n;
  }
}

TEST(CpuMemory, SplitKvPartialsAreLinearAndReported) {
  CaseSpec s = square(1);
  s.kv_lens = {2048};
  s.num_splits = 4;
  AttentionCase c(s);
  const AttentionParams p = c.params();
  const int64_t extra = peak_extra([&] { attention_forward(p); });
  const auto reported = static_cast<int64_t>(
      attention::cpu_scratch_bytes(attention::describe(p), 1, ThreadPool::global().size()));
  EXPECT_GE(extra, reported);
  EXPECT_LE(extra, reported + 4096);
}

// An explicit num_splits over many query rows: the partials of every row at once would be
// O(num_splits x rows) (issue 9: 95 MB of input took 4.2 GB). They are held in chunks of a fixed
// budget; the result still matches the unsplit call.
TEST(CpuMemory, ExplicitSplitsOverManyRowsStayWithinTheBudget) {
  CaseSpec s = square(1);
  s.q_lens = {4096};
  s.kv_lens = {300};
  s.num_splits = 256;
  s.seed = seed_for("many-rows-256-splits");
  AttentionCase c(s);
  const AttentionParams p = c.params();
  const attention::Problem pr = attention::describe(p);
  const int workers = ThreadPool::global().size();
  const int64_t all_rows =
      static_cast<int64_t>(attention::SplitPartials::bytes(256, 4096, pr.h_q, pr.head_dim_v));
  const int64_t extra = peak_extra([&] { attention_forward(p); });
  const auto reported = static_cast<int64_t>(attention::cpu_scratch_bytes(pr, 4096, workers));
  EXPECT_GE(extra, reported);
  EXPECT_LE(extra, reported + 4096 + 256 * workers);
  EXPECT_LE(extra, (int64_t{32} << 20) + 4096 + (int64_t{1} << 20) * workers)
      << "the budget of the partials";
  EXPECT_GT(all_rows, 4 * extra) << "the case must be one the bound matters for";
  // Same result as without splits (the chunks' rows were all combined, each once).
  const NaiveOutput split = read_output(p);
  AttentionParams unsplit = p;
  std::vector<float> out(split.out.size()), lse(split.lse.size());
  unsplit.out.data = out.data();
  unsplit.lse.data = lse.data();
  unsplit.num_splits = 1;
  attention_forward(unsplit);
  const NaiveOutput whole = read_output(unsplit);
  for (size_t i = 0; i < whole.out.size(); ++i) ASSERT_NEAR(split.out[i], whole.out[i], 1e-5) << i;
  for (size_t i = 0; i < whole.lse.size(); ++i) ASSERT_NEAR(split.lse[i], whole.lse[i], 1e-5) << i;
}

}  // namespace
}  // namespace flashserve::testing
