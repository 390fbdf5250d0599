// vLLM's documented logits processing in double, token by token, for the tests of
// model/logits_adjust.h (written without its sparse lists): logit_bias added, then
// repetition_penalty dividing the positive and multiplying the negative logits of every token
// seen in the prompt or the output, then frequency_penalty per occurrence and presence_penalty
// once for each token of the output; banned tokens and tokens outside `allowed` (when given) at
// -inf.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "model/sampling.h"

namespace flashserve::testing {

inline std::vector<double> vllm_processed_logits(const std::vector<float>& logits,
                                                 const model::SamplingParams& p,
                                                 const std::vector<int32_t>& prompt,
                                                 const std::vector<int32_t>& output,
                                                 const std::vector<int32_t>& banned,
                                                 const std::vector<bool>& allowed = {}) {
  std::vector<double> out(logits.size());
  for (size_t t = 0; t < logits.size(); ++t) {
    const int32_t id = static_cast<int32_t>(t);
    double l = logits[t];
    for (const auto& [token, bias] : p.logit_bias)
      if (token == id) l += bias;
    const int64_t in_output = std::count(output.begin(), output.end(), id);
    const bool seen = in_output > 0 || std::count(prompt.begin(), prompt.end(), id) > 0;
    if (seen) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= p.frequency_penalty * static_cast<double>(in_output) +
         (in_output > 0 ? p.presence_penalty : 0.0);
    const bool ban = std::count(banned.begin(), banned.end(), id) > 0;
    if (ban || (!allowed.empty() && !allowed[t])) l = -std::numeric_limits<double>::infinity();
    out[t] = l;
  }
  return out;
}

}  // namespace flashserve::testing
