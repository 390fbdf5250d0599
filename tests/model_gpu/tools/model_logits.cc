// model_logits: runs sequences through a model runner with teacher forcing and writes every
// sampled row's logits, for comparisons outside C++ (tests/model_gpu/compare_transformers.py).
//
//   model_logits --model DIR --input FILE --out FILE [--device cuda|cpu] [--chunk N]
//                [--tensor-parallel-size N]
//   model_logits --write-checkpoint --config CONFIG_JSON --out DIR [--seed N] [--dtype bf16|fp32]
//
// Input: "N D" then N lines "P t_0 t_1 ... t_{P+D-1}": a prompt of P tokens and D forced tokens.
// Each sequence is prefilled (step 0 samples the prompt's last token), then fed its forced tokens
// one decode step at a time: D + 1 sampled rows per sequence. With --chunk N, sequence 0's prompt
// is prefilled N tokens per step while the other sequences decode in the same steps (the mixed
// batches of chunked prefill); every sequence's rows are the same function of its tokens either
// way, so the outputs of the two schedules must agree. --tensor-parallel-size N splits the model
// over N ranks (cuda: GPUs 0 .. N-1; cpu: the in-process emulation), whose outputs must agree
// with one rank's within the rounding of the reordered sums.
// Output: float32 logits [D + 1, N, vocab], then int32 sampled (greedy, on the runner) [D + 1, N].
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashserve/error.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/random_checkpoint.h"
#include "model/runner.h"

namespace fm = flashserve::model;

namespace {

struct Seq {
  int64_t prompt = 0;
  std::vector<int32_t> tokens;
  int64_t consumed = 0;  // tokens whose K/V are in the cache
  int64_t samples = 0;   // rows sampled so far
  std::vector<int32_t> blocks;
};

std::string arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  if (!fallback) throw std::runtime_error(std::string("missing ") + name);
  return fallback;
}
bool flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

int run(int argc, char** argv) {
  if (flag(argc, argv, "--write-checkpoint")) {
    const fm::ModelConfig cfg = fm::ModelConfig::load(arg(argc, argv, "--config", nullptr));
    fm::RandomCheckpointOptions o;
    o.seed = std::stoull(arg(argc, argv, "--seed", "0"));
    const std::string dt = arg(argc, argv, "--dtype", "bf16");
    o.dtype = dt == "fp32"   ? flashserve::DType::kFloat32
              : dt == "fp16" ? flashserve::DType::kFloat16
                             : flashserve::DType::kBFloat16;
    fm::write_random_checkpoint(cfg, arg(argc, argv, "--out", nullptr), o);
    return 0;
  }
  const std::string device = arg(argc, argv, "--device", "cuda");
  const int64_t chunk = std::stoll(arg(argc, argv, "--chunk", "0"));
  const int tp = std::stoi(arg(argc, argv, "--tensor-parallel-size", "1"));
  const int32_t block_size = 16;
  std::ifstream in(arg(argc, argv, "--input", nullptr));
  int64_t n = 0, d = 0;
  in >> n >> d;
  std::vector<Seq> seqs(n);
  int64_t max_len = 0;
  for (auto& s : seqs) {
    in >> s.prompt;
    s.tokens.resize(s.prompt + d);
    for (auto& t : s.tokens) in >> t;
    max_len = std::max<int64_t>(max_len, s.tokens.size());
  }
  if (!in) throw std::runtime_error("malformed input file");
  const std::string dir = arg(argc, argv, "--model", nullptr);
  std::unique_ptr<fm::ModelRunner> runner =
      device == "cpu" ? fm::make_cpu_runner(dir, tp) : fm::make_cuda_runner(dir, 0, tp);
  const int64_t vocab = runner->config().vocab_size;
  const int64_t bps = (max_len + block_size - 1) / block_size;
  runner->allocate_kv(n * bps, block_size);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t b = 0; b < bps; ++b) seqs[i].blocks.push_back(static_cast<int32_t>(i * bps + b));

  std::vector<float> logits((d + 1) * n * vocab, 0.0f);
  std::vector<int32_t> sampled((d + 1) * n, -1);
  for (;;) {
    fm::ForwardBatchBuilder builder(block_size);
    std::vector<int64_t> sampling;                     // sequence of each sample row
    std::vector<std::pair<int64_t, int64_t>> entries;  // (sequence, q_len)
    for (int64_t i = 0; i < n; ++i) {
      Seq& s = seqs[i];
      if (s.samples > d) continue;
      int64_t q_len = 1;
      if (s.consumed < s.prompt)
        q_len = (i == 0 && chunk > 0) ? std::min(chunk, s.prompt - s.consumed) : s.prompt;
      const bool samples = s.consumed + q_len >= s.prompt;
      const int64_t kv = s.consumed + q_len;
      const std::vector<int32_t> blocks(s.blocks.begin(),
                                        s.blocks.begin() + (kv + block_size - 1) / block_size);
      builder.add(s.tokens.data() + s.consumed, s.consumed, q_len, blocks, samples);
      if (samples) sampling.push_back(i);
      entries.emplace_back(i, q_len);
    }
    if (entries.empty()) break;
    const fm::ForwardBatch batch = std::move(builder).build();
    runner->forward(batch);
    const std::vector<float> l = runner->logits();
    const std::vector<int32_t> tok =
        runner->sample(batch, std::vector<fm::SamplingParams>(sampling.size()));
    for (size_t r = 0; r < sampling.size(); ++r) {
      Seq& s = seqs[sampling[r]];
      std::memcpy(&logits[(s.samples * n + sampling[r]) * vocab], &l[r * vocab], vocab * 4);
      sampled[s.samples * n + sampling[r]] = tok[r];
      ++s.samples;
    }
    for (const auto& [i, q_len] : entries) seqs[i].consumed += q_len;
  }
  std::ofstream out(arg(argc, argv, "--out", nullptr), std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits.data()), logits.size() * 4);
  out.write(reinterpret_cast<const char*>(sampled.data()), sampled.size() * 4);
  return out ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_logits: %s\n", e.what());
    return 1;
  }
}
