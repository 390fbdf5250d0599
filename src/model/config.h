// A Llama-family decoder's configuration, read from a Hugging Face config.json. The four
// architectures we run differ only in fields of this struct: Mistral is Llama's graph, Qwen2 adds
// biases to the q/k/v projections (attention_bias) and usually ties the LM head to the embedding,
// Qwen3 normalizes each q and k head before RoPE (qk_norm). Every key of config.json that would
// change the computation and that we do not implement is refused by name (docs/model.md's table).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/shape.h"

namespace flashserve::model {

// RoPE's frequency rule: config.json's rope_parameters (transformers >= 5) or rope_scaling
// (earlier), read by rope_config.h; each type's frequencies are in rope.cc. Type "none" is
// transformers' "default": the frequencies rope_theta gives.
struct RopeScaling {
  std::string type = "none";      // "none" | "linear" | "dynamic" | "llama3" | "yarn"
  double factor = 1.0;            // linear, dynamic, llama3, yarn
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3, yarn: the pre-training context
  double beta_fast = 32, beta_slow = 1;   // yarn: the band of dimensions blended (in rotations)
  double mscale = 0, mscale_all_dim = 0;  // yarn: 0 when not given (transformers' "falsy")
  double attention_factor = 0;            // yarn: 0 when not given (derived in rope.cc)
  bool truncate = true;                   // yarn: round the blended band to whole dimensions
  bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
  // More layers than this is a corrupt count, not a model (the deepest published have ~130).
  static constexpr int64_t kMaxLayers = int64_t{1} << 16;
  // LlamaForCausalLM | MistralForCausalLM | Qwen2ForCausalLM | Qwen3ForCausalLM
  std::string architecture;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projection biases (Qwen2: always)
  // Qwen3: an RMSNorm over each q and k head (weights [head_dim], eps rms_norm_eps) before RoPE.
  bool qk_norm = false;
  // Mistral's sliding window: a token sees itself and the sliding_window - 1 keys before it.
  // 0: none (Llama; Mistral v0.2+ gives null; Qwen2 unless use_sliding_window).
  int64_t sliding_window = 0;
  int32_t bos_token_id = -1;  // -1: none given
  // Every token that ends generation (empty: none): config.json's eos_token_id (one id or a
  // list), then generation_config.json's (load() from a directory).
  std::vector<int32_t> eos_token_ids;
  std::string torch_dtype = "bfloat16";

  // dir_or_file: a model directory (its config.json is read) or the path of a JSON file.
  static ModelConfig load(const std::string& dir_or_file);
  // `source` names the text in errors (usually the file's path).
  static ModelConfig from_json(const std::string& text, const std::string& source = "config.json");
  // A config.json that from_json reads back to the same config (Hugging Face's field names).
  std::string to_json() const;
  // Throws Error(kInvalidArgument) naming the field at fault, kUnsupported for what we cannot run.
  void validate(const std::string& source = "config.json") const;

  int64_t q_size() const { return num_attention_heads * head_dim; }
  int64_t kv_size() const { return num_key_value_heads * head_dim; }
  ModelShape shape(const std::string& name = "") const;
  bool operator==(const ModelConfig&) const = default;
};

}  // namespace flashserve::model
