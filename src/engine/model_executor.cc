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
  for (const serve::BatchEntry& e : batch.entries)
    if (e.samples) params.push_back(e.seq->sampling);
  std::vector<int32_t> out(batch.entries.size(), -1);
  logprobs_.clear();
  if (params.empty()) return out;
  const std::vector<int32_t> drawn = runner_->sample(fb, params);
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
