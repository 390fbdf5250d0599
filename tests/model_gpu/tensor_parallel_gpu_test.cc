// The CUDA runner's tensor-parallel ranks (model/cuda/cuda_runner.h, load's comm) against the
// whole model, on as many GPUs as the machine has:
//   - one GPU: the ranks share it, joined by the staged group (model/cuda/staged_communicator.h;
//     NCCL refuses two ranks on one device). TP = 2 and 4 against TP = 1 and against the CPU
//     runner's float32, on `tiny` (GQA; at 4 ranks each KV head replicated over two) and on a
//     Qwen2-like model (q/k/v biases, a tied LM head, a vocabulary neither 2 nor 4 divides).
//   - one GPU, NCCL: a group of one rank, so the runner's collectives are NCCL's and its steps
//     CUDA graphs with NCCL nodes in them; bit for bit the runner without a communicator.
//   - two GPUs or more (nvidia-h200-x2): NCCL ranks on GPUs 0 and 1 through make_cuda_runner,
//     graphs on; skipped below two.
// The refusals by name need no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "flashserve/error.h"
#include "model/cuda/cuda_runner.h"
#include "model/cuda/staged_communicator.h"
#include "model/forward_batch.h"
#include "model/nccl_communicator.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model/runner.h"
#include "model/tensor_parallel_runner.h"
#include "model_gpu/tiny_model.h"
#include "support/cuda_skip.h"

namespace flashserve::testing {
namespace {

using model::ForwardBatch;
using model::ForwardBatchBuilder;
using model::ModelRunner;

constexpr int32_t kBlock = 16;

std::vector<int32_t> random_tokens(size_t n, int64_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

// What one schedule gives: every step's logits (rows of the step's sample rows) and greedy
// tokens. Prompt a is prefilled in chunks of `chunk` (0: whole) while b, prefilled first, decodes
// in the same steps; then `decodes` decode-only steps of both (the ones CUDA graphs take).
struct Outcome {
  std::vector<std::vector<float>> logits;  // one per step, [rows, vocab]
  std::vector<std::vector<int32_t>> tokens;
};

Outcome run_schedule(ModelRunner& r, int64_t chunk, int64_t decodes) {
  const int64_t vocab = r.config().vocab_size, per_seq = 32;
  const auto a = random_tokens(200 + decodes, vocab, 11),
             b = random_tokens(40 + decodes, vocab, 12);
  r.allocate_kv(2 * per_seq, kBlock);
  Outcome out;
  auto step = [&](ForwardBatchBuilder& bb) {
    const ForwardBatch batch = std::move(bb).build();
    r.forward(batch);
    out.logits.push_back(r.logits());
    out.tokens.push_back(
        r.sample(batch, std::vector<model::SamplingParams>(batch.sample_rows.size())));
  };
  const int64_t a_prompt = 200, b_prompt = 20;
  {
    ForwardBatchBuilder bb(kBlock);
    bb.add(b.data(), 0, b_prompt, sequence_blocks(1, b_prompt, per_seq, kBlock), true);
    step(bb);
  }
  int64_t done = 0, b_done = b_prompt;
  while (done < a_prompt) {
    const int64_t q = chunk ? std::min(chunk, a_prompt - done) : a_prompt;
    ForwardBatchBuilder bb(kBlock);
    bb.add(a.data() + done, done, q, sequence_blocks(0, done + q, per_seq, kBlock),
           done + q == a_prompt);
    bb.add(b.data() + b_done, b_done, 1, sequence_blocks(1, b_done + 1, per_seq, kBlock), true);
    step(bb);
    done += q;
    ++b_done;
  }
  for (int64_t s = 0; s < decodes; ++s, ++done, ++b_done) {
    ForwardBatchBuilder bb(kBlock);
    bb.add(a.data() + done, done, 1, sequence_blocks(0, done + 1, per_seq, kBlock), true);
    bb.add(b.data() + b_done, b_done, 1, sequence_blocks(1, b_done + 1, per_seq, kBlock), true);
    step(bb);
  }
  return out;
}

// The largest |x - y| over a step's logits, and the RMS of x (the scale the bound is set at).
double max_diff(const std::vector<float>& x, const std::vector<float>& y) {
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i)
    m = std::max(m, std::abs(double(x[i]) - y[i]));
  return std::isnan(m) ? INFINITY : m;
}

// Greedy tokens must agree wherever the reference's top two logits are further apart than twice
// the bound the logits meet (a closer pair may swap under rounding).
void expect_same_greedy(const Outcome& got, const Outcome& want, int64_t vocab, double bound) {
  for (size_t s = 0; s < want.tokens.size(); ++s)
    for (size_t i = 0; i < want.tokens[s].size(); ++i) {
      const float* row = want.logits[s].data() + i * vocab;
      std::vector<float> sorted(row, row + vocab);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      if (sorted[0] - sorted[1] > 2 * bound)
        EXPECT_EQ(got.tokens[s][i], want.tokens[s][i]) << "step " << s << " row " << i;
    }
}

// A Qwen2-like model small enough for CI's GPU tests: q/k/v biases, a tied LM head, 4 query heads
// over 2 KV heads, and a vocabulary of 1001 (padded blocks in the logits' gather at 2 and 4 ranks).
const std::string& qwen_like_dir() {
  static const std::string dir = [] {
    model::ModelConfig c = model::preset_config("tiny");
    c.architecture = "Qwen2ForCausalLM";
    c.attention_bias = true;
    c.tie_word_embeddings = true;
    c.vocab_size = 1001;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    const std::string d = temp_dir("flashserve-gpu-qwen-tp-" + std::to_string(::getpid()));
    model::write_random_checkpoint(c, d);
    return d;
  }();
  return dir;
}

// `size` CUDA ranks of `dir` sharing GPU 0, joined by the staged group.
std::unique_ptr<ModelRunner> staged_ranks(const std::string& dir, int size) {
  auto group = model::cuda::make_staged_group(size);
  std::vector<std::unique_ptr<ModelRunner>> ranks;
  for (int r = 0; r < size; ++r)
    ranks.push_back(model::cuda::CudaRunner::load(dir, 0, &group->rank(r)));
  return model::make_tensor_parallel_runner(std::move(group), std::move(ranks));
}

// bf16 through 4 layers against float32: the CUDA runner's own bound against the CPU runner
// (runner_gpu_test.cc); the ranks round each partial sum to bf16 before the all-reduce, a
// rounding of the same size as the ones TP = 1 makes.
constexpr double kVsCpu = 0.15;

TEST(GpuTensorParallel, StagedRanksOnOneGpuMatchTheWholeModel) {
  SKIP_WITHOUT_CUDA();
  for (const std::string& dir : {tiny_checkpoint_dir(), qwen_like_dir()}) {
    std::unique_ptr<ModelRunner> cpu;
    try {
      cpu = model::make_cpu_runner(dir);
    } catch (const Error& e) {  // a build without OpenBLAS has no CPU runner
      if (e.kind() == ErrorKind::kUnsupported) GTEST_SKIP() << e.what();
      throw;
    }
    const int64_t vocab = cpu->config().vocab_size;
    const Outcome want = run_schedule(*cpu, 64, 6);
    auto whole = model::make_cuda_runner(dir, 0);
    const Outcome one = run_schedule(*whole, 64, 6);
    for (int size : {2, 4}) {
      SCOPED_TRACE(dir + ", " + std::to_string(size) + " ranks");
      auto tp = staged_ranks(dir, size);
      EXPECT_EQ(tp->config().vocab_size, vocab);
      const Outcome got = run_schedule(*tp, 64, 6);
      ASSERT_EQ(got.logits.size(), want.logits.size());
      for (size_t s = 0; s < want.logits.size(); ++s) {
        EXPECT_LT(max_diff(got.logits[s], want.logits[s]), kVsCpu) << "step " << s << " vs cpu";
        EXPECT_LT(max_diff(got.logits[s], one.logits[s]), kVsCpu) << "step " << s << " vs TP=1";
      }
      expect_same_greedy(got, want, vocab, kVsCpu);
      EXPECT_EQ(tp->graph_counts(), (std::pair<int64_t, int64_t>{0, 0}))
          << "the staged group waits on the host: no step may be captured";
    }
  }
}

// A group of one NCCL rank: the runner's collectives are NCCL's (identity on one rank) and its
// decode and mixed steps CUDA graphs with NCCL's nodes in them, bit for bit the plain runner's.
TEST(GpuTensorParallel, OneNcclRankIsTheWholeModelBitForBit) {
  SKIP_WITHOUT_CUDA();
  if (!model::nccl_available()) GTEST_SKIP() << "skipped: built without NCCL";
  for (const std::string& dir : {tiny_checkpoint_dir(), qwen_like_dir()}) {
    SCOPED_TRACE(dir);
    auto plain = model::cuda::CudaRunner::load(dir, 0);
    auto group = model::make_nccl_group({0});
    std::vector<std::unique_ptr<ModelRunner>> ranks;
    ranks.push_back(model::cuda::CudaRunner::load(dir, 0, &group->rank(0)));
    auto tp = model::make_tensor_parallel_runner(std::move(group), std::move(ranks));
    const Outcome want = run_schedule(*plain, 64, 24), got = run_schedule(*tp, 64, 24);
    ASSERT_EQ(got.logits.size(), want.logits.size());
    for (size_t s = 0; s < want.logits.size(); ++s) {
      EXPECT_EQ(got.logits[s], want.logits[s]) << "step " << s;
      EXPECT_EQ(got.tokens[s], want.tokens[s]) << "step " << s;
    }
    const auto [captures, replays] = tp->graph_counts();
    EXPECT_GE(captures, 1) << "no step of the NCCL rank was captured";
    EXPECT_GE(replays, 16);
  }
}

// nvidia-h200-x2 or larger: ranks on GPUs 0 and 1, NCCL between them, graphs on.
TEST(GpuTensorParallel, NcclRanksOnTwoGpusMatchTheWholeModel) {
  SKIP_WITHOUT_CUDA();
  if (!model::nccl_available()) GTEST_SKIP() << "skipped: built without NCCL";
  if (model::nccl_device_count() < 2) GTEST_SKIP() << "skipped: needs two GPUs (nvidia-h200-x2)";
  for (const std::string& dir : {tiny_checkpoint_dir(), qwen_like_dir()}) {
    SCOPED_TRACE(dir);
    auto whole = model::make_cuda_runner(dir, 0);
    auto tp = model::make_cuda_runner(dir, 0, 2);
    const Outcome want = run_schedule(*whole, 64, 24), got = run_schedule(*tp, 64, 24);
    ASSERT_EQ(got.logits.size(), want.logits.size());
    for (size_t s = 0; s < want.logits.size(); ++s)
      EXPECT_LT(max_diff(got.logits[s], want.logits[s]), kVsCpu) << "step " << s;
    expect_same_greedy(got, want, whole->config().vocab_size, kVsCpu);
    EXPECT_GE(tp->graph_counts().first, 1);
  }
}

// A rank refuses what cannot work with a communicator, by name, and leaves itself usable.
TEST(GpuTensorParallel, RanksRefuseWhatTheSplitCannotDo) {
  SKIP_WITHOUT_CUDA();
  auto group = model::cuda::make_staged_group(2);
  auto r0 = model::cuda::CudaRunner::load(tiny_checkpoint_dir(), 0, &group->rank(0));
  try {
    r0->set_decode_fusion(true, false);
    ADD_FAILURE() << "the fused norm accepted on a rank";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_EQ(e.argument(), "decode_fusion") << e.what();
  }
  r0->set_decode_fusion(false, true);  // silu in the gate/up epilogue needs no sum: accepted
  try {
    r0->set_cuda_graphs(true);
    ADD_FAILURE() << "graphs accepted over the staged group";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "cuda_graphs") << e.what();
  }
}

// Sizes that do not split the model, and more GPUs than the machine has: refused by name before
// any weight loads (no GPU needed).
TEST(TensorParallelCuda, RefusesSizesByName) {
  for (int size : {3, 8}) {  // tiny: 4 query heads
    try {
      model::make_cuda_runner(tiny_checkpoint_dir(), 0, size);
      ADD_FAILURE() << size << " ranks accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "tensor_parallel_size") << e.what();
    }
  }
  if (model::nccl_device_count() >= 4) return;  // a machine with the GPUs would make the ranks
  try {
    model::make_cuda_runner(tiny_checkpoint_dir(), 0, 4);
    ADD_FAILURE() << "4 ranks accepted on " << model::nccl_device_count() << " GPUs";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "tensor_parallel_size") << e.what();
  }
}

}  // namespace
}  // namespace flashserve::testing
