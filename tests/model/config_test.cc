// config.json parsing: the published configs of the three architectures (Llama 3.1 with llama3
// RoPE scaling and a list of eos ids, Qwen2.5 with tied embeddings and implicit q/k/v bias, Mistral
// with a sliding window, Llama 2 without num_key_value_heads), what we refuse and why, the presets'
// parameter counts against the published totals, and the llama3 frequencies against the reference.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "flashserve/error.h"
#include "hub_configs.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/rope.h"
#include "model/weights.h"
#include "reference_model.h"
#include "test_dirs.h"

namespace flashserve::model {
namespace {

// As published on the Hugging Face hub (fields we do not use left in).
const char* const kLlama31 = hub::kLlama31;

const char* kQwen25 = R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
  "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
  "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

const char* const kMistral = hub::kMistral;

const char* kLlama2 = R"({"architectures": ["LlamaForCausalLM"], "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 11008,
  "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "tie_word_embeddings": false, "torch_dtype": "float16", "vocab_size": 32000})";

TEST(Config, Llama31WithLlama3RopeScaling) {
  const ModelConfig c = ModelConfig::from_json(kLlama31);
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // hidden / heads when absent
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));  // all of them
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0);
}

TEST(Config, Qwen2HasQkvBiasAndTiedEmbeddings) {
  const ModelConfig c = ModelConfig::from_json(kQwen25);
  EXPECT_EQ(c.architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(c.attention_bias);  // implied by the architecture
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window false
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  const auto specs = weight_specs(c);
  int biases = 0;
  bool head = false;
  for (const auto& w : specs) {
    biases += w.role == WeightRole::kBias;
    head |= w.name == "lm_head.weight";
  }
  EXPECT_EQ(biases, 3 * 24);
  EXPECT_FALSE(head);
}

TEST(Config, MistralSlidingWindowAndLlama2Defaults) {
  const ModelConfig m = ModelConfig::from_json(kMistral);
  EXPECT_EQ(m.architecture, "MistralForCausalLM");
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_FALSE(m.attention_bias);
  EXPECT_EQ(m.shape().kv_bytes_per_token(), 128 * 1024);
  const ModelConfig l2 = ModelConfig::from_json(kLlama2);
  EXPECT_EQ(l2.num_key_value_heads, 32);  // MHA when absent
  EXPECT_DOUBLE_EQ(l2.rope_theta, 10000.0);
  EXPECT_EQ(l2.rope_scaling.type, "none");
  EXPECT_EQ(l2.torch_dtype, "float16");
}

// A published config with one field replaced (or removed, value "").
std::string with(const char* base, const std::string& key, const std::string& value) {
  nlohmann::json j = nlohmann::json::parse(base);
  if (value.empty())
    j.erase(key);
  else
    j[key] = nlohmann::json::parse(value);
  return j.dump();
}

void expect_error(const std::string& text, ErrorKind kind, const std::string& mention) {
  try {
    ModelConfig::from_json(text, "dir/config.json");
    ADD_FAILURE() << "accepted; expected an error mentioning " << mention;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dir/config.json"), std::string::npos) << e.what();
  } catch (const std::exception& e) {  // any other exception escapes the library's contract
    ADD_FAILURE() << "not a flashserve::Error: " << e.what() << "; expected " << mention;
  }
}

TEST(Config, RefusalsNameTheFieldAndTheFile) {
  const auto kInv = ErrorKind::kInvalidArgument, kUns = ErrorKind::kUnsupported;
  expect_error("{\"architectures\": [", kInv, "JSON");
  expect_error("[1, 2]", kInv, "object");
  expect_error(with(kLlama31, "architectures", R"(["GPT2LMHeadModel"])"), kUns, "GPT2LMHeadModel");
  expect_error(with(kLlama31, "architectures", ""), kInv, "architectures");
  expect_error(with(kLlama31, "hidden_size", ""), kInv, "hidden_size");
  expect_error(with(kLlama31, "hidden_size", "\"4096\""), kInv, "hidden_size");
  expect_error(with(kLlama31, "vocab_size", "0"), kInv, "vocab_size");
  expect_error(with(kLlama31, "num_key_value_heads", "5"), kInv, "num_key_value_heads");
  expect_error(with(kLlama31, "head_dim", "63"), kInv, "head_dim");
  expect_error(with(kLlama31, "rope_scaling", R"({"rope_type": "longrope", "factor": 4.0})"), kUns,
               "longrope");
  expect_error(with(kLlama31, "rope_scaling",
                    R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                        "high_freq_factor": 1.0, "original_max_position_embeddings": 8192})"),
               kInv, "rope_scaling");
  expect_error(with(kLlama31, "hidden_act", "\"gelu\""), kUns, "hidden_act");
  expect_error(with(kLlama31, "attention_bias", "true"), kUns, "attention_bias");
  // Qwen's window covers layers max_window_layers and up: on 12 of 24 layers it is refused; with
  // max_window_layers = 24 (kQwen25's) no layer slides, and the model is the plain one.
  expect_error(with(with(kQwen25, "use_sliding_window", "true").c_str(), "max_window_layers", "12"),
               kUns, "use_sliding_window");
  EXPECT_EQ(ModelConfig::from_json(with(kQwen25, "use_sliding_window", "true")).sliding_window, 0);
  expect_error(with(kLlama31, "tie_word_embeddings", "1"), kInv, "tie_word_embeddings");
}

// Each of these was accepted (or escaped as nlohmann's own exception) before the hardening of
// model loading (docs/hardening.md): a value that wrapped, was truncated or was out of range.
TEST(Config, ValuesThatWouldWrapOrBeTruncatedAreRefused) {
  const auto kInv = ErrorKind::kInvalidArgument;
  // A non-string rope_type threw nlohmann::type_error, not Error.
  expect_error(with(kLlama31, "rope_scaling", R"({"rope_type": 3, "factor": 8.0})"), kInv,
               "rope_scaling: rope_type");
  expect_error(with(kLlama31, "rope_scaling", R"({"type": ["llama3"]})"), kInv,
               "rope_scaling: type");
  // Token ids were cast to int32: 2^32 + 1 became 1. Ids beyond the vocabulary were kept.
  expect_error(with(kLlama31, "eos_token_id", "4294967297"), kInv, "eos_token_id");
  expect_error(with(kLlama31, "eos_token_id", "[128001, 4294967297]"), kInv, "eos_token_id");
  expect_error(with(kLlama31, "bos_token_id", "128256"), kInv, "bos_token_id");
  expect_error(with(kLlama31, "eos_token_id", "-2"), kInv, "eos_token_id");
  expect_error(with(kLlama31, "eos_token_id", "[]"), kInv, "eos_token_id");
  EXPECT_EQ(ModelConfig::from_json(with(kLlama31, "bos_token_id", "128255")).bos_token_id, 128255);
  // Without head_dim, 4096 / 24 heads was truncated to 170.
  expect_error(
      with(with(kLlama31, "num_attention_heads", "24").c_str(), "num_key_value_heads", "8"), kInv,
      "head_dim");
  // sliding_window reaches the attention as an int32 window: 2^32 + 1 became a window of 0 keys.
  expect_error(with(kMistral, "sliding_window", "4294967297"), kInv, "sliding_window");
  // Sizes whose products overflow int64 (heads x head_dim, the weights' element counts) or leave
  // int32 where they meet BLAS and the kernels.
  expect_error(with(kLlama31, "hidden_size", "4294967296"), kInv, "hidden_size");
  expect_error(
      with(with(kLlama31, "head_dim", "1073741824").c_str(), "num_attention_heads", "1073741824"),
      kInv, "num_attention_heads x head_dim");
  expect_error(with(kLlama31, "head_dim", "67108864"), kInv, "head_dim");
  expect_error(
      with(with(with(kLlama31, "head_dim", "128").c_str(), "hidden_size", "2147483520").c_str(),
           "intermediate_size", "1073741823"),
      kInv, "model size");
  expect_error(with(kLlama31, "max_position_embeddings", "4294967296"), kInv,
               "max_position_embeddings");
  // A RoPE base below 1: 5e-324 (found by fuzz/checkpoint_config) made rope_theta^(-2i/d)
  // overflow to inf, and every rotated q and k NaN.
  expect_error(with(kLlama31, "rope_theta", "5e-324"), kInv, "rope_theta");
  expect_error(with(kLlama31, "rope_theta", "0.5"), kInv, "rope_theta");
  // A layer count no model has: every loader walked it one layer at a time.
  expect_error(with(kLlama31, "num_hidden_layers", "1099511627776"), kInv, "num_hidden_layers");
  // 2^64 - 1 read as int64 was -1, and the message said "-1 must be positive".
  expect_error(with(kLlama31, "num_hidden_layers", "18446744073709551615"), kInv,
               "num_hidden_layers: 18446744073709551615");
}

TEST(Config, PathsThatAreNotFilesAreRefusedNamingThem) {
  const std::string dir = testing::fresh_dir("dir");
  std::filesystem::create_directories(dir + "/config.json");
  try {
    ModelConfig::load(dir);
    ADD_FAILURE() << "accepted a directory as config.json";
  } catch (const Error& e) {  // was "not valid JSON": the directory read as an empty string
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
  // A name the file system refuses (ENAMETOOLONG): std::filesystem threw its own error.
  EXPECT_THROW(ModelConfig::load(std::string(5000, 'x')), Error);
}

// generation_config.json's end tokens join config.json's (Llama 3 Instruct: config.json names
// <|eot_id|>, generation_config.json adds <|end_of_text|>); a bad one is refused naming it.
TEST(Config, GenerationConfigAddsItsEosTokens) {
  namespace fsys = std::filesystem;
  const std::string dir = testing::fresh_dir("gen_config");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
  };
  write("config.json", with(kLlama31, "eos_token_id", "128009"));
  EXPECT_EQ(ModelConfig::load(dir).eos_token_ids, std::vector<int32_t>{128009});
  write("generation_config.json", R"({"bos_token_id": 128000, "eos_token_id": [128001, 128009],
                                       "do_sample": true, "temperature": 0.6})");
  EXPECT_EQ(ModelConfig::load(dir).eos_token_ids, (std::vector<int32_t>{128009, 128001}));
  write("generation_config.json", R"({"temperature": 0.6})");  // none: config.json's alone
  EXPECT_EQ(ModelConfig::load(dir).eos_token_ids, std::vector<int32_t>{128009});
  // config.json loaded as a file reads only that file.
  write("generation_config.json", R"({"eos_token_id": 7})");
  EXPECT_EQ(ModelConfig::load(dir + "/config.json").eos_token_ids, std::vector<int32_t>{128009});
  for (const char* bad :
       {R"({"eos_token_id": 128256})", R"({"eos_token_id": "2"})",
        R"({"eos_token_id": [1, 4294967297]})", R"([2])", R"({"eos_token_id": )"}) {
    write("generation_config.json", bad);
    try {
      ModelConfig::load(dir);
      ADD_FAILURE() << "accepted generation_config.json " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("generation_config.json"), std::string::npos)
          << e.what();
    }
  }
  fsys::remove_all(dir + "/generation_config.json");
  fsys::create_directories(dir + "/generation_config.json");  // not a file
  EXPECT_THROW(ModelConfig::load(dir), Error);
  fsys::remove_all(dir);
}

TEST(Config, ToJsonReadsBackToTheSameConfig) {
  for (const std::string& name : preset_names()) {
    const ModelConfig c = preset_config(name);
    EXPECT_EQ(ModelConfig::from_json(c.to_json()), c) << name;
  }
  ModelConfig c = ModelConfig::from_json(kLlama31);
  EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);  // a list of eos ids
  c.eos_token_ids = {128001};
  EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
  c.eos_token_ids = {};
  EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
  EXPECT_THROW(preset_config("gpt-5"), Error);
}

TEST(Config, PresetParameterCountsMatchThePublishedTotals) {
  // Totals in the safetensors metadata of the published checkpoints (norms included; a tied head
  // counted once).
  const std::pair<const char*, int64_t> published[] = {{"qwen2-0.5b", 494032768},
                                                       {"llama-3-8b", 8030261248},
                                                       {"mistral-7b", 7241732096},
                                                       {"llama-2-70b", 68976648192}};
  for (const auto& [name, total] : published) {
    int64_t n = 0;
    for (const auto& w : weight_specs(preset_config(name)))
      n += std::accumulate(w.shape.begin(), w.shape.end(), int64_t{1}, std::multiplies<>());
    EXPECT_EQ(n, total) << name;
  }
}

TEST(Config, Llama3RopeFrequenciesMatchTheReferenceInEveryBand) {
  const ModelConfig c = ModelConfig::from_json(kLlama31);
  const std::vector<double> ours = rope_inv_freq(c), ref = testing::ref_inv_freq(c);
  ASSERT_EQ(ours.size(), 64u);
  int kept = 0, scaled = 0, blended = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_NEAR(ours[i], ref[i], 1e-15 * ref[i] + 1e-300) << i;
    const double plain = std::pow(500000.0, -static_cast<double>(2 * i) / 128.0);
    if (std::fabs(ours[i] - plain) <= 1e-15 * plain)
      ++kept;
    else if (std::fabs(ours[i] - plain / 8) <= 1e-15 * plain)
      ++scaled;
    else
      ++blended;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(scaled, 0);
  EXPECT_GT(blended, 0);
  EXPECT_DOUBLE_EQ(ours[0], 1.0);
}

}  // namespace
}  // namespace flashserve::model
