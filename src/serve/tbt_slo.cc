#include "serve/tbt_slo.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "flashserve/error.h"

namespace flashserve::serve {

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, "slo_tbt", what);
}

}  // namespace

std::vector<TbtSloSpec> parse_tbt_slos(const std::string& list) {
  std::vector<TbtSloSpec> out;
  std::vector<std::string> seen;
  size_t at = 0;
  while (true) {
    const size_t comma = list.find(',', at);
    const std::string item = list.substr(at, comma == std::string::npos ? comma : comma - at);
    if (item.empty())
      bad("'" + list + "' has an empty entry (give names or seconds, comma-separated)");
    if (std::find(seen.begin(), seen.end(), item) != seen.end())
      bad("'" + item + "' is given twice");
    seen.push_back(item);
    TbtSloSpec s;
    if (item == "strict") {
      s.kind = TbtSloSpec::Kind::kStrict;
    } else if (item == "relaxed") {
      s.kind = TbtSloSpec::Kind::kRelaxed;
    } else {
      double v = 0;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
      if (ec != std::errc() || end != item.data() + item.size() || !std::isfinite(v))
        bad("'" + item + "' is neither strict, relaxed nor a number of seconds");
      if (!(v > 0 && v <= 3600)) bad("'" + item + "' is outside (0, 3600] seconds");
      s.seconds = v;
    }
    out.push_back(s);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

double reference_decode_step_s(const CostModel& cost, int64_t max_model_len, int64_t pool_tokens,
                               int64_t* context) {
  const int64_t ctx = std::max<int64_t>(
      1, std::min({kReferenceDecodeContext, max_model_len, pool_tokens / kReferenceDecodeBatch}));
  Batch b;
  for (int64_t i = 0; i < kReferenceDecodeBatch; ++i) {
    BatchEntry e;
    e.q_start = ctx - 1;
    e.q_len = 1;
    e.kv_len = ctx;
    e.samples = true;
    b.entries.push_back(e);
  }
  if (context) *context = ctx;
  return cost.step_seconds(b);
}

std::vector<TbtSlo> resolve_tbt_slos(const std::vector<TbtSloSpec>& specs, const CostModel& cost,
                                     int64_t max_model_len, int64_t pool_tokens) {
  std::vector<TbtSlo> out;
  int64_t ctx = 0;
  const double step = reference_decode_step_s(cost, max_model_len, pool_tokens, &ctx);
  for (const TbtSloSpec& s : specs) {
    char label[128];
    if (s.kind == TbtSloSpec::Kind::kSeconds) {
      std::snprintf(label, sizeof label, "%g s", s.seconds);
      out.push_back({label, s.seconds});
      continue;
    }
    const bool strict = s.kind == TbtSloSpec::Kind::kStrict;
    const double factor = strict ? kStrictSloFactor : kRelaxedSloFactor;
    std::snprintf(label, sizeof label, "%s (%g x %.2f ms, %lld decodes at %lld)",
                  strict ? "strict" : "relaxed", factor, step * 1e3,
                  static_cast<long long>(kReferenceDecodeBatch), static_cast<long long>(ctx));
    out.push_back({label, factor * step});
  }
  return out;
}

}  // namespace flashserve::serve
