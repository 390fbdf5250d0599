#include "model/tensor_parallel_runner.h"

#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "flashserve/error.h"
#include "model/tensor_parallel.h"

namespace flashserve::model {

namespace {

class TensorParallelRunner final : public ModelRunner {
 public:
  TensorParallelRunner(std::unique_ptr<CommunicatorGroup> group,
                       std::vector<std::unique_ptr<ModelRunner>> ranks)
      : group_(std::move(group)), ranks_(std::move(ranks)) {
    if (!group_ || ranks_.empty() || static_cast<int>(ranks_.size()) != group_->size())
      throw Error(ErrorKind::kInvalidArgument, "ranks",
                  std::to_string(ranks_.size()) + " runners for a group of " +
                      std::to_string(group_ ? group_->size() : 0) + " ranks");
  }

  const ModelConfig& config() const override { return ranks_[0]->config(); }

  // The scales are [layer * kv_heads + h] over the model's KV heads; each rank gets those of its
  // own heads (model/tensor_parallel.h), layer by layer.
  void set_kv_cache(const KvCacheConfig& kv) override {
    const ModelConfig& c = config();
    const size_t n = static_cast<size_t>(c.num_hidden_layers * c.num_key_value_heads);
    for (const auto* s : {&kv.k_scales, &kv.v_scales})
      if (!s->empty() && s->size() != n)
        throw Error(ErrorKind::kInvalidArgument, "kv_cache",
                    std::to_string(s->size()) + " scales given for " + std::to_string(n) +
                        " (layer, KV head) pairs");
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const RankShape part = rank_shape(c, size(), static_cast<int64_t>(r));
      auto mine = [&](const std::vector<float>& all) {
        std::vector<float> out;
        for (int64_t l = 0; !all.empty() && l < c.num_hidden_layers; ++l)
          for (int64_t h = 0; h < part.kv_heads; ++h)
            out.push_back(
                all[static_cast<size_t>(l * c.num_key_value_heads + part.kv_head_begin + h)]);
        return out;
      };
      KvCacheConfig rank_kv = kv;
      rank_kv.k_scales = mine(kv.k_scales);
      rank_kv.v_scales = mine(kv.v_scales);
      ranks_[r]->set_kv_cache(rank_kv);
    }
  }

  void allocate_kv(int64_t num_blocks, int32_t block_size) override {
    for (auto& r : ranks_) r->allocate_kv(num_blocks, block_size);
  }

  void prepare(int64_t max_tokens, int64_t max_rows) override {
    for (auto& r : ranks_) r->prepare(max_tokens, max_rows);
  }

  // Rank r on a thread of its own (rank 0 on the caller's): a step is milliseconds of work, a
  // thread's start tens of microseconds.
  void forward(const ForwardBatch& batch) override {
    std::mutex mu;
    std::exception_ptr first;
    auto run = [&](size_t r) {
      try {
        ranks_[r]->forward(batch);
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();  // the cause, before the abort's echoes
        }
        group_->abort();
      }
    };
    std::vector<std::thread> threads;
    for (size_t r = 1; r < ranks_.size(); ++r) threads.emplace_back(run, r);
    run(0);
    for (std::thread& t : threads) t.join();
    if (first) {
      group_->recover();
      std::rethrow_exception(first);
    }
  }

  std::vector<float> logits() const override { return ranks_[0]->logits(); }
  std::vector<float> logits_rows(const std::vector<int32_t>& rows) const override {
    return ranks_[0]->logits_rows(rows);
  }
  std::pair<int64_t, int64_t> graph_counts() const override { return ranks_[0]->graph_counts(); }
  using ModelRunner::sample;
  std::vector<int32_t> sample(const ForwardBatch& batch, const std::vector<SamplingParams>& params,
                              const std::vector<LogitsAdjust>& adjust) override {
    return ranks_[0]->sample(batch, params, adjust);
  }

 private:
  int64_t size() const { return static_cast<int64_t>(ranks_.size()); }

  std::unique_ptr<CommunicatorGroup> group_;  // declared first: destroyed after the ranks
  std::vector<std::unique_ptr<ModelRunner>> ranks_;
};

}  // namespace

std::unique_ptr<ModelRunner> make_tensor_parallel_runner(
    std::unique_ptr<CommunicatorGroup> group, std::vector<std::unique_ptr<ModelRunner>> ranks) {
  return std::make_unique<TensorParallelRunner>(std::move(group), std::move(ranks));
}

}  // namespace flashserve::model
