// Tensor parallelism emulated on the CPU runner (make_cpu_runner(dir, N): N ranks as threads, the
// in-process all-reduce and all-gather): TP=2 and TP=4 logits against TP=1's and the float64
// reference's over a prefill step and decode steps (each rank's KV pool holding its heads), on
// fresh random checkpoints of every architecture; a failed step leaves the group usable; sizes
// that do not split the model are refused by name.
//
// The tolerance, from the arithmetic. TP=N changes no term of the computation, only the order of
// some additions: every column-parallel GEMM output, attention head, norm and LM-head logit is the
// same dot product over the same k in the same order (cpu_linear.h: the sum over k runs in one
// order for any column block), while o_proj and down_proj sum their K terms as N partial sums of
// K / N terms added in rank order, then add the result to the residual once. Any order of a
// K-term float32 dot product lies within gamma_K sum |x_k w_k| of the exact value (gamma_K =
// K u / (1 - K u), u = 2^-24; local_communicator_test.cc checks this bound on the split GEMM
// itself), so the split widens no error bound of the model: TP=N must meet the tolerance TP=1
// meets against the float64 reference (forward_case.h's kRelTol, 3e-5 of the logits' RMS), and
// by the triangle inequality the two differ by at most twice it. A real defect (a head's KV read
// from the wrong rank, a vocabulary block misplaced, a partial sum lost) moves logits by 1-100%.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "flashserve/error.h"
#include "forward_case.h"
#include "model/forward_batch.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model/runner.h"
#include "model/shape.h"
#include "model/tensor_parallel.h"
#include "reference_model.h"
#include "test_dirs.h"

namespace flashserve::model {
namespace {

using testing::compare;
using testing::Diff;
using testing::fresh_dir;
using testing::kRelTol;
using testing::make_seqs;
using testing::ref_forward;
using testing::ref_load;
using testing::RefModel;
using testing::Seq;
using testing::small_config;

// forward_case.h's model with a vocabulary that neither 2 nor 4 divides (the last rank's block is
// short, and the gather's padding must not show) and 4 query heads (TP=4: one a rank).
ModelConfig tp_config(const std::string& variant) {
  ModelConfig c = small_config(variant);
  c.vocab_size = 301;
  c.validate();
  return c;
}

class TensorParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallel, LogitsEqualTp1sWithinFloatRoundingOverPrefillAndDecodes) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelConfig c = tp_config(GetParam());
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const std::string dir = fresh_dir(GetParam());
    RandomCheckpointOptions opt;
    opt.seed = rng();
    opt.dtype = dtype;
    write_random_checkpoint(c, dir, opt);
    const RefModel ref = ref_load(dir);
    auto whole = make_cpu_runner(dir);
    for (int tp : {2, 4}) {
      // KV heads per rank: split (llama3's 4 at TP=2 and 4), replicated (qwen2's one everywhere,
      // llama's 2 at TP=4).
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ", TP=" + std::to_string(tp));
      auto split = make_cpu_runner(dir, tp);
      EXPECT_EQ(split->config(), whole->config());
      const int32_t block_size = dtype == DType::kFloat32 ? 16 : 5;
      const std::vector<int64_t> lens = {1, 17, 33};
      const int64_t decode_steps = 3;
      int64_t num_blocks = 0;
      std::vector<Seq> seqs =
          make_seqs(rng, lens, c.vocab_size, block_size, 33 + decode_steps, &num_blocks);
      whole->allocate_kv(num_blocks, block_size);
      split->allocate_kv(num_blocks, block_size);
      for (int64_t step = 0; step <= decode_steps; ++step) {
        const ForwardBatch batch =
            testing::prefill_then_decode_step(seqs, step, block_size, c.vocab_size, rng);
        whole->forward(batch);
        split->forward(batch);
        const std::vector<float> want = whole->logits(), got = split->logits();
        ASSERT_EQ(got.size(), seqs.size() * static_cast<size_t>(c.vocab_size));
        for (size_t i = 0; i < seqs.size(); ++i) {
          const auto tr = ref_forward(ref, seqs[i].tokens);
          const float* g = got.data() + i * c.vocab_size;
          const Diff to_ref = compare(g, tr.logits.back());
          ASSERT_GT(to_ref.rms, 0.1);
          EXPECT_LE(to_ref.max_abs, kRelTol * to_ref.rms)
              << "step " << step << " sequence " << i << " against the float64 reference";
          const std::vector<double> w(want.begin() + i * c.vocab_size,
                                      want.begin() + (i + 1) * c.vocab_size);
          const Diff to_tp1 = compare(g, w);
          EXPECT_LE(to_tp1.max_abs, 2 * kRelTol * to_tp1.rms)
              << "step " << step << " sequence " << i << " against TP=1: max |diff| "
              << to_tp1.max_abs << ", logit RMS " << to_tp1.rms;
        }
      }
      // The logits a request's logprobs read are the same rows.
      const std::vector<float> rows = split->logits_rows({2, 0});
      const std::vector<float> all = split->logits();
      ASSERT_EQ(rows.size(), 2 * static_cast<size_t>(c.vocab_size));
      EXPECT_TRUE(
          std::equal(rows.begin(), rows.begin() + c.vocab_size, all.begin() + 2 * c.vocab_size));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, TensorParallel,
                         ::testing::Values("llama", "qwen2", "llama3", "mistral", "qwen3"));

// A batch one rank refuses (every rank does: they check the same batch) ends the step with that
// error, not the abort's; the group is usable for the next step, which matches TP=1.
TEST(TensorParallelErrors, ARefusedBatchLeavesTheRanksUsable) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  const ModelConfig c = tp_config("llama");
  const std::string dir = fresh_dir("err");
  write_random_checkpoint(c, dir, {});
  auto whole = make_cpu_runner(dir);
  auto split = make_cpu_runner(dir, 2);
  whole->allocate_kv(4, 16);
  split->allocate_kv(4, 16);
  const std::vector<int32_t> bad = {1, static_cast<int32_t>(c.vocab_size)}, good = {5, 7, 11};
  ForwardBatchBuilder b(16);
  b.add(bad.data(), 0, 2, {0}, true);
  try {
    split->forward(std::move(b).build());
    FAIL() << "a token outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "batch.input_ids") << e.what();
  }
  for (auto* r : {whole.get(), split.get()}) {
    ForwardBatchBuilder g(16);
    g.add(good.data(), 0, 3, {1}, true);
    r->forward(std::move(g).build());
  }
  const std::vector<float> want = whole->logits(), got = split->logits();
  ASSERT_EQ(got.size(), want.size());
  const Diff d = compare(got.data(), std::vector<double>(want.begin(), want.end()));
  EXPECT_LE(d.max_abs, 2 * kRelTol * d.rms);
}

TEST(TensorParallelErrors, SizesThatDoNotSplitTheModelAreRefusedByName) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  const std::string dir = fresh_dir("size");
  write_random_checkpoint(tp_config("llama"), dir, {});  // 4 query heads, 2 KV heads
  for (int tp : {3, 8, 0}) {
    try {
      make_cpu_runner(dir, tp);
      ADD_FAILURE() << "TP=" << tp << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "tensor_parallel_size") << e.what();
    }
  }
}

// The cost model's sizes of one rank: what each GPU holds. Mistral-7B's dimensions with a
// vocabulary that 2 does not divide; every figure recomputed here from Megatron's split.
TEST(TensorParallelShape, ARankHoldsItsSliceOfEveryMatmulAndTheWholeEmbedding) {
  ModelShape m;
  m.name = "m";
  m.layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 8, m.head_dim = 128, m.ffn = 14336;
  m.vocab = 32001, m.max_context = 8192;
  const int64_t hd = m.head_dim;
  for (int64_t tp : {1, 2, 4, 8, 16}) {
    SCOPED_TRACE("TP=" + std::to_string(tp));
    const ModelShape r = rank_model_shape(m, tp);
    const int64_t heads = 32 / tp, kv = tp <= 8 ? 8 / tp : 1, ffn = 14336 / tp;
    const int64_t lm_rows = (32001 + tp - 1) / tp;
    const int64_t layer =
        4096 * heads * hd + 2 * 4096 * kv * hd + heads * hd * 4096 + 3 * 4096 * ffn;
    EXPECT_EQ(r.weight_bytes(), (32 * layer + 4096 * lm_rows + 4096 * 32001) * 2);
    EXPECT_EQ(r.kv_bytes_per_token(), 2 * 32 * kv * hd * 2);
    if (tp <= 8)  // KV heads split, not replicated: the ranks' matmuls add up to the model's
      EXPECT_EQ(tp * r.layer_linear_params(), m.layer_linear_params());
  }
  for (int64_t tp : {3, 64, 0}) {
    try {
      rank_model_shape(m, tp);
      ADD_FAILURE() << "TP=" << tp << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "tensor_parallel_size") << e.what();
    }
  }
}

// Yi-34B, Sarathi-Serve's model for two GPUs, splits where its runs did (2 ranks) and further:
// 56 query heads, 8 KV heads, 20480 MLP columns; 16 ranks would cut the heads unevenly.
TEST(TensorParallelShape, YiSplitsOverTwoFourAndEightRanks) {
  const ModelConfig c = preset_config("yi-34b");
  for (int64_t tp : {2, 4, 8}) {
    SCOPED_TRACE("TP=" + std::to_string(tp));
    const RankShape r = rank_shape(c, tp, tp - 1);
    EXPECT_EQ(r.q_heads * tp, 56);
    EXPECT_EQ(r.kv_heads * tp, 8);
    EXPECT_EQ(r.ffn * tp, 20480);
    EXPECT_EQ(r.q_head_begin / (56 / 8), r.kv_head_begin);  // its query heads read its KV heads
  }
  try {
    check_tensor_parallel(c, 16);
    ADD_FAILURE() << "TP=16 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "tensor_parallel_size") << e.what();
  }
}

}  // namespace
}  // namespace flashserve::model
