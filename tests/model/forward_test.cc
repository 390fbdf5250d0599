// The CPU forward against the float64 reference of tests/model/reference_model.h (an independent
// implementation), on small random models that cover each architecture's features (GQA, q/k/v bias,
// tied head, llama3 RoPE scaling, a sliding window), with mixed batches of prefills and decodes in
// a shuffled paged pool; and chunked prefill giving the same logits as whole prefill.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "flashserve/error.h"
#include "forward_case.h"
#include "model/forward_batch.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model/runner.h"
#include "reference_model.h"
#include "support/worst.h"
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

class CpuForward : public ::testing::TestWithParam<std::string> {};

TEST_P(CpuForward, MatchesFloat64ReferenceOverPrefillAndDecodeSteps) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelConfig c = small_config(GetParam());
  // float32 weights, and bf16 ones (which the runner keeps in bf16 and widens in its GEMM where
  // the CPU has AVX-512; the reference reads the same bf16 values, so the tolerance is the same).
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const std::string dir = fresh_dir(GetParam());
    RandomCheckpointOptions opt;
    opt.seed = seed;
    opt.dtype = dtype;
    write_random_checkpoint(c, dir, opt);
    const RefModel ref = ref_load(dir);
    auto runner = make_cpu_runner(dir);

    for (int32_t block_size : {16, 5}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ", block_size " + std::to_string(block_size));
      const std::vector<int64_t> lens = {1, 17, 33};
      const int64_t decode_steps = 3;
      int64_t num_blocks = 0;
      std::vector<Seq> seqs =
          make_seqs(rng, lens, c.vocab_size, block_size, 33 + decode_steps, &num_blocks);
      runner->allocate_kv(num_blocks, block_size);
      for (int64_t step = 0; step <= decode_steps; ++step) {
        const ForwardBatch batch =
            testing::prefill_then_decode_step(seqs, step, block_size, c.vocab_size, rng);
        runner->forward(batch);
        const std::vector<float> logits = runner->logits();
        ASSERT_EQ(logits.size(), seqs.size() * static_cast<size_t>(c.vocab_size));
        for (size_t i = 0; i < seqs.size(); ++i) {
          const auto tr = ref_forward(ref, seqs[i].tokens);
          const Diff d = compare(logits.data() + i * c.vocab_size, tr.logits.back());
          ASSERT_GT(d.rms, 0.1);  // the reference's logits are not degenerate
          EXPECT_LE(d.max_abs, kRelTol * d.rms)
              << "step " << step << " sequence " << i << " (length " << seqs[i].tokens.size()
              << "): max |diff| " << d.max_abs << ", logit RMS " << d.rms;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, CpuForward,
                         ::testing::Values("llama", "qwen2", "llama3", "mistral", "qwen3", "yarn"));

// The same prompt prefilled whole in one step, and in chunks mixed into steps with other
// sequences' decodes (as Sarathi schedules it): the same logits after the prompt and after each
// later decode, to float32 rounding (the chunks change only the GEMMs' row counts and the order of
// the attention's key blocks).
TEST(CpuForwardChunking, ChunkedPrefillEqualsWholePrefill) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("FLASHSERVE_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const ModelConfig c = small_config("llama");
  const std::string dir = fresh_dir("chunk");
  RandomCheckpointOptions opt;
  opt.seed = seed;
  opt.dtype = DType::kBFloat16;
  write_random_checkpoint(c, dir, opt);
  auto whole = make_cpu_runner(dir);
  auto chunked = make_cpu_runner(dir);
  const int32_t bs = 8;
  const int64_t prompt_len = 61, decodes = 4;
  int64_t num_blocks = 0;
  // Sequence 0 is the prompt under test; 1 and 2 are running decodes in the chunked runner.
  std::vector<Seq> seqs =
      make_seqs(rng, {prompt_len, 9, 20}, c.vocab_size, bs, prompt_len + 64, &num_blocks);
  whole->allocate_kv(num_blocks, bs);
  chunked->allocate_kv(num_blocks, bs);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));

  ForwardBatchBuilder w(bs);
  w.add(seqs[0].tokens.data(), 0, prompt_len, seqs[0].blocks, true);
  const ForwardBatch wb = std::move(w).build();
  whole->forward(wb);
  const std::vector<float> want = whole->logits();

  // The other two sequences' prompts first, then sequence 0 in chunks of random sizes (at least
  // three chunks), each step also decoding sequences 1 and 2.
  {
    ForwardBatchBuilder b(bs);
    for (int i : {1, 2})
      b.add(seqs[i].tokens.data(), 0, seqs[i].tokens.size(), seqs[i].blocks, true);
    chunked->forward(std::move(b).build());
  }
  std::vector<int64_t> cuts = {0, prompt_len};
  while (cuts.size() < 5) {
    const int64_t cut = std::uniform_int_distribution<int64_t>(1, prompt_len - 1)(rng);
    if (std::find(cuts.begin(), cuts.end(), cut) == cuts.end()) cuts.push_back(cut);
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<float> got;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    ForwardBatchBuilder b(bs);
    for (int i : {1, 2}) {  // decodes first, as the scheduler orders them
      seqs[i].tokens.push_back(tok(rng));
      const int64_t n = static_cast<int64_t>(seqs[i].tokens.size());
      b.add(seqs[i].tokens.data() + n - 1, n - 1, 1, seqs[i].blocks, true);
    }
    const bool last = k + 2 == cuts.size();
    b.add(seqs[0].tokens.data() + cuts[k], cuts[k], cuts[k + 1] - cuts[k], seqs[0].blocks, last);
    const ForwardBatch batch = std::move(b).build();
    chunked->forward(batch);
    const std::vector<float> l = chunked->logits();
    ASSERT_EQ(l.size(), static_cast<size_t>((last ? 3 : 2) * c.vocab_size));
    if (last) got.assign(l.begin() + 2 * c.vocab_size, l.end());
  }
  auto check = [&](const std::vector<float>& a, const std::vector<float>& b, const char* when) {
    double max_abs = 0, rms = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_abs = flashserve::testing::worse(max_abs, std::fabs(static_cast<double>(a[i]) - b[i]));
      rms += static_cast<double>(a[i]) * a[i];
    }
    rms = std::sqrt(rms / static_cast<double>(a.size()));
    EXPECT_LE(max_abs, kRelTol * rms) << when << ": max |diff| " << max_abs << ", RMS " << rms;
  };
  check(want, got, "after the prompt");
  // Then decodes of sequence 0 on both runners: its cache written in chunks must read back the
  // same.
  for (int64_t step = 0; step < decodes; ++step) {
    seqs[0].tokens.push_back(tok(rng));
    const int64_t n = static_cast<int64_t>(seqs[0].tokens.size());
    ForwardBatchBuilder a(bs), b(bs);
    a.add(seqs[0].tokens.data() + n - 1, n - 1, 1, seqs[0].blocks, true);
    b.add(seqs[0].tokens.data() + n - 1, n - 1, 1, seqs[0].blocks, true);
    whole->forward(std::move(a).build());
    chunked->forward(std::move(b).build());
    check(whole->logits(), chunked->logits(), "decode");
  }
}

TEST(CpuForwardErrors, BatchesThatDoNotFitThePoolOrModelAreRefused) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  const std::string dir = fresh_dir("err");
  write_random_checkpoint(small_config("llama"), dir, {});
  auto r = make_cpu_runner(dir);
  const std::vector<int32_t> blocks = {0, 1};
  auto batch = [&](std::vector<int32_t> tokens, std::vector<int32_t> bl) {
    ForwardBatchBuilder b(4);
    b.add(tokens.data(), 0, static_cast<int64_t>(tokens.size()), bl, true);
    return std::move(b).build();
  };
  EXPECT_THROW(r->forward(batch({1, 2}, blocks)), Error);  // no pool yet
  r->allocate_kv(2, 4);
  r->forward(batch({1, 2, 3}, blocks));
  EXPECT_EQ(r->logits().size(), 300u);
  EXPECT_EQ(r->sample(batch({1, 2, 3}, blocks), {SamplingParams{}}).size(), 1u);
  EXPECT_THROW(r->sample(batch({1, 2, 3}, blocks), {}), Error);  // one params per row
  EXPECT_THROW(r->forward(batch({1, 300}, blocks)), Error);      // token outside the vocabulary
  EXPECT_THROW(r->forward(batch({-1}, blocks)), Error);
  EXPECT_THROW(r->forward(batch({1, 2}, {0, 2})), Error);  // block 2 of a 2-block pool
  EXPECT_THROW(r->forward(batch({1, 2, 3, 4, 5}, {0, 5})), Error);
  ForwardBatch bad = batch({1, 2}, blocks);
  bad.positions[1] = 7;  // not the position its kv_len implies
  EXPECT_THROW(r->forward(bad), Error);
  bad = batch({1, 2}, blocks);
  bad.cu_seqlens_q.back() = 1;
  EXPECT_THROW(r->forward(bad), Error);
}

}  // namespace
}  // namespace flashserve::model
