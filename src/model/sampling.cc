#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "flashserve/error.h"

namespace flashserve::model {

void SamplingParams::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature))
    throw Error(ErrorKind::kInvalidArgument, "temperature",
                std::to_string(temperature) + " must be >= 0 and finite");
  if (top_k < 0)
    throw Error(ErrorKind::kInvalidArgument, "top_k", std::to_string(top_k) + " must be >= 0");
  if (!(top_p > 0 && top_p <= 1))
    throw Error(ErrorKind::kInvalidArgument, "top_p", std::to_string(top_p) + " must be in (0, 1]");
  if (!(min_p >= 0 && min_p <= 1))
    throw Error(ErrorKind::kInvalidArgument, "min_p", std::to_string(min_p) + " must be in [0, 1]");
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty))
    throw Error(ErrorKind::kInvalidArgument, "repetition_penalty",
                std::to_string(repetition_penalty) + " must be > 0 and finite");
  if (!std::isfinite(presence_penalty))
    throw Error(ErrorKind::kInvalidArgument, "presence_penalty", "must be finite");
  if (!std::isfinite(frequency_penalty))
    throw Error(ErrorKind::kInvalidArgument, "frequency_penalty", "must be finite");
  if (min_tokens < 0)
    throw Error(ErrorKind::kInvalidArgument, "min_tokens",
                std::to_string(min_tokens) + " must be >= 0");
  std::vector<int32_t> tokens;
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0 || !std::isfinite(bias))
      throw Error(ErrorKind::kInvalidArgument, "logit_bias",
                  "token " + std::to_string(token) + ": needs a token id >= 0 and a finite bias");
    tokens.push_back(token);
  }
  std::sort(tokens.begin(), tokens.end());
  if (std::adjacent_find(tokens.begin(), tokens.end()) != tokens.end())
    throw Error(ErrorKind::kInvalidArgument, "logit_bias", "a token is given twice");
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, float u) {
  if (vocab < 1) throw Error(ErrorKind::kInvalidArgument, "vocab", "empty logits row");
  if (params.temperature == 0.0f)  // std::max_element keeps the first of equal maxima
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);

  // Candidates in the rule's order. Only the first top_k are needed: a partial sort.
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int64_t k = params.top_k > 0 ? std::min<int64_t>(params.top_k, vocab) : vocab;
  // exp((l - max) / T) in double: the sums below then round far below float's resolution.
  const double max = *std::max_element(logits, logits + vocab), inv_t = 1.0 / params.temperature;
  // Every token banned (-inf) leaves nothing to draw from: the lowest index, as greedy would.
  if (!std::isfinite(max))
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  const auto unnormalised = [&](int32_t t) {
    return std::exp((static_cast<double>(logits[t]) - max) * inv_t);
  };
  if (params.min_p > 0.0f) {  // the tokens with e >= min_p: a prefix of the order
    int64_t kept_by_min_p = 0;
    for (int64_t t = 0; t < vocab; ++t)
      kept_by_min_p += unnormalised(static_cast<int32_t>(t)) >= static_cast<double>(params.min_p);
    k = std::min(k, std::max<int64_t>(kept_by_min_p, 1));
  }
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  order.resize(static_cast<size_t>(k));

  std::vector<double> p(static_cast<size_t>(k));
  double mass = 0;
  for (int64_t i = 0; i < k; ++i) {
    p[i] = unnormalised(order[i]);
    mass += p[i];
  }
  int64_t kept = k;
  if (params.top_p < 1.0f) {
    double cum = 0;
    const double need = static_cast<double>(params.top_p) * mass;
    for (int64_t i = 0; i < k; ++i) {
      cum += p[i];
      if (cum >= need) {
        kept = i + 1;
        break;
      }
    }
  }
  double kept_mass = 0;
  for (int64_t i = 0; i < kept; ++i) kept_mass += p[i];
  const double target = static_cast<double>(u) * kept_mass;
  double cum = 0;
  for (int64_t i = 0; i < kept; ++i) {
    cum += p[i];
    if (cum > target) return order[i];
  }
  return order[kept - 1];
}

}  // namespace flashserve::model
