// The CUDA runner on `tiny` (a random checkpoint written by our writer): its logits against the
// CPU runner's (float32) on a mixed batch, chunked prefill mixed with decodes against the whole
// prefill, and the errors a bad batch gets. The rigorous comparison against transformers is
// tests/model_gpu/compare_transformers.py on the GPU machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include <unistd.h>

#include "flashserve/error.h"
#include "model/cuda/cuda_runner.h"
#include "model/forward_batch.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model/runner.h"
#include "model_gpu/device_buffer.h"
#include "model_gpu/tiny_model.h"

namespace flashserve::testing {
namespace {

namespace fs = std::filesystem;
using model::ForwardBatch;
using model::ForwardBatchBuilder;
using model::ModelRunner;

constexpr int32_t kBlock = 16;

// Prefills prompt a (whole or in chunks) while b, already prefilled, decodes in the same steps;
// returns the logits of a's prompt end and of b's every decode.
std::vector<std::vector<float>> run_schedule(ModelRunner& r, const std::vector<int32_t>& a,
                                             const std::vector<int32_t>& b, int64_t chunk) {
  const int64_t per_seq = 64;
  r.allocate_kv(2 * per_seq, kBlock);
  const int64_t vocab = r.config().vocab_size;
  std::vector<std::vector<float>> out;
  const int64_t b_prompt = 20;
  {
    ForwardBatchBuilder bb(kBlock);
    bb.add(b.data(), 0, b_prompt, sequence_blocks(1, b_prompt, per_seq, kBlock), true);
    r.forward(std::move(bb).build());
    out.push_back(r.logits());
  }
  int64_t done = 0, b_done = b_prompt;
  while (done < static_cast<int64_t>(a.size())) {
    const int64_t q = chunk ? std::min<int64_t>(chunk, a.size() - done) : a.size();
    ForwardBatchBuilder bb(kBlock);
    const bool last = done + q == static_cast<int64_t>(a.size());
    bb.add(a.data() + done, done, q, sequence_blocks(0, done + q, per_seq, kBlock), last);
    bb.add(b.data() + b_done, b_done, 1, sequence_blocks(1, b_done + 1, per_seq, kBlock), true);
    r.forward(std::move(bb).build());
    const std::vector<float> l = r.logits();
    const size_t rows = l.size() / vocab;
    for (size_t i = 0; i < rows; ++i)
      out.emplace_back(l.begin() + i * vocab, l.begin() + (i + 1) * vocab);
    done += q;
    ++b_done;
  }
  return out;
}

std::vector<int32_t> random_tokens(size_t n, int64_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

double max_diff(const std::vector<float>& x, const std::vector<float>& y) {
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(double(x[i]) - y[i]));
  return m;
}

// A checkpoint with a layer more than its config.json says: the CPU runner refused it, the CUDA
// runner loaded the config's layers and served a smaller model without a word.
TEST(GpuModelRunner, RefusesACheckpointWithTensorsTheConfigDoesNotHave) {
  SKIP_WITHOUT_CUDA();
  const fs::path d =
      fs::temp_directory_path() / ("flashserve-gpu-extra-" + std::to_string(::getpid()));
  model::ModelConfig c = model::preset_config("tiny");
  c.num_hidden_layers = 2;
  model::write_random_checkpoint(c, d.string());
  c.num_hidden_layers = 1;
  std::ofstream(d / "config.json") << c.to_json();
  try {
    model::make_cuda_runner(d.string(), 0);
    ADD_FAILURE() << "accepted a checkpoint with an extra layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("unexpected"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

TEST(GpuModelRunner, MatchesCpuRunnerOnTiny) {
  SKIP_WITHOUT_CUDA();
  auto gpu = model::make_cuda_runner(tiny_checkpoint_dir(), 0);
  std::unique_ptr<ModelRunner> cpu;
  try {
    cpu = model::make_cpu_runner(tiny_checkpoint_dir());
  } catch (const Error& e) {  // a build without OpenBLAS has no CPU runner
    if (e.kind() == ErrorKind::kUnsupported) GTEST_SKIP() << e.what();
    throw;
  }
  const int64_t vocab = gpu->config().vocab_size;
  const auto a = random_tokens(300, vocab, 1), b = random_tokens(40, vocab, 2);
  const auto g = run_schedule(*gpu, a, b, 0);
  const auto c = run_schedule(*cpu, a, b, 0);
  ASSERT_EQ(g.size(), c.size());
  for (size_t i = 0; i < g.size(); ++i) {
    // bf16 weights and activations through 4 layers against float32: logits of RMS ~3 agree to
    // a few hundredths; the argmax agrees unless the top two are that close.
    EXPECT_LT(max_diff(g[i], c[i]), 0.15) << "row " << i;
  }
}

TEST(GpuModelRunner, ChunkedPrefillMatchesWhole) {
  SKIP_WITHOUT_CUDA();
  auto gpu = model::make_cuda_runner(tiny_checkpoint_dir(), 0);
  const int64_t vocab = gpu->config().vocab_size;
  const auto a = random_tokens(300, vocab, 3), b = random_tokens(40, vocab, 4);
  const auto whole = run_schedule(*gpu, a, b, 0);
  for (int64_t chunk : {64, 128}) {
    const auto ch = run_schedule(*gpu, a, b, chunk);
    // a's prompt-end row is the last but one in both; b's decodes come before it when chunked.
    const std::vector<float>& a_whole = whole[1];
    const std::vector<float>& a_chunk = ch[ch.size() - 2];
    EXPECT_LT(max_diff(a_whole, a_chunk), 0.1) << "chunk " << chunk;
    EXPECT_LT(max_diff(whole[2], ch[1]), 0.1) << "b's first decode, chunk " << chunk;
    EXPECT_LT(max_diff(whole[0], ch[0]), 1e-6) << "b's prefill, same batch both times";
  }
}

// Decode-only steps replay a CUDA graph; they must give what eager steps give (the padded table
// and its max_seqlen_k may change the attention's split, so within bf16 rounding, not bitwise).
TEST(GpuModelRunner, DecodeGraphsMatchEagerSteps) {
  SKIP_WITHOUT_CUDA();
  auto r = model::cuda::CudaRunner::load(tiny_checkpoint_dir(), 0);
  const int64_t vocab = r->config().vocab_size, per_seq = 16, n = 3, steps = 40;
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t i = 0; i < n; ++i) seqs.push_back(random_tokens(30 + 7 * i + steps, vocab, 10 + i));
  std::vector<std::vector<float>> out[2];
  for (int graphs = 0; graphs < 2; ++graphs) {
    r->set_cuda_graphs(graphs == 1);
    r->allocate_kv(n * per_seq, kBlock);
    std::vector<int64_t> len(n);
    {
      ForwardBatchBuilder bb(kBlock);
      for (int64_t i = 0; i < n; ++i) {
        len[i] = 30 + 7 * i;
        bb.add(seqs[i].data(), 0, len[i], sequence_blocks(i, len[i], per_seq, kBlock), true);
      }
      r->forward(std::move(bb).build());
    }
    for (int64_t s = 0; s < steps; ++s) {
      ForwardBatchBuilder bb(kBlock);
      for (int64_t i = 0; i < n; ++i)
        bb.add(seqs[i].data() + len[i], len[i], 1, sequence_blocks(i, len[i] + 1, per_seq, kBlock),
               true);
      const ForwardBatch b = std::move(bb).build();
      r->forward(b);
      out[graphs].push_back(r->logits());
      const auto tok = r->sample(b, std::vector<model::SamplingParams>(n));
      EXPECT_EQ(tok.size(), size_t(n));
      for (auto& l : len) ++l;
    }
  }
  const auto [captures, replays] = r->graph_counts();
  EXPECT_GE(captures, 1);
  EXPECT_GE(replays, steps - 4);
  for (int64_t s = 0; s < steps; ++s)
    EXPECT_LT(max_diff(out[0][s], out[1][s]), 0.05) << "step " << s;
}

TEST(GpuModelRunner, RejectsBadBatches) {
  SKIP_WITHOUT_CUDA();
  auto gpu = model::make_cuda_runner(tiny_checkpoint_dir(), 0);
  gpu->allocate_kv(4, kBlock);
  const std::vector<int32_t> bad_id = {1, 2, static_cast<int32_t>(gpu->config().vocab_size)};
  ForwardBatchBuilder bb(kBlock);
  bb.add(bad_id.data(), 0, 3, {0}, true);
  try {
    gpu->forward(std::move(bb).build());
    FAIL() << "token id past the vocabulary accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_EQ(e.argument(), "input_ids");
  }
  const std::vector<int32_t> ok = {1, 2, 3};
  ForwardBatchBuilder bb2(kBlock);
  bb2.add(ok.data(), 0, 3, {9}, true);  // block 9 of a pool of 4
  EXPECT_THROW(gpu->forward(std::move(bb2).build()), Error);
}

}  // namespace
}  // namespace flashserve::testing
