// Fuzzes config.json parsing (src/model/config.*). The first byte picks how the rest becomes a
// config.json:
//   even: the rest is the text (the seeds are published configs; mutations reach every field);
//   odd:  the rest edits a valid config, field by field: each edit sets one field (the sizes, head
//         counts, head_dim, vocab, positions, rope settings and rope_scaling, sliding_window,
//         token ids, dtypes, flags, architectures) to an adversarial value (0, -1, 2^31, 2^32 + 1,
//         2^63 - 1, 2^64 - 1, 1e308, -0.0, 1.5, a string, null, a list, an object) or removes it.
// Whatever the text:
//   - from_json() accepts, or throws flashserve::Error (kInvalidArgument / kUnsupported) whose
//     message names the source; never another exception, a crash or undefined behaviour;
//   - an accepted config is one every loader can use: sizes positive and within int32 where they
//     meet BLAS, the attention and positions (num_attention_heads x head_dim + 2 x kv heads x
//     head_dim too), heads a multiple of kv heads, head_dim even, bos/eos inside the vocabulary,
//     finite positive eps, a finite theta above 1, a sane llama3 rope_scaling, RoPE frequencies
//     in [0, 1] radian per position, the weights' element counts exact in int64 (and their shapes
//     as weight_specs lists them when the model is small), and to_json() reads back to the same
//     config.
// Registered in fuzz/CMakeLists.txt: flashserve_fuzz_target(checkpoint_config flashserve_model).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "byte_reader.h"
#include "flashserve/error.h"
#include "model/config.h"
#include "model/rope.h"
#include "model/weights.h"

namespace {

using flashserve::Error;
using flashserve::ErrorKind;
using nlohmann::json;
namespace fm = flashserve::model;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "checkpoint_config fuzz: %s\n", what.c_str());
  std::abort();
}

const char* kBase[] = {
    // Llama 3.1 8B
    R"({"architectures": ["LlamaForCausalLM"], "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
  "intermediate_size": 14336, "max_position_embeddings": 131072, "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "vocab_size": 128256})",
    // Qwen2.5 0.5B
    R"({"architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151643,
  "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
  "max_position_embeddings": 32768, "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_sliding_window": false, "vocab_size": 151936})",
    // Mistral-shaped and tiny: small enough that weight_specs runs on it
    R"({"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 256,
  "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 16, "vocab_size": 512})",
};

const char* kFields[] = {"hidden_size",         "intermediate_size",
                         "num_hidden_layers",   "num_attention_heads",
                         "num_key_value_heads", "head_dim",
                         "vocab_size",          "max_position_embeddings",
                         "rms_norm_eps",        "rope_theta",
                         "rope_scaling",        "tie_word_embeddings",
                         "attention_bias",      "sliding_window",
                         "bos_token_id",        "eos_token_id",
                         "torch_dtype",         "dtype",
                         "hidden_act",          "mlp_bias",
                         "architectures",       "use_sliding_window"};
const char* kRopeFields[] = {"rope_type",        "type",
                             "factor",           "low_freq_factor",
                             "high_freq_factor", "original_max_position_embeddings"};

json adversarial(flashserve::fuzz::ByteReader& in) {
  switch (in.in(0, 25)) {
    case 0:
      return 0;
    case 1:
      return -1;
    case 2:
      return int64_t{1} << 31;
    case 3:
      return (int64_t{1} << 31) - 1;
    case 4:
      return (int64_t{1} << 32) + 1;
    case 5:
      return std::numeric_limits<int64_t>::max();
    case 6:
      return std::numeric_limits<uint64_t>::max();
    case 7:
      return std::numeric_limits<int64_t>::min();
    case 8:
      return 1e308;
    case 9:
      return -0.0;
    case 10:
      return 1.5;
    case 11:
      return 5e-324;
    case 12:
      return "4096";
    case 13:
      return nullptr;
    case 14:
      return json::array({1, 2});
    case 15:
      return json::array();
    case 16:
      return json::object();
    case 17:
      return true;
    case 18:
      return "llama3";
    case 19:
      return "bfloat16";
    case 20:
      return json::array({"LlamaForCausalLM"});
    case 21:
      return int64_t{1} << in.in(0, 62);
    case 22:
      return -(int64_t{1} << in.in(0, 62));
    case 23:
      return in.in(0, 300);
    case 24:
      return std::ldexp(1.0, static_cast<int>(in.in(-1074, 1023)));
    default:
      return json::object({{"rope_type", "llama3"},
                           {"factor", in.in(0, 16)},
                           {"low_freq_factor", in.in(0, 4)},
                           {"high_freq_factor", in.in(0, 8)},
                           {"original_max_position_embeddings", in.in(-1, 1 << 20)}});
  }
}

std::string edited(flashserve::fuzz::ByteReader& in) {
  json j = json::parse(kBase[in.in(0, 2)]);
  for (int edits = static_cast<int>(in.in(1, 6)); edits > 0; --edits) {
    const int which = static_cast<int>(in.in(0, 21));
    json& target = which == 10 && j["rope_scaling"].is_object() && in.flag()
                       ? j["rope_scaling"][kRopeFields[in.in(0, 5)]]
                       : j[kFields[which]];
    if (in.one_in(6))
      target = nullptr;  // null and absent read the same; erasing is left to the raw mode
    else
      target = adversarial(in);
  }
  return j.dump();
}

void check_accepted(const fm::ModelConfig& c) {
  const int64_t i32 = std::numeric_limits<int32_t>::max();
  for (int64_t v : {c.hidden_size, c.intermediate_size, c.num_attention_heads,
                    c.num_key_value_heads, c.head_dim, c.vocab_size, c.max_position_embeddings})
    if (v < 1 || v > i32) fail("a size outside [1, 2^31 - 1]");
  if (c.num_hidden_layers < 1 || c.num_hidden_layers > fm::ModelConfig::kMaxLayers)
    fail("num_hidden_layers out of range");
  if (c.sliding_window < 0 || c.sliding_window > i32) fail("sliding_window out of range");
  if (c.num_attention_heads % c.num_key_value_heads) fail("heads not a multiple of kv heads");
  if (c.head_dim % 2) fail("odd head_dim");
  if ((c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim > i32)
    fail("fused qkv width beyond int32");
  if (c.bos_token_id < -1 || c.bos_token_id >= c.vocab_size) fail("bos outside the vocabulary");
  for (int32_t id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size) fail("eos outside the vocabulary");
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps)) fail("rms_norm_eps");
  if (!(c.rope_theta > 1) || !std::isfinite(c.rope_theta)) fail("rope_theta");
  // The weights' element counts, exact in 128 bits, must fit int64 (the loaders size buffers
  // with them in int64 and in bytes of float32).
  const __int128 h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), f = c.intermediate_size;
  const __int128 params = c.num_hidden_layers * ((q + 2 * kv) * h + h * q + 3 * f * h + 2 * h) +
                          2 * static_cast<__int128>(c.vocab_size) * h + h;
  if (params * 4 > std::numeric_limits<int64_t>::max()) fail("model bytes beyond int64");
  // At most 1 radian per position (so angles stay finite over any int32 position); a huge
  // llama3 factor may round the lowest ones to 0, which is the config's meaning to within rounding.
  for (double x : fm::rope_inv_freq(c))
    if (!(x >= 0 && x <= 1)) fail("a RoPE frequency outside [0, 1]");
  if (c.num_hidden_layers * h * h <= (int64_t{1} << 24)) {  // small: list the weights
    for (const fm::WeightSpec& w : fm::weight_specs(c))
      for (int64_t d : w.shape)
        if (d < 1) fail("a weight with an empty dimension: " + w.name);
  }
  const fm::ModelConfig back = fm::ModelConfig::from_json(c.to_json(), "to_json");
  if (!(back == c)) fail("to_json does not read back to the same config");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flashserve::fuzz::ByteReader in(data, size);
  const bool raw = (in.raw<uint8_t>() & 1) == 0;
  const std::string text = raw ? in.rest() : edited(in);
  static const bool print = std::getenv("FLASHSERVE_FUZZ_PRINT") != nullptr;  // to read a crash
  if (print) std::fprintf(stderr, "%s\n", text.c_str());
  fm::ModelConfig c;
  try {
    c = fm::ModelConfig::from_json(text, "fuzz/config.json");
  } catch (const Error& e) {
    if ((e.kind() != ErrorKind::kInvalidArgument && e.kind() != ErrorKind::kUnsupported) ||
        std::string(e.what()).find("fuzz/config.json") != 0)
      fail(std::string("refusal of another kind or not naming the file: ") + e.what());
    return 0;
  }
  check_accepted(c);
  return 0;
}
