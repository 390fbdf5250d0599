// config.json as transformers 4 and transformers 5 write it, for the checkpoints people run:
// Llama-3.1-8B (llama3 RoPE), Qwen2.5-7B, Qwen2.5-7B-Instruct with YaRN, Mistral-7B, Qwen3-8B.
// transformers 5 moves rope_theta and rope_scaling into one rope_parameters object and writes
// dtype, layer_types and head_dim; a loader reading only the old keys ran such checkpoints with a
// RoPE base of 10000 (issue 20). Each pair must load, through ModelConfig::load, to the same
// config; a checkpoint of random weights under either config must give the same logits; and the
// keys we do not implement are refused, naming the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "flashserve/error.h"
#include "hub_configs.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/random_checkpoint.h"
#include "model/runner.h"
#include "test_dirs.h"

namespace flashserve::model {
namespace {

using nlohmann::json;

// The hub's config.json (transformers 4), as published.
const char* const kLlama31V4 = hub::kLlama31;

// The same model saved by transformers 5 (save_pretrained): rope_parameters, dtype, head_dim.
const char* kLlama31V5 = R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 128000, "dtype": "bfloat16",
  "eos_token_id": [128001, 128008, 128009], "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pad_token_id": null, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_theta": 500000.0,
                      "rope_type": "llama3"},
  "tie_word_embeddings": false, "transformers_version": "5.0.0", "use_cache": true,
  "vocab_size": 128256})";

const char* kQwen25V4 = R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
  "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 131072,
  "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
  "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
  "use_mrope": false, "use_sliding_window": false, "vocab_size": 152064})";

// transformers 5 writes one layer kind per layer and drops the window it does not use.
std::string qwen_layer_types(int n) {
  json t = json::array();
  for (int i = 0; i < n; ++i) t.push_back("full_attention");
  return t.dump();
}

const std::string kQwen25V5 = R"({"architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0, "bos_token_id": 151643, "dtype": "bfloat16",
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "layer_types": )" +
                              qwen_layer_types(28) + R"(,
  "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2",
  "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "sliding_window": null, "tie_word_embeddings": false, "transformers_version": "5.0.0",
  "use_cache": true, "use_mrope": false, "use_sliding_window": false, "vocab_size": 152064})";

// Qwen2.5-7B-Instruct with the YaRN block its model card adds for contexts past 32768 tokens.
const char* kQwen25YarnV4 = R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584,
  "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 32768,
  "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
  "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
  "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
  "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 152064})";

const std::string kQwen25YarnV5 = R"({"architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0, "bos_token_id": 151643, "dtype": "bfloat16", "eos_token_id": 151645,
  "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "layer_types": )" +
                                  qwen_layer_types(28) + R"(,
  "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "qwen2",
  "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"factor": 4.0, "original_max_position_embeddings": 32768,
                      "rope_theta": 1000000.0, "rope_type": "yarn", "type": "yarn"},
  "sliding_window": null, "tie_word_embeddings": false, "transformers_version": "5.0.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 152064})";

const char* const kMistralV4 = hub::kMistral;

const char* kMistralV5 = R"({"architectures": ["MistralForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 1, "dtype": "bfloat16", "eos_token_id": 2, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
  "sliding_window": 4096, "tie_word_embeddings": false, "transformers_version": "5.0.0",
  "use_cache": true, "vocab_size": 32000})";

const char* kQwen3V4 = R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36,
  "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

const std::string kQwen3V5 = R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 151643, "dtype": "bfloat16", "eos_token_id": 151645,
  "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 12288, "layer_types": )" +
                             qwen_layer_types(36) + R"(,
  "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
  "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
  "pad_token_id": null, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}, "sliding_window": null,
  "tie_word_embeddings": false, "transformers_version": "5.0.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

// Writes `text` as DIR/config.json and reads it back through the directory loader.
ModelConfig load_text(const std::string& text, const std::string& tag) {
  const std::string dir = testing::fresh_dir(tag);
  std::ofstream(dir + "/config.json") << text;
  return ModelConfig::load(dir);
}

struct Pair {
  const char* name;
  std::string v4, v5;
};

const std::vector<Pair>& pairs() {
  static const std::vector<Pair> p = {{"llama31", kLlama31V4, kLlama31V5},
                                      {"qwen25", kQwen25V4, kQwen25V5},
                                      {"qwen25_yarn", kQwen25YarnV4, kQwen25YarnV5},
                                      {"mistral", kMistralV4, kMistralV5},
                                      {"qwen3", kQwen3V4, kQwen3V5}};
  return p;
}

TEST(ConfigGenerations, BothGenerationsLoadToTheSameConfig) {
  for (const Pair& p : pairs()) {
    SCOPED_TRACE(p.name);
    const ModelConfig a = load_text(p.v4, p.name), b = load_text(p.v5, p.name);
    EXPECT_EQ(a, b);
    EXPECT_EQ(b.torch_dtype, "bfloat16");  // transformers 5's "dtype"
  }
}

TEST(ConfigGenerations, EachModelReadsItsPublishedValues) {
  for (const bool v5 : {false, true}) {
    SCOPED_TRACE(v5 ? "transformers 5" : "transformers 4");
    const auto& P = pairs();
    auto get = [&](size_t i) { return load_text(v5 ? P[i].v5 : P[i].v4, P[i].name); };
    const ModelConfig llama = get(0), qwen = get(1), yarn = get(2), mistral = get(3),
                      qwen3 = get(4);
    EXPECT_DOUBLE_EQ(llama.rope_theta, 500000.0);  // 10000 was the silent wrong answer
    EXPECT_EQ(llama.rope_scaling.type, "llama3");
    EXPECT_DOUBLE_EQ(llama.rope_scaling.factor, 8.0);
    EXPECT_EQ(llama.rope_scaling.original_max_position_embeddings, 8192);
    EXPECT_EQ(llama.head_dim, 128);

    EXPECT_DOUBLE_EQ(qwen.rope_theta, 1e6);
    EXPECT_EQ(qwen.rope_scaling.type, "none");
    EXPECT_TRUE(qwen.attention_bias);
    EXPECT_EQ(qwen.sliding_window, 0);  // use_sliding_window false: the window is not used

    EXPECT_DOUBLE_EQ(yarn.rope_theta, 1e6);
    EXPECT_EQ(yarn.rope_scaling.type, "yarn");
    EXPECT_DOUBLE_EQ(yarn.rope_scaling.factor, 4.0);
    EXPECT_EQ(yarn.rope_scaling.original_max_position_embeddings, 32768);
    EXPECT_DOUBLE_EQ(yarn.rope_scaling.beta_fast, 32);  // transformers' defaults
    EXPECT_DOUBLE_EQ(yarn.rope_scaling.beta_slow, 1);
    EXPECT_TRUE(yarn.rope_scaling.truncate);

    EXPECT_EQ(mistral.sliding_window, 4096);
    EXPECT_DOUBLE_EQ(mistral.rope_theta, 10000.0);

    EXPECT_EQ(qwen3.architecture, "Qwen3ForCausalLM");
    EXPECT_TRUE(qwen3.qk_norm);
    EXPECT_FALSE(qwen3.attention_bias);
    EXPECT_DOUBLE_EQ(qwen3.rope_theta, 1e6);
    EXPECT_EQ(qwen3.head_dim, 128);
  }
}

// A published config with one key set (value "" removes it); `rope` edits rope_parameters.
std::string with(const std::string& base, const std::string& key, const std::string& value,
                 bool rope = false) {
  json j = json::parse(base);
  json& o = rope ? j["rope_parameters"] : j;
  if (value.empty())
    o.erase(key);
  else
    o[key] = json::parse(value);
  return j.dump();
}

void expect_refused(const std::string& text, const std::string& key,
                    ErrorKind kind = ErrorKind::kUnsupported) {
  try {
    ModelConfig::from_json(text, "m/config.json");
    ADD_FAILURE() << "accepted; expected a refusal naming " << key;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("m/config.json"), std::string::npos) << e.what();
  }
}

TEST(ConfigGenerations, KeysThatChangeTheComputationAndWeLackAreRefusedByName) {
  const auto kInv = ErrorKind::kInvalidArgument;
  // Both generations present and disagreeing: neither is dropped silently.
  expect_refused(with(kLlama31V5, "rope_theta", "10000.0"), "rope_theta", kInv);
  expect_refused(with(kLlama31V5, "rope_scaling", R"({"rope_type": "linear", "factor": 8.0})"),
                 "rope_scaling", kInv);
  // ... and agreeing: accepted (a hand-merged config).
  EXPECT_EQ(ModelConfig::from_json(with(kLlama31V5, "rope_theta", "500000.0")),
            ModelConfig::from_json(kLlama31V5));
  // A rope_parameters without a base: never a default nobody wrote.
  expect_refused(with(kLlama31V5, "rope_theta", "", true), "rope_theta", kInv);
  expect_refused(with(kLlama31V5, "rope_type", R"("longrope")", true), "longrope");
  expect_refused(with(kLlama31V5, "rope_type", R"("su")", true), "rope_type");
  expect_refused(with(kLlama31V5, "short_factor", "[1.0]", true), "short_factor");
  expect_refused(with(kQwen25V5, "mscale", "1.0", true), "mscale");  // not a key of "default"
  expect_refused(with(kLlama31V5, "partial_rotary_factor", "0.5", true), "partial_rotary_factor");
  expect_refused(with(kLlama31V4, "partial_rotary_factor", "0.5"), "partial_rotary_factor");
  expect_refused(with(kLlama31V5, "rope_parameters",
                      R"({"full_attention": {"rope_type": "default", "rope_theta": 1e4}})"),
                 "full_attention");
  expect_refused(with(kLlama31V5, "low_freq_factor", "", true), "low_freq_factor", kInv);
  expect_refused(with(kLlama31V5, "attention_bias", "true"), "attention_bias");
  expect_refused(with(kQwen3V5, "attention_bias", "true"), "attention_bias");
  expect_refused(with(kLlama31V5, "mlp_bias", "true"), "mlp_bias");
  expect_refused(with(kLlama31V5, "hidden_act", R"("gelu_pytorch_tanh")"), "hidden_act");
  expect_refused(with(kLlama31V5, "quantization_config", R"({"quant_method": "awq", "bits": 4})"),
                 "quantization_config");
  expect_refused(with(with(kQwen3V4, "use_sliding_window", "true"), "max_window_layers", "28"),
                 "use_sliding_window");
  json sliding = json::parse(kQwen3V5);
  sliding["layer_types"][35] = "sliding_attention";
  expect_refused(sliding.dump(), "layer_types");
  expect_refused(with(kQwen3V5, "layer_types", R"(["full_attention"])"), "layer_types", kInv);
  expect_refused(with(kLlama31V5, "torch_dtype", R"("float16")"), "dtype", kInv);
  expect_refused(with(kLlama31V5, "factor", "0.5", true), "factor", kInv);
  expect_refused(with(kQwen25YarnV5, "attention_factor", "0", true), "attention_factor", kInv);
  expect_refused(with(kQwen25YarnV5, "beta_slow", "64", true), "beta_slow", kInv);
  expect_refused(with(kQwen25YarnV5, "type", R"("linear")", true), "type", kInv);
  // A top-level original_max_position_embeddings (Phi-3's place for it) that the object
  // contradicts.
  expect_refused(with(kLlama31V5, "original_max_position_embeddings", "4096"),
                 "original_max_position_embeddings", kInv);
}

TEST(ConfigGenerations, KeysThatDoNotChangeTheComputationAreAccepted) {
  std::string text = kLlama31V5;
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"use_cache", "false"},
                                                        {"initializer_range", "0.5"},
                                                        {"pretraining_tp", "2"},
                                                        {"attention_dropout", "0.1"},
                                                        {"pad_token_id", "128004"},
                                                        {"_name_or_path", R"("x/y")"},
                                                        {"transformers_version", R"("5.17.0")"},
                                                        {"unsloth_version", R"("2025.1")"}})
    text = with(text, key, value);
  EXPECT_EQ(ModelConfig::from_json(text), ModelConfig::from_json(kLlama31V5));
}

// rope_type dynamic (NTK): transformers keeps rope_theta for every sequence up to
// max_position_embeddings and changes the base beyond it; we run the first and refuse the second.
TEST(ConfigGenerations, DynamicRopeIsTheDefaultBelowMaxPositionsAndRefusedPastIt) {
  FLASHSERVE_SKIP_WITHOUT_BLAS();
  ModelConfig c = ModelConfig::from_json(
      with(with(kLlama31V5, "rope_parameters",
                R"({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 500000.0})"),
           "max_position_embeddings", "64"));
  EXPECT_EQ(c.rope_scaling.type, "dynamic");
  c.num_hidden_layers = 1;
  c.hidden_size = 64;
  c.intermediate_size = 64;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 32;
  c.vocab_size = 50;
  c.bos_token_id = -1;
  c.eos_token_ids = {};
  const std::string dir = testing::fresh_dir("dynamic");
  write_random_checkpoint(c, dir);
  auto runner = make_cpu_runner(dir);
  runner->allocate_kv(8, 16);
  const std::vector<int32_t> tokens = {1, 2, 3};
  ForwardBatchBuilder ok(16);
  ok.add(tokens.data(), 61, 3, {0, 1, 2, 3}, true);  // positions 61..63: the last covered
  EXPECT_NO_THROW(runner->forward(std::move(ok).build()));
  ForwardBatchBuilder past(16);
  past.add(tokens.data(), 64, 1, {0, 1, 2, 3, 4}, true);
  try {
    runner->forward(std::move(past).build());
    ADD_FAILURE() << "ran position 64 of a dynamic RoPE with max_position_embeddings 64";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("dynamic"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flashserve::model
