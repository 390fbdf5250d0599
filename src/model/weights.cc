#include "model/weights.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "common/half.h"
#include "common/thread_pool.h"
#include "flashserve/error.h"

namespace flashserve::model {

std::string layer_weight(int64_t layer, const std::string& suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

std::vector<WeightSpec> weight_specs(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), f = c.intermediate_size;
  std::vector<WeightSpec> s;
  s.push_back({"model.embed_tokens.weight", {c.vocab_size, h}, WeightRole::kEmbedding});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto add = [&](const std::string& suffix, std::vector<int64_t> shape, WeightRole role,
                   TpSplit split = TpSplit::kReplicated, int split_dim = 0) {
      const int64_t fan_in = role == WeightRole::kLinear ? shape[1] : 0;
      const bool residual = split_dim == 1;  // the row-parallel ones add to the residual stream
      s.push_back(
          {layer_weight(l, suffix), std::move(shape), role, fan_in, residual, split, split_dim});
    };
    add("input_layernorm.weight", {h}, WeightRole::kNorm);
    add("self_attn.q_proj.weight", {q, h}, WeightRole::kLinear, TpSplit::kQHeads);
    add("self_attn.k_proj.weight", {kv, h}, WeightRole::kLinear, TpSplit::kKvHeads);
    add("self_attn.v_proj.weight", {kv, h}, WeightRole::kLinear, TpSplit::kKvHeads);
    if (c.attention_bias) {
      add("self_attn.q_proj.bias", {q}, WeightRole::kBias, TpSplit::kQHeads);
      add("self_attn.k_proj.bias", {kv}, WeightRole::kBias, TpSplit::kKvHeads);
      add("self_attn.v_proj.bias", {kv}, WeightRole::kBias, TpSplit::kKvHeads);
    }
    if (c.qk_norm) {  // Qwen3: one RMSNorm scale per head dimension, shared by the heads
      add("self_attn.q_norm.weight", {c.head_dim}, WeightRole::kNorm);
      add("self_attn.k_norm.weight", {c.head_dim}, WeightRole::kNorm);
    }
    add("self_attn.o_proj.weight", {h, q}, WeightRole::kLinear, TpSplit::kQHeads, 1);
    add("post_attention_layernorm.weight", {h}, WeightRole::kNorm);
    add("mlp.gate_proj.weight", {f, h}, WeightRole::kLinear, TpSplit::kFfn);
    add("mlp.up_proj.weight", {f, h}, WeightRole::kLinear, TpSplit::kFfn);
    add("mlp.down_proj.weight", {h, f}, WeightRole::kLinear, TpSplit::kFfn, 1);
  }
  s.push_back({"model.norm.weight", {h}, WeightRole::kNorm});
  if (!c.tie_word_embeddings)
    s.push_back(
        {"lm_head.weight", {c.vocab_size, h}, WeightRole::kLmHead, h, false, TpSplit::kVocab});
  return s;
}

void check_weights(const Checkpoint& ckpt) {
  std::set<std::string> expected;
  for (const WeightSpec& w : weight_specs(ckpt.config())) {
    ckpt.tensor(w.name, w.shape);  // throws for a missing, misshapen or non-float tensor
    expected.insert(w.name);
  }
  for (const std::string& name : ckpt.names()) {
    if (expected.count(name)) continue;
    if (name == "lm_head.weight" && ckpt.config().tie_word_embeddings) continue;
    if (name.size() >= 20 && name.ends_with("rotary_emb.inv_freq")) continue;
    throw Error(ErrorKind::kInvalidArgument, ckpt.tensor(name).file,
                "unexpected tensor '" + name + "' for " + ckpt.config().architecture + " with " +
                    std::to_string(ckpt.config().num_hidden_layers) + " layers");
  }
}

void copy_as_float(const TensorInfo& t, float* dst) {
  const int64_t n = t.numel();
  const auto* src = static_cast<const uint8_t*>(t.data);
  constexpr int64_t kChunk = 1 << 20;
  ThreadPool::global().parallel_for((n + kChunk - 1) / kChunk, [&](int64_t c, int) {
    const int64_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    if (t.dtype == DType::kFloat32) {
      std::memcpy(dst + begin, src + begin * 4, static_cast<size_t>(end - begin) * 4);
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      uint16_t bits;  // the mapping gives no alignment guarantee: read bytes, not uint16_t*
      std::memcpy(&bits, src + i * 2, 2);
      dst[i] = t.dtype == DType::kBFloat16 ? to_float(bf16_t{bits}) : to_float(fp16_t{bits});
    }
  });
}

}  // namespace flashserve::model
