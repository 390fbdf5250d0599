// RoPE's settings from config.json, in both generations transformers writes:
//   transformers >= 5:  "rope_parameters": {"rope_type": ..., "rope_theta": ..., <type's keys>}
//   earlier:            "rope_theta": ..., "rope_scaling": {"rope_type" (or "type"): ..., ...}
// A config may carry both (a hand-merged one); they must then agree, or it is refused naming both:
// reading one and dropping the other is how a checkpoint ran with theta 10000 instead of 500000.
// Every key inside the object must be one its rope_type uses; any other is refused by name.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"

namespace flashserve::model {

struct RopeConfig {
  double theta = 10000.0;
  RopeScaling scaling;
  bool operator==(const RopeConfig&) const = default;
};

// `config` is the whole config.json object; `max_position_embeddings` its (already read) value,
// which transformers uses where original_max_position_embeddings is absent (yarn, llama3).
// Throws Error naming `source` and the key: kInvalidArgument for a malformed value,
// kUnsupported for a rope_type or key we do not implement.
RopeConfig parse_rope_config(const nlohmann::json& config, int64_t max_position_embeddings,
                             const std::string& source);

}  // namespace flashserve::model
