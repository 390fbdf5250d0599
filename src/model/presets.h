// Named model configurations: the shapes of real checkpoints (their Hugging Face config.json) for
// make-checkpoint and the simulator, and `tiny`, small enough that CI runs the whole engine on it.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace flashserve::model {

// "tiny", "qwen2-0.5b", "llama-3-8b", "mistral-7b", "yi-34b", "llama-2-70b";
// Error(kInvalidArgument) else.
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace flashserve::model
