#include "engine/model_executor.h"

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
  runner_->forward(fb);
  std::vector<model::SamplingParams> params;
  std::vector<model::LogitsAdjust> adjust;  // one per row, or none when no row has any
  bool any_adjust = false;
  for (const serve::BatchEntry& e : batch.entries) {
    if (!e.samples) continue;
    params.push_back(e.seq->sampling);
    adjust.push_back(logits_adjust(*e.seq));
    any_adjust |= !adjust.back().empty();
  }
  if (!any_adjust) adjust.clear();
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
