// A constraint on what a sequence may generate next (a grammar, server/structured output): per
// step the tokens it allows, and the token sampled, fed back. The engine holds one per request
// that has one; the executor turns allowed_next() into the row's LogitsAdjust mask, so the mask
// is applied with the rest of the step's sampling, on the device that samples.
#pragma once

#include <cstdint>
#include <vector>

namespace flashserve::model {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets the bit of every token that may come next in `allowed` ((vocab + 31) / 32 words,
  // zeroed by the caller). Returns whether the output so far is complete: the request's stop
  // and eos tokens are then allowed as well (and never before).
  virtual bool allowed_next(std::vector<uint32_t>& allowed) = 0;
  // The token sampled (one the last allowed_next allowed, or a stop token).
  virtual void accept(int32_t token) = 0;
};

}  // namespace flashserve::model
