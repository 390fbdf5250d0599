#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/checked_math.h"
#include "common/read_file.h"
#include "flashserve/error.h"

namespace flashserve::model {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& source, const std::string& field, const std::string& what,
                      ErrorKind kind = ErrorKind::kInvalidArgument) {
  throw Error(kind, source + ": " + field, what);
}

// A field that may be absent or null (Hugging Face writes null for "not set").
bool present(const json& j, const char* key) {
  return j.contains(key) && !j.at(key).is_null();
}

int64_t get_int(const json& j, const char* key, const std::string& source, bool required,
                int64_t fallback) {
  if (!present(j, key)) {
    if (required) bad(source, key, "missing");
    return fallback;
  }
  const json& v = j.at(key);
  if (!v.is_number_integer()) bad(source, key, "must be an integer, not " + v.dump());
  if (v.is_number_unsigned() && v.get<uint64_t>() > std::numeric_limits<int64_t>::max())
    bad(source, key, v.dump() + " is beyond 64-bit integers");  // get<int64_t> would wrap
  return v.get<int64_t>();
}

double get_double(const json& j, const char* key, const std::string& source, double fallback) {
  if (!present(j, key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_number()) bad(source, key, "must be a number, not " + v.dump());
  return v.get<double>();
}

bool get_bool(const json& j, const char* key, const std::string& source, bool fallback) {
  if (!present(j, key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_boolean()) bad(source, key, "must be true or false, not " + v.dump());
  return v.get<bool>();
}

// bos/eos may be one id or a list (Llama 3 instruct lists several end tokens), or absent: empty.
// Every id is checked against the int32 ids the engine uses (a plain cast would turn 2^32 + 1
// into 1); validate() then checks them against vocab_size.
std::vector<int32_t> get_tokens(const json& j, const char* key, const std::string& source) {
  if (!present(j, key)) return {};
  const json& v = j.at(key);
  if (v.is_array() && v.empty()) bad(source, key, "is an empty list");
  std::vector<int32_t> ids;
  for (const json& id : v.is_array() ? v : json::array({v})) {
    if (!id.is_number_integer()) bad(source, key, "must be a token id, not " + v.dump());
    if (id.is_number_unsigned() ? id.get<uint64_t>() > std::numeric_limits<int32_t>::max()
                                : id.get<int64_t>() < -1)
      bad(source, key, v.dump() + " is not a token id (0 to 2^31 - 1, or -1 for none)");
    const auto t = static_cast<int32_t>(id.get<int64_t>());
    if (t >= 0 && std::find(ids.begin(), ids.end(), t) == ids.end()) ids.push_back(t);
  }
  return ids;
}

// A string field of an object that may be absent; anything but a string is refused (nlohmann's
// value() would throw its own type_error for a number).
std::string get_string(const json& j, const char* key, const std::string& source,
                       const std::string& fallback) {
  if (!present(j, key)) return fallback;
  const json& v = j.at(key);
  if (!v.is_string()) bad(source, key, "must be a string, not " + v.dump());
  return v.get<std::string>();
}

RopeScaling parse_rope_scaling(const json& j, const std::string& source) {
  RopeScaling r;
  if (!present(j, "rope_scaling")) return r;
  const json& s = j.at("rope_scaling");
  if (!s.is_object()) bad(source, "rope_scaling", "must be an object or null");
  const std::string where = source + ": rope_scaling";
  const std::string type =
      get_string(s, "rope_type", where, get_string(s, "type", where, "default"));
  if (type == "default") return r;
  if (type != "llama3")
    bad(source, "rope_scaling", "rope_type '" + type + "' is not supported (only llama3)",
        ErrorKind::kUnsupported);
  r.type = type;
  r.factor = get_double(s, "factor", where, 0.0);
  r.low_freq_factor = get_double(s, "low_freq_factor", where, 0.0);
  r.high_freq_factor = get_double(s, "high_freq_factor", where, 0.0);
  r.original_max_position_embeddings =
      get_int(s, "original_max_position_embeddings", where, true, 0);
  return r;
}

}  // namespace

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
  c.rope_theta = get_double(j, "rope_theta", source, 10000.0);
  c.rope_scaling = parse_rope_scaling(j, source);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", source, false);
  // Qwen2's q/k/v projections always carry biases (its config has no field for it); Llama's
  // attention_bias also puts one on o_proj, which we do not implement.
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  c.attention_bias = qwen2 || get_bool(j, "attention_bias", source, false);
  if (!qwen2 && c.attention_bias)
    bad(source, "attention_bias", "true is not supported for " + c.architecture,
        ErrorKind::kUnsupported);
  if (qwen2) {
    if (get_bool(j, "use_sliding_window", source, false))
      bad(source, "use_sliding_window", "true is not supported", ErrorKind::kUnsupported);
  } else {
    c.sliding_window = get_int(j, "sliding_window", source, false, 0);
  }
  if (present(j, "hidden_act") && j.at("hidden_act") != "silu")
    bad(source, "hidden_act", j.at("hidden_act").dump() + " is not supported (silu)",
        ErrorKind::kUnsupported);
  if (get_bool(j, "mlp_bias", source, false))
    bad(source, "mlp_bias", "true is not supported", ErrorKind::kUnsupported);
  const std::vector<int32_t> bos = get_tokens(j, "bos_token_id", source);
  c.bos_token_id = bos.empty() ? -1 : bos.front();
  c.eos_token_ids = get_tokens(j, "eos_token_id", source);
  // transformers >= 4.56 writes "dtype"; earlier versions "torch_dtype".
  if (present(j, "torch_dtype") && j.at("torch_dtype").is_string())
    c.torch_dtype = j.at("torch_dtype").get<std::string>();
  else if (present(j, "dtype") && j.at("dtype").is_string())
    c.torch_dtype = j.at("dtype").get<std::string>();
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
      architecture != "Qwen2ForCausalLM")
    bad(source, "architectures",
        "'" + architecture +
            "' is not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)",
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
  if (rope_scaling.type == "llama3") {
    if (!(rope_scaling.factor >= 1) || !std::isfinite(rope_scaling.factor))
      bad(source, "rope_scaling.factor", "must be >= 1 and finite");
    if (!(rope_scaling.low_freq_factor > 0) ||
        !(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) ||
        !std::isfinite(rope_scaling.high_freq_factor))
      bad(source, "rope_scaling",
          "needs 0 < low_freq_factor < high_freq_factor (they bound the smoothed band)");
    if (rope_scaling.original_max_position_embeddings < 1 ||
        rope_scaling.original_max_position_embeddings > kInt32Max)
      bad(source, "rope_scaling.original_max_position_embeddings",
          "must be positive and at most 2^31 - 1");
  }
}

std::string ModelConfig::to_json() const {
  json j;
  j["architectures"] = {architecture};
  j["model_type"] = architecture == "Qwen2ForCausalLM"     ? "qwen2"
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
  if (rope_scaling.type == "llama3") {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", rope_scaling.factor},
        {"low_freq_factor", rope_scaling.low_freq_factor},
        {"high_freq_factor", rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  if (architecture == "Qwen2ForCausalLM") {
    j["use_sliding_window"] = false;
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
