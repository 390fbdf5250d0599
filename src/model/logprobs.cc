#include "model/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "flashserve/error.h"

namespace flashserve::model {

SampledLogprobs token_logprobs(const float* logits, int64_t vocab, int32_t token, int32_t top_n) {
  if (vocab < 1) throw Error(ErrorKind::kInvalidArgument, "vocab", "empty logits row");
  if (token < 0 || token >= vocab)
    throw Error(ErrorKind::kInvalidArgument, "token",
                std::to_string(token) + " is outside the vocabulary of " + std::to_string(vocab));
  if (top_n < 0 || top_n > kMaxTopLogprobs)
    throw Error(ErrorKind::kInvalidArgument, "top_logprobs",
                std::to_string(top_n) + " is outside [0, " + std::to_string(kMaxTopLogprobs) + "]");
  // log p_i = l_i - (max + log sum exp(l - max)), the sum in double.
  double max = -std::numeric_limits<double>::infinity();
  bool nan = false;
  for (int64_t i = 0; i < vocab; ++i) {
    nan = nan || std::isnan(logits[i]);
    max = std::max(max, static_cast<double>(logits[i]));
  }
  double lse;
  if (nan) {
    lse = std::numeric_limits<double>::quiet_NaN();
  } else if (std::isinf(max)) {
    lse = max;  // all -inf: every log-probability is NaN (-inf - -inf); +inf: likewise NaN/-inf
  } else {
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
    lse = max + std::log(sum);
  }
  const auto logprob = [&](int32_t i) {
    return static_cast<float>(static_cast<double>(logits[i]) - lse);
  };
  SampledLogprobs out;
  out.sampled = {token, logprob(token)};
  if (top_n == 0) return out;
  // The sampler's order (sampling.h): logit descending, ties to the lower index.
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = std::min<int64_t>(top_n, vocab);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int64_t i = 0; i < k; ++i) out.top.push_back({order[i], logprob(order[i])});
  return out;
}

}  // namespace flashserve::model
