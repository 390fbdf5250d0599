#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/checked_math.h"
#include "common/read_file.h"
#include "flashserve/error.h"
#include "model/config_json.h"
#include "model/rope_config.h"

namespace flashserve::model {

using nlohmann::json;
using namespace config_json;

ModelConfig ModelConfig::from_json(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kInvalidArgument, source, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw Error(ErrorKind::kInvalidArgument, source, "not a JSON object");
  ModelConfig c;
  if (present(j, "architectures")) {
    const json& a = j.at("architectures");
    if (!a.is_array() || a.empty() || !a.at(0).is_string())
      bad(source, "architectures", "must be a list of names, not " + a.dump());
    c.architecture = a.at(0).get<std::string>();
  } else {
    bad(source, "architectures", "missing");
  }
  c.hidden_size = get_int(j, "hidden_size", source, true, 0);
  c.intermediate_size = get_int(j, "intermediate_size", source, true, 0);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", source, true, 0);
  c.num_attention_heads = get_int(j, "num_attention_heads", source, true, 0);
  c.num_key_value_heads = get_int(j, "num_key_value_heads", source, false, c.num_attention_heads);
  // Without head_dim, transformers divides hidden_size by the heads; a remainder would be dropped
  // silently (and the q/k/v shapes checked against a head_dim nobody wrote).
  if (!present(j, "head_dim") && c.num_attention_heads > 0 && c.hidden_size > 0 &&
      c.hidden_size % c.num_attention_heads != 0)
    bad(source, "head_dim",
        "missing, and hidden_size " + std::to_string(c.hidden_size) +
            " is not a multiple of num_attention_heads " + std::to_string(c.num_attention_heads));
  c.head_dim = get_int(j, "head_dim", source, false,
                       c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
  c.vocab_size = get_int(j, "vocab_size", source, true, 0);
  c.max_position_embeddings = get_int(j, "max_position_embeddings", source, false, 2048);
  c.rms_norm_eps = get_double(j, "rms_norm_eps", source, 1e-6);
  const RopeConfig rope = parse_rope_config(j, c.max_position_embeddings, source);
  c.rope_theta = rope.theta;
  c.rope_scaling = rope.scaling;
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", source, false);
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM";
  c.qk_norm = qwen3;
  // Qwen2's q/k/v projections always carry biases (its config has no field for it); Llama's and
  // Qwen3's attention_bias also puts one on o_proj, which we do not implement.
  c.attention_bias = qwen2 || get_bool(j, "attention_bias", source, false);
  if (!qwen2 && c.attention_bias)
    bad(source, "attention_bias", "true is not supported for " + c.architecture,
        ErrorKind::kUnsupported);
  if (qwen2 || qwen3) {
    // Qwen's window applies to layers max_window_layers and up, and only with use_sliding_window
    // (sliding_window alone is ignored, as transformers ignores it). A window on some layers and
    // not others is not implemented; a window on no layer is the plain model.
    const int64_t full_layers = get_int(j, "max_window_layers", source, false, c.num_hidden_layers);
    if (get_bool(j, "use_sliding_window", source, false) && full_layers < c.num_hidden_layers)
      bad(source, "use_sliding_window",
          "true with max_window_layers " + std::to_string(full_layers) + " < " +
              std::to_string(c.num_hidden_layers) +
              " layers is not supported (a sliding window on some layers)",
          ErrorKind::kUnsupported);
  } else {
    c.sliding_window = get_int(j, "sliding_window", source, false, 0);
  }
  // transformers 5 writes each layer's attention kind; ours is one kind for every layer.
  if (present(j, "layer_types")) {
    const json& t = j.at("layer_types");
    const char* ours = c.sliding_window > 0 ? "sliding_attention" : "full_attention";
    if (!t.is_array() || static_cast<int64_t>(t.size()) != c.num_hidden_layers)
      bad(source, "layer_types",
          "must list one kind per layer (" + std::to_string(c.num_hidden_layers) + ")");
    for (const json& kind : t)
      if (kind != ours)
        bad(source, "layer_types",
            kind.dump() + " is not supported here (every layer is \"" + std::string(ours) + "\")",
            ErrorKind::kUnsupported);
  }
  if (present(j, "hidden_act") && j.at("hidden_act") != "silu")
    bad(source, "hidden_act", j.at("hidden_act").dump() + " is not supported (silu)",
        ErrorKind::kUnsupported);
  if (get_bool(j, "mlp_bias", source, false))
    bad(source, "mlp_bias", "true is not supported", ErrorKind::kUnsupported);
  // Quantized weights (GPTQ, AWQ, bitsandbytes, fp8, compressed-tensors) are not the float
  // tensors our loaders read; the loader would refuse their tensors, this says why.
  if (present(j, "quantization_config"))
    bad(source, "quantization_config", "quantized checkpoints are not supported",
        ErrorKind::kUnsupported);
  const std::vector<int32_t> bos = get_tokens(j, "bos_token_id", source);
  c.bos_token_id = bos.empty() ? -1 : bos.front();
  c.eos_token_ids = get_tokens(j, "eos_token_id", source);
  // transformers >= 4.56 writes "dtype"; earlier versions "torch_dtype". It names the stored
  // weights' type, which the loaders read from the tensors themselves; two different names are
  // still a config we cannot trust.
  const std::string dtype = get_string(j, "dtype", source, "");
  const std::string torch_dtype = get_string(j, "torch_dtype", source, "");
  if (!dtype.empty() && !torch_dtype.empty() && dtype != torch_dtype)
    bad(source, "dtype", "'" + dtype + "' disagrees with torch_dtype '" + torch_dtype + "'");
  if (!torch_dtype.empty() || !dtype.empty())
    c.torch_dtype = torch_dtype.empty() ? dtype : torch_dtype;
  c.validate(source);
  return c;
}

ModelConfig ModelConfig::load(const std::string& dir_or_file) {
  namespace fsys = std::filesystem;
  std::error_code ec;  // the throwing overload would escape as filesystem_error, not Error
  if (!fsys::is_directory(dir_or_file, ec)) return from_json(read_file(dir_or_file), dir_or_file);
  const fsys::path dir(dir_or_file);
  const std::string path = (dir / "config.json").string();
  ModelConfig c = from_json(read_file(path), path);
  // generation_config.json's end tokens end generation too, as in transformers' generate() and
  // vLLM: Llama 3 Instruct's config.json names <|eot_id|> while generation_config.json adds
  // <|end_of_text|>, and a base model sampling either must stop.
  const fsys::path gen = dir / "generation_config.json";
  if (fsys::exists(gen, ec)) {
    const std::string source = gen.string();
    json j;
    try {
      j = json::parse(read_file(source));
    } catch (const json::exception& e) {
      throw Error(ErrorKind::kInvalidArgument, source, std::string("not valid JSON: ") + e.what());
    }
    if (!j.is_object()) bad(source, "top level", "must be a JSON object, not " + j.dump());
    for (int32_t id : get_tokens(j, "eos_token_id", source)) {
      if (id >= c.vocab_size)
        bad(source, "eos_token_id",
            std::to_string(id) + " is outside the vocabulary of " + std::to_string(c.vocab_size));
      if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
        c.eos_token_ids.push_back(id);
    }
  }
  return c;
}

void ModelConfig::validate(const std::string& source) const {
  if (architecture != "LlamaForCausalLM" && architecture != "MistralForCausalLM" &&
      architecture != "Qwen2ForCausalLM" && architecture != "Qwen3ForCausalLM")
    bad(source, "architectures",
        "'" + architecture +
            "' is not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
            "Qwen3ForCausalLM)",
        ErrorKind::kUnsupported);
  auto positive = [&](int64_t v, const char* field) {
    if (v < 1) bad(source, field, std::to_string(v) + " must be positive");
  };
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(vocab_size, "vocab_size");
  positive(max_position_embeddings, "max_position_embeddings");
  // Sizes cross into int32 where they meet BLAS (GEMM widths), the attention (heads, head_dim,
  // window) and positions; bounding them here keeps every later product exact.
  const int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  auto fits_int32 = [&](int64_t v, const char* field) {
    if (v > kInt32Max) bad(source, field, std::to_string(v) + " is more than 2^31 - 1");
  };
  fits_int32(hidden_size, "hidden_size");
  fits_int32(intermediate_size, "intermediate_size");
  fits_int32(num_attention_heads, "num_attention_heads");
  fits_int32(num_key_value_heads, "num_key_value_heads");
  fits_int32(head_dim, "head_dim");
  fits_int32(vocab_size, "vocab_size");  // before the products below use it
  fits_int32(max_position_embeddings, "max_position_embeddings");
  fits_int32(sliding_window, "sliding_window");
  // A corrupt count, not a model: every loader walks the layers one by one.
  if (num_hidden_layers > kMaxLayers)
    bad(source, "num_hidden_layers",
        std::to_string(num_hidden_layers) + " is more than " + std::to_string(kMaxLayers));
  // The fused GEMMs' widths (q + 2 kv rows, gate and up rows) and the whole model in float32.
  const int64_t qkv = checked_add(
      checked_mul(num_attention_heads, head_dim, source + ": head_dim"),
      checked_mul(2 * num_key_value_heads, head_dim, source + ": head_dim"), source + ": head_dim");
  fits_int32(qkv, "num_attention_heads x head_dim + 2 x num_key_value_heads x head_dim");
  fits_int32(2 * intermediate_size, "2 x intermediate_size");
  const std::string total = source + ": model size";
  int64_t per_layer = checked_mul(qkv + num_attention_heads * head_dim, hidden_size, total);
  per_layer = checked_add(per_layer, checked_mul(3 * intermediate_size, hidden_size, total), total);
  int64_t params = checked_mul(per_layer, num_hidden_layers, total);
  params = checked_add(params, checked_mul(2 * vocab_size, hidden_size, total), total);
  checked_mul(params, 4, total);  // bytes in float32, as the CPU runner holds them
  if (num_attention_heads % num_key_value_heads)
    bad(source, "num_key_value_heads",
        std::to_string(num_key_value_heads) + " does not divide num_attention_heads " +
            std::to_string(num_attention_heads));
  if (head_dim % 2) bad(source, "head_dim", std::to_string(head_dim) + " must be even (RoPE)");
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps))
    bad(source, "rms_norm_eps", "must be positive and finite");
  // RoPE's frequencies are rope_theta^(-2i/d): a base below 1 makes them grow with i, and a tiny
  // one (5e-324) overflows them to inf, which turns every rotated q and k into NaN silently.
  if (!(rope_theta > 1) || !std::isfinite(rope_theta))
    bad(source, "rope_theta", "must be finite and greater than 1");
  if (sliding_window < 0) bad(source, "sliding_window", "must be positive or null");
  auto token = [&](int32_t id, const char* field) {
    if (id < -1 || id >= vocab_size)
      bad(source, field,
          std::to_string(id) + " is outside the vocabulary of " + std::to_string(vocab_size));
  };
  token(bos_token_id, "bos_token_id");
  for (int32_t id : eos_token_ids) token(id, "eos_token_id");
  const RopeScaling& r = rope_scaling;
  if (r.type != "none" && r.type != "linear" && r.type != "dynamic" && r.type != "llama3" &&
      r.type != "yarn")
    bad(source, "rope_parameters (or rope_scaling): rope_type", "'" + r.type + "' is not supported",
        ErrorKind::kUnsupported);
  if (r.type != "none" && (!(r.factor >= 1) || !std::isfinite(r.factor)))
    bad(source, "rope_parameters (or rope_scaling): factor", "must be >= 1 and finite");
  if ((r.type == "llama3" || r.type == "yarn") &&
      (r.original_max_position_embeddings < 1 || r.original_max_position_embeddings > kInt32Max))
    bad(source, "rope_parameters (or rope_scaling): original_max_position_embeddings",
        "must be positive and at most 2^31 - 1");
  if (r.type == "llama3" &&
      (!(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor) ||
       !std::isfinite(r.high_freq_factor)))
    bad(source, "rope_parameters (or rope_scaling)",
        "needs 0 < low_freq_factor < high_freq_factor (they bound the smoothed band)");
  if (r.type == "yarn") {
    if (!(r.beta_fast > r.beta_slow) || !(r.beta_slow > 0) || !std::isfinite(r.beta_fast))
      bad(source, "rope_parameters (or rope_scaling)",
          "needs 0 < beta_slow < beta_fast (the blended band)");
    if (!(r.attention_factor >= 0) || !std::isfinite(r.attention_factor) ||
        !std::isfinite(r.mscale) || !std::isfinite(r.mscale_all_dim))
      bad(source, "rope_parameters (or rope_scaling)",
          "attention_factor, mscale and mscale_all_dim must be finite");
  }
}

std::string ModelConfig::to_json() const {
  json j;
  j["architectures"] = {architecture};
  j["model_type"] = architecture == "Qwen2ForCausalLM"     ? "qwen2"
                    : architecture == "Qwen3ForCausalLM"   ? "qwen3"
                    : architecture == "MistralForCausalLM" ? "mistral"
                                                           : "llama";
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  // transformers 4's keys (rope_theta, rope_scaling): what every version reads.
  const RopeScaling& r = rope_scaling;
  json s = {{"rope_type", r.type}, {"factor", r.factor}};
  if (r.type == "llama3") {
    s["low_freq_factor"] = r.low_freq_factor;
    s["high_freq_factor"] = r.high_freq_factor;
    s["original_max_position_embeddings"] = r.original_max_position_embeddings;
  } else if (r.type == "yarn") {
    s["original_max_position_embeddings"] = r.original_max_position_embeddings;
    s["beta_fast"] = r.beta_fast;
    s["beta_slow"] = r.beta_slow;
    if (r.mscale != 0) s["mscale"] = r.mscale;
    if (r.mscale_all_dim != 0) s["mscale_all_dim"] = r.mscale_all_dim;
    if (r.attention_factor != 0) s["attention_factor"] = r.attention_factor;
    s["truncate"] = r.truncate;
  }
  if (r.type == "none")
    j["rope_scaling"] = nullptr;
  else
    j["rope_scaling"] = s;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  if (architecture == "Qwen2ForCausalLM") {
    j["use_sliding_window"] = false;
  } else if (architecture == "Qwen3ForCausalLM") {
    j["use_sliding_window"] = false;
    j["attention_bias"] = false;
  } else {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    if (sliding_window > 0)
      j["sliding_window"] = sliding_window;
    else
      j["sliding_window"] = nullptr;
  }
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_ids.size() > 1)
    j["eos_token_id"] = eos_token_ids;
  else if (eos_token_ids.size() == 1)
    j["eos_token_id"] = eos_token_ids.front();
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

ModelShape ModelConfig::shape(const std::string& name) const {
  ModelShape m;
  m.name = name;
  m.layers = num_hidden_layers;
  m.hidden = hidden_size;
  m.heads = num_attention_heads;
  m.kv_heads = num_key_value_heads;
  m.head_dim = head_dim;
  m.ffn = intermediate_size;
  m.vocab = vocab_size;
  m.max_context = max_position_embeddings;
  return m;
}

}  // namespace flashserve::model
