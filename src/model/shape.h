// The sizes of a decoder that a cost model needs (matmul parameters, weight and KV bytes), without
// the numerics of the forward (norm epsilon, RoPE). ModelConfig::shape() derives it from a
// config.json; the simulator takes it from a preset.
#pragma once

#include <cstdint>
#include <string>

namespace flashserve::model {

struct ModelShape {
  std::string name;
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t max_context = 0;        // the model's own context length
  int64_t bytes_per_param = 2;    // bf16 weights
  int64_t kv_bytes_per_elem = 2;  // bf16 KV cache; 1 with an fp8 (e4m3) cache
  // The embedding table's rows where they differ from the LM head's `vocab` (a tensor-parallel
  // rank keeps the whole table beside its block of the LM head, model/tensor_parallel.h); 0: vocab.
  int64_t embedding_rows = 0;

  // Weights of the matmuls of one decoder layer: Q, K, V, O projections and the SwiGLU MLP.
  int64_t layer_linear_params() const;
  // Everything a step multiplies by: all layers plus the LM head (the embedding is a lookup).
  int64_t linear_params() const { return layers * layer_linear_params() + hidden * vocab; }
  int64_t weight_bytes() const;  // including the embedding table
  int64_t kv_bytes_per_token() const {
    return 2 * layers * kv_heads * head_dim * kv_bytes_per_elem;
  }
  void validate() const;
};

}  // namespace flashserve::model
