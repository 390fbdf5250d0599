#include "model/generate.h"

#include <algorithm>
#include <string>

#include "flashserve/error.h"

namespace flashserve::model {

std::vector<int32_t> generate(ModelRunner& runner, const std::vector<int32_t>& prompt,
                              const GenerateOptions& o) {
  const ModelConfig& c = runner.config();
  if (prompt.empty()) throw Error(ErrorKind::kInvalidArgument, "prompt", "is empty");
  if (o.max_tokens < 1)
    throw Error(ErrorKind::kInvalidArgument, "max_tokens", std::to_string(o.max_tokens));
  o.sampling.validate();
  const int64_t total = static_cast<int64_t>(prompt.size()) + o.max_tokens;
  if (total > c.max_position_embeddings)
    throw Error(ErrorKind::kInvalidArgument, "max_tokens",
                "prompt + max_tokens = " + std::to_string(total) + " exceed the model's " +
                    std::to_string(c.max_position_embeddings) + " positions");
  const int64_t num_blocks = (total + o.block_size - 1) / o.block_size;
  runner.allocate_kv(num_blocks, o.block_size);
  std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
  for (int64_t i = 0; i < num_blocks; ++i) blocks[i] = static_cast<int32_t>(i);

  std::vector<int32_t> tokens = prompt, out;
  const int64_t chunk = o.prefill_chunk > 0 ? o.prefill_chunk : static_cast<int64_t>(prompt.size());
  int64_t done = 0;  // tokens whose K/V are in the pool
  while (static_cast<int64_t>(out.size()) < o.max_tokens) {
    const int64_t pending = static_cast<int64_t>(tokens.size()) - done;
    const int64_t q_len = std::min(pending, chunk);
    const bool samples = q_len == pending;
    ForwardBatchBuilder builder(o.block_size);
    builder.add(tokens.data() + done, done, q_len, blocks, samples);
    const ForwardBatch batch = std::move(builder).build();
    runner.forward(batch);
    done += q_len;
    if (!samples) continue;
    const int32_t next = runner.sample(batch, {o.sampling})[0];
    out.push_back(next);
    tokens.push_back(next);
    if (o.stop_at_eos && std::ranges::find(c.eos_token_ids, next) != c.eos_token_ids.end()) break;
  }
  return out;
}

}  // namespace flashserve::model
