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
  if (params.empty()) return out;
  const std::vector<int32_t> drawn = runner_->sample(fb, params);
  for (size_t i = 0, k = 0; i < batch.entries.size(); ++i)
    if (batch.entries[i].samples) out[i] = drawn[k++];
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
