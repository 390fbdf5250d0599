// The P99 TBT SLOs a capacity is measured under. Sarathi-Serve (Agrawal et al., OSDI 2024, §5)
// defines two per model and GPU from one decode step, so that they scale with the hardware:
//   strict  = 5 x  the time of a decode-only step of 32 requests at 4k context (no prefill),
//   relaxed = 25 x that time.
// (Its Mistral-7B on an A100 gets 100 ms and 500 ms.) A list names them ("strict", "relaxed") or
// gives seconds ("0.1"): "strict,relaxed,0.1,0.5" is the paper's definitions scaled to this GPU
// beside the paper's own figures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "serve/cost_model.h"

namespace flashserve::serve {

// One entry of a --slo-tbt list, before it is resolved against a cost model.
struct TbtSloSpec {
  enum class Kind { kSeconds, kStrict, kRelaxed };
  Kind kind = Kind::kSeconds;
  double seconds = 0;  // kSeconds only
};

// A resolved SLO: what it is called in tables ("strict", "0.1 s") and its bound.
struct TbtSlo {
  std::string label;
  double seconds = 0;
};

inline constexpr double kStrictSloFactor = 5, kRelaxedSloFactor = 25;
inline constexpr int64_t kReferenceDecodeBatch = 32, kReferenceDecodeContext = 4096;

// "strict,relaxed,0.1": comma-separated names or seconds in (0, 3600]. Throws
// Error(kInvalidArgument, "slo_tbt") for an empty entry, an unknown name, a bad number or a repeat.
std::vector<TbtSloSpec> parse_tbt_slos(const std::string& list);

// The reference decode step the named SLOs scale: 32 decodes at a 4096-token context, the context
// cut to max_model_len and to what 32 sequences can hold in a pool of `pool_tokens` (a small
// model's pool). `context` (optional) receives the context used.
double reference_decode_step_s(const CostModel& cost, int64_t max_model_len, int64_t pool_tokens,
                               int64_t* context = nullptr);

// Each spec as seconds, named ones from `cost`'s reference decode step; the label of a named one
// says what it scaled ("strict (5 x 12.3 ms decode step)").
std::vector<TbtSlo> resolve_tbt_slos(const std::vector<TbtSloSpec>& specs, const CostModel& cost,
                                     int64_t max_model_len, int64_t pool_tokens);

}  // namespace flashserve::serve
