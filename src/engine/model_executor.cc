#include "engine/model_executor.h"

#include <algorithm>
#include <thread>

#include "serve/batch_layout.h"

namespace flashserve::engine {

ModelExecutor::ModelExecutor(std::shared_ptr<model::ModelRunner> runner, int32_t block_size,
                             std::string device)
    : runner_(std::move(runner)),
      block_size_(block_size),
      device_(std::move(device)),
      start_(std::chrono::steady_clock::now()) {}

std::vector<int32_t> ModelExecutor::execute(const serve::Batch& batch) {
  const model::ForwardBatch fb = serve::layout_batch(batch, block_size_);
  runner_->forward(fb);  // on the CUDA runner queued, not waited for: the masks overlap it
  std::vector<model::SamplingParams> params;
  std::vector<const serve::Sequence*> sampled;  // the sample rows' sequences
  int64_t constrained = 0;
  for (const serve::BatchEntry& e : batch.entries) {
    if (!e.samples) continue;
    params.push_back(e.seq->sampling);
    sampled.push_back(e.seq);
    constrained += e.seq->constraint != nullptr;
  }
  // One per row, or none when no row has any. Each row's constraint is its own (the vocabulary
  // trie and the grammar they read are immutable), so rows can be computed at once.
  std::vector<model::LogitsAdjust> adjust(sampled.size());
  const auto row_adjust = [&](int64_t i, int) {
    adjust[static_cast<size_t>(i)] = logits_adjust(*sampled[static_cast<size_t>(i)]);
  };
  if (constrained >= 2) {
    if (!mask_pool_) mask_pool_ = std::make_unique<ThreadPool>(mask_workers());
    mask_pool_->parallel_for(static_cast<int64_t>(sampled.size()), row_adjust);
  } else {
    for (size_t i = 0; i < sampled.size(); ++i) row_adjust(static_cast<int64_t>(i), 0);
  }
  if (std::all_of(adjust.begin(), adjust.end(), [](const auto& a) { return a.empty(); }))
    adjust.clear();
  std::vector<int32_t> out(batch.entries.size(), -1);
  logprobs_.clear();
  if (params.empty()) return out;
  const std::vector<int32_t> drawn = runner_->sample(fb, params, adjust);
  for (size_t i = 0, k = 0; i < batch.entries.size(); ++i)
    if (batch.entries[i].samples) {
      if (batch.entries[i].seq->constraint) batch.entries[i].seq->constraint->accept(drawn[k]);
      ++k;
    }
  std::vector<int32_t> rows;  // sample rows (and their entries) whose sequence asked for logprobs
  std::vector<size_t> entries;
  for (size_t i = 0, k = 0; i < batch.entries.size(); ++i) {
    if (!batch.entries[i].samples) continue;
    if (batch.entries[i].seq->logprobs >= 0) {
      rows.push_back(static_cast<int32_t>(k));
      entries.push_back(i);
    }
    out[i] = drawn[k++];
  }
  if (rows.empty()) return out;
  // Only the rows asked for leave the runner (the device); log_softmax on the host.
  const std::vector<float> logits = runner_->logits_rows(rows);
  const int64_t V = runner_->config().vocab_size;
  logprobs_.resize(batch.entries.size());
  for (size_t j = 0; j < rows.size(); ++j) {
    const size_t i = entries[j];
    logprobs_[i] =
        model::token_logprobs(logits.data() + j * V, V, out[i], batch.entries[i].seq->logprobs);
  }
  return out;
}

int ModelExecutor::mask_workers() {
  // Half the CPUs, at least 2 and at most 8: the rest serve the HTTP loop, the runner and the
  // tokenizer, and 8 bring 64 rows' masks (12.4 ms on one thread) under a batch-64 decode step's
  // forward on the H200 (7.2 ms against 7.1 unconstrained, bench_constrained, session 20).
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cpus / 2, 2, 8);
}

model::LogitsAdjust ModelExecutor::logits_adjust(const serve::Sequence& seq) const {
  const model::SamplingParams& p = seq.sampling;
  // The stop and eos tokens: banned before min_tokens, and while a grammar is not complete.
  std::vector<int32_t> stops = seq.stop_tokens;
  stops.insert(stops.end(), seq.eos_tokens.begin(), seq.eos_tokens.end());
  std::vector<int32_t> banned;
  if (seq.num_generated() < p.min_tokens) banned = stops;
  std::vector<uint32_t> allowed;
  if (seq.constraint) {
    const int64_t V = runner_->config().vocab_size;
    allowed.assign(static_cast<size_t>((V + 31) / 32), 0u);
    const bool complete = seq.constraint->allowed_next(allowed);
    for (int32_t t : stops) {
      if (t < 0 || t >= V) continue;
      const uint32_t bit = 1u << (t & 31);
      allowed[t >> 5] = complete ? allowed[t >> 5] | bit : allowed[t >> 5] & ~bit;
    }
  }
  if (!p.penalizes() && p.logit_bias.empty() && banned.empty() && allowed.empty()) return {};
  return model::make_logits_adjust(
      p, p.penalizes() ? std::span<const int32_t>(seq.prompt) : std::span<const int32_t>(),
      p.penalizes() ? std::span<const int32_t>(seq.generated) : std::span<const int32_t>(), banned,
      std::move(allowed));
}

double ModelExecutor::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ModelExecutor::wait_until(double t) {
  std::this_thread::sleep_until(start_ +
                                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(t)));
}

std::string ModelExecutor::describe() const {
  const model::ModelConfig& c = runner_->config();
  return "model runner on " + device_ + " (" + c.architecture + ", " +
         std::to_string(c.num_hidden_layers) + " layers, hidden " + std::to_string(c.hidden_size) +
         ")";
}

}  // namespace flashserve::engine
