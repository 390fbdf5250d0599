#include "model/rope_config.h"

#include <map>
#include <optional>
#include <set>

#include "model/config_json.h"

namespace flashserve::model {

namespace {

using nlohmann::json;
using namespace config_json;

// The keys each rope_type reads in transformers' modeling_rope_utils.py (its _validate_*
// functions list the same sets); anything else in the object is refused, since we cannot know
// what it would change. rope_type/type/rope_theta are common to all, partial_rotary_factor is
// checked (must be 1) by the caller.
const std::map<std::string, std::set<std::string>>& rope_keys() {
  static const std::map<std::string, std::set<std::string>> keys = {
      {"default", {}},
      {"linear", {"factor"}},
      {"dynamic", {"factor"}},
      {"llama3",
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}},
      {"yarn",
       {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
        "mscale", "mscale_all_dim", "truncate"}},
  };
  return keys;
}

struct Parsed {
  bool has_theta = false;
  RopeConfig rope;
};

// One RoPE object (rope_parameters or rope_scaling), named `name` in errors.
// `top_original`: config.json's top-level original_max_position_embeddings (-1: absent), which
// transformers 5 moves into the object for llama3 and yarn.
Parsed parse_object(const json& s, const std::string& name, const std::string& source,
                    int64_t max_position_embeddings, int64_t top_original) {
  if (!s.is_object()) bad(source, name, "must be an object or null, not " + s.dump());
  const std::string where = source + ": " + name;
  // Per-layer-type parameters (transformers 5's {"full_attention": {...}, ...}) are for models
  // whose layers differ, which none of ours do.
  for (const char* layer : {"full_attention", "sliding_attention"})
    if (s.contains(layer))
      bad(source, name,
          "per-layer-type RoPE parameters ('" + std::string(layer) + "') are not supported",
          ErrorKind::kUnsupported);
  std::string type = get_string(s, "rope_type", where, get_string(s, "type", where, "default"));
  if (present(s, "rope_type") && present(s, "type") && get_string(s, "type", where, "") != type)
    bad(source, name,
        "rope_type '" + type + "' and type '" + get_string(s, "type", where, "") + "' disagree");
  if (!rope_keys().count(type))
    bad(source, name + ".rope_type",
        "'" + type + "' is not supported (default, linear, dynamic, llama3, yarn)",
        ErrorKind::kUnsupported);
  const std::set<std::string>& allowed = rope_keys().at(type);
  for (const auto& [key, value] : s.items()) {
    if (key == "rope_type" || key == "type" || key == "rope_theta") continue;
    if (key == "partial_rotary_factor") {
      if (!value.is_null() && !(value.is_number() && value.get<double>() == 1.0))
        bad(source, name + ".partial_rotary_factor",
            value.dump() + " is not supported (only 1: RoPE over the whole head)",
            ErrorKind::kUnsupported);
      continue;
    }
    if (!allowed.count(key))
      bad(source, name + "." + key, "is not a key of rope_type '" + type + "' that we implement",
          ErrorKind::kUnsupported);
  }

  Parsed p;
  p.has_theta = present(s, "rope_theta");
  p.rope.theta = get_double(s, "rope_theta", where, 0.0);
  RopeScaling& r = p.rope.scaling;
  if (type == "default") return p;
  r.type = type;
  if (!present(s, "factor") && type != "yarn") bad(source, name + ".factor", "missing");
  r.factor = get_double(s, "factor", where, 0.0);
  if (type == "llama3" || type == "yarn") {
    const int64_t inside = get_int(s, "original_max_position_embeddings", where, false, -1);
    if (inside >= 0 && top_original >= 0 && inside != top_original)
      bad(source, name + ".original_max_position_embeddings",
          std::to_string(inside) +
              " disagrees with the top-level original_max_position_embeddings " +
              std::to_string(top_original));
    // transformers 5 (standardize_rope_params): the top-level value, else the object's, else
    // max_position_embeddings.
    r.original_max_position_embeddings = top_original >= 0 ? top_original
                                         : inside >= 0     ? inside
                                                           : max_position_embeddings;
  }
  if (type == "llama3") {
    for (const char* k : {"low_freq_factor", "high_freq_factor"})
      if (!present(s, k)) bad(source, name + "." + k, "missing");
    r.low_freq_factor = get_double(s, "low_freq_factor", where, 0.0);
    r.high_freq_factor = get_double(s, "high_freq_factor", where, 0.0);
  }
  if (type == "yarn") {
    // A null factor is the context's growth, max_position_embeddings / original (transformers 5).
    if (!present(s, "factor"))
      r.factor = static_cast<double>(max_position_embeddings) /
                 static_cast<double>(r.original_max_position_embeddings);
    // transformers writes `x or default`: a 0 takes the default as well as a null.
    r.beta_fast = get_double(s, "beta_fast", where, 0.0);
    if (r.beta_fast == 0) r.beta_fast = 32;
    r.beta_slow = get_double(s, "beta_slow", where, 0.0);
    if (r.beta_slow == 0) r.beta_slow = 1;
    r.mscale = get_double(s, "mscale", where, 0.0);
    r.mscale_all_dim = get_double(s, "mscale_all_dim", where, 0.0);
    if (present(s, "attention_factor")) {
      r.attention_factor = get_double(s, "attention_factor", where, 0.0);
      if (!(r.attention_factor > 0)) bad(source, name + ".attention_factor", "must be positive");
    }
    r.truncate = get_bool(s, "truncate", where, true);
  }
  return p;
}

}  // namespace

RopeConfig parse_rope_config(const json& j, int64_t max_position_embeddings,
                             const std::string& source) {
  const int64_t top_original = get_int(j, "original_max_position_embeddings", source, false, -1);
  if (present(j, "partial_rotary_factor")) {
    const json& v = j.at("partial_rotary_factor");
    if (!(v.is_number() && v.get<double>() == 1.0))
      bad(source, "partial_rotary_factor",
          v.dump() + " is not supported (only 1: RoPE over the whole head)",
          ErrorKind::kUnsupported);
  }
  const bool has_theta = present(j, "rope_theta");
  const double top_theta = get_double(j, "rope_theta", source, 0.0);

  std::optional<Parsed> now, before;
  if (present(j, "rope_parameters"))
    now = parse_object(j.at("rope_parameters"), "rope_parameters", source, max_position_embeddings,
                       top_original);
  if (present(j, "rope_scaling"))
    before = parse_object(j.at("rope_scaling"), "rope_scaling", source, max_position_embeddings,
                          top_original);

  // The base: the object's rope_theta, else the top-level one (transformers 5 moves it in with
  // setdefault). Without either, transformers 4's Llama/Mistral/Qwen2/Qwen3 default of 10000
  // applies, but only to a transformers-4 config: a rope_parameters without rope_theta is refused
  // rather than given a base nobody wrote.
  auto theta_of = [&](const Parsed& p, const char* name) {
    if (p.has_theta && has_theta && p.rope.theta != top_theta)
      bad(source, std::string(name) + ".rope_theta",
          json(p.rope.theta).dump() + " disagrees with the top-level rope_theta " +
              json(top_theta).dump());
    return p.has_theta ? p.rope.theta : top_theta;
  };
  RopeConfig out;
  if (now) {
    if (!now->has_theta && !has_theta)
      bad(source, "rope_parameters.rope_theta", "missing (and no top-level rope_theta)");
    out = now->rope;
    out.theta = theta_of(*now, "rope_parameters");
    if (before) {
      RopeConfig old = before->rope;
      old.theta = before->has_theta ? before->rope.theta : out.theta;
      if (!(old == out))
        bad(source, "rope_parameters",
            "and rope_scaling disagree (both present; remove the one that is stale)");
    }
    return out;
  }
  if (before) {
    out = before->rope;
    out.theta = before->has_theta || has_theta ? theta_of(*before, "rope_scaling") : 10000.0;
    return out;
  }
  out.theta = has_theta ? top_theta : 10000.0;
  return out;
}

}  // namespace flashserve::model
