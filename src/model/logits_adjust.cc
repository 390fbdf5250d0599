#include "model/logits_adjust.h"

#include <algorithm>
#include <limits>
#include <map>

namespace flashserve::model {

LogitsAdjust make_logits_adjust(const SamplingParams& params, std::span<const int32_t> prompt,
                                std::span<const int32_t> output, std::span<const int32_t> banned,
                                std::vector<uint32_t> allowed) {
  // An ordered map: the list comes out distinct and ascending, and only touched tokens cost.
  std::map<int32_t, TokenAdjust> by_token;
  const auto at = [&](int32_t t) -> TokenAdjust& {
    TokenAdjust& a = by_token[t];
    a.token = t;
    return a;
  };
  for (const auto& [token, bias] : params.logit_bias) at(token).bias += bias;
  for (int32_t t : banned) at(t).bias = -std::numeric_limits<float>::infinity();
  if (params.repetition_penalty != 1.0f) {
    for (int32_t t : prompt) at(t).repetition = params.repetition_penalty;
    for (int32_t t : output) at(t).repetition = params.repetition_penalty;
  }
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
    std::map<int32_t, int64_t> counts;
    for (int32_t t : output) ++counts[t];
    for (const auto& [t, n] : counts)
      at(t).subtract = params.frequency_penalty * static_cast<float>(n) + params.presence_penalty;
  }
  LogitsAdjust out;
  out.tokens.reserve(by_token.size());
  for (const auto& [t, a] : by_token) out.tokens.push_back(a);
  out.allowed = std::move(allowed);
  return out;
}

void apply_logits_adjust(float* logits, int64_t vocab, const LogitsAdjust& a) {
  if (!a.allowed.empty())
    for (int64_t t = 0; t < vocab; ++t)
      if (!token_allowed(a.allowed.data(), t)) logits[t] = -std::numeric_limits<float>::infinity();
  for (const TokenAdjust& x : a.tokens)
    if (x.token < vocab) logits[x.token] = adjusted_logit(logits[x.token], x);
}

}  // namespace flashserve::model
