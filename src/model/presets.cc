#include "model/presets.h"

#include "flashserve/error.h"

namespace flashserve::model {

namespace {

ModelConfig llama(int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t ffn,
                  int64_t vocab, int64_t max_pos) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.num_hidden_layers = layers;
  c.hidden_size = hidden;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.intermediate_size = ffn;
  c.vocab_size = vocab;
  c.max_position_embeddings = max_pos;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.torch_dtype = "bfloat16";
  return c;
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"tiny", "qwen2-0.5b", "llama-3-8b", "mistral-7b", "yi-34b", "llama-2-70b"};
}

ModelConfig preset_config(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") {
    // Small enough that CI runs whole engines on two cores in seconds, yet every feature of the
    // big shapes is there: GQA (4 query heads per 2 KV heads), head_dim 64 (a GPU kernel's size),
    // more than one layer, a vocabulary whose argmax is not trivial.
    c = llama(4, 256, 4, 2, 512, 1024, 4096);
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
  } else if (name == "qwen2-0.5b") {  // Qwen2.5-0.5B: q/k/v bias, tied embeddings, 14/2 heads
    c = llama(24, 896, 14, 2, 4864, 151936, 32768);
    c.architecture = "Qwen2ForCausalLM";
    c.attention_bias = true;
    c.tie_word_embeddings = true;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1000000.0;
    c.bos_token_id = 151643;
    c.eos_token_ids = {151643};
  } else if (name == "llama-3-8b") {  // Meta-Llama-3-8B
    c = llama(32, 4096, 32, 8, 14336, 128256, 8192);
    c.rope_theta = 500000.0;
    c.bos_token_id = 128000;
    c.eos_token_ids = {128001};
  } else if (name == "mistral-7b") {  // Mistral-7B-v0.1
    c = llama(32, 4096, 32, 8, 14336, 32000, 32768);
    c.architecture = "MistralForCausalLM";
    c.sliding_window = 4096;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
  } else if (name == "yi-34b") {
    // The shape of 01-ai/Yi-34B, Sarathi-Serve's model for two GPUs (tensor parallel size 2: 28 of
    // its 56 query heads and 4 of its 8 KV heads a rank); 68.8 GB of bf16 weights.
    c = llama(60, 7168, 56, 8, 20480, 64000, 4096);
    c.rope_theta = 5000000.0;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
  } else if (name == "llama-2-70b") {  // Llama-2-70b-hf
    c = llama(80, 8192, 64, 8, 28672, 32000, 4096);
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
  } else {
    std::string list;
    for (const auto& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
    throw Error(ErrorKind::kInvalidArgument, "shape", "'" + name + "' is not one of " + list);
  }
  c.validate(name);
  return c;
}

}  // namespace flashserve::model
