#include "serve/workload.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <numbers>
#include <sstream>
#include <utility>

#include "common/checked_math.h"
#include "common/str_cat.h"
#include "flashserve/error.h"

namespace flashserve::serve {

namespace {
[[noreturn]] void bad(const std::string& field, const std::string& what) {
  throw Error(ErrorKind::kInvalidArgument, field, what);
}

// z of the standard normal's 90th percentile.
constexpr double kZ90 = 1.2815515655446004;

struct LengthFit {
  double prompt_median, prompt_p90, output_median, output_p90;
};
constexpr LengthFit kChat{1730, 5696, 415, 834};
constexpr LengthFit kSummarize{7059, 12985, 208, 371};
}  // namespace

LengthKind parse_length_kind(const std::string& name) {
  if (name == "chat") return LengthKind::kChat;
  if (name == "summarize") return LengthKind::kSummarize;
  if (name == "fixed") return LengthKind::kFixed;
  bad("workload", "'" + name + "' is not one of chat, summarize, fixed");
}

ArrivalKind parse_arrival_kind(const std::string& name) {
  if (name == "poisson") return ArrivalKind::kPoisson;
  if (name == "gamma") return ArrivalKind::kGamma;
  bad("arrival", "'" + name + "' is not one of poisson, gamma");
}

Rng::Rng(uint64_t seed) : gen_(seed) {}

double Rng::uniform() {
  // 53 random bits, shifted by half a step so that 0 and 1 never come out.
  return (static_cast<double>(gen_() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double Rng::normal() {
  const double u1 = uniform(), u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double Rng::exponential(double mean) {
  return -mean * std::log(uniform());
}

double Rng::gamma(double shape, double scale) {
  if (shape < 1) {
    // Boost: Gamma(a) = Gamma(a + 1) * U^(1/a).
    return gamma(shape + 1, scale) * std::pow(uniform(), 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = normal();
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = uniform();
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v * scale;
  }
}

double Rng::lognormal_from_quantiles(double median, double p90) {
  const double sigma = std::log(p90 / median) / kZ90;
  return median * std::exp(sigma * normal());
}

void WorkloadSpec::validate() const {
  if (!(rate > 0) || !std::isfinite(rate)) bad("rate", std::to_string(rate) + " must be positive");
  if (!(cv >= kMinGammaCv && cv <= kMaxGammaCv))
    bad("cv", str_cat(cv, " is outside [", kMinGammaCv, ", ", kMaxGammaCv, "]"));
  if (num_requests < 1 || num_requests > kMaxGeneratedRequests)
    bad("num_requests", str_cat(num_requests, " is outside [1, ", kMaxGeneratedRequests, "]"));
  if (max_model_len < 2) bad("max_model_len", std::to_string(max_model_len) + " must be >= 2");
  if (lengths == LengthKind::kFixed) {
    if (fixed_prompt < 1) bad("prompt_len", std::to_string(fixed_prompt) + " must be positive");
    if (fixed_output < 1) bad("output_len", std::to_string(fixed_output) + " must be positive");
    if (saturating_add(fixed_prompt, fixed_output) > max_model_len)
      bad("prompt_len", "prompt " + std::to_string(fixed_prompt) + " + output " +
                            std::to_string(fixed_output) + " exceeds max_model_len " +
                            std::to_string(max_model_len));
  }
}

std::vector<Request> generate_workload(const WorkloadSpec& spec) {
  spec.validate();
  // Separate streams for gaps and lengths: changing the arrival process keeps the lengths.
  Rng gaps(spec.seed * 2 + 1), lens(spec.seed * 2 + 2);
  std::vector<Request> out(spec.num_requests);
  double t = 0;
  for (int64_t i = 0; i < spec.num_requests; ++i) {
    Request& r = out[i];
    r.id = i;
    const double mean_gap = 1.0 / spec.rate;
    if (spec.arrival == ArrivalKind::kPoisson) {
      t += gaps.exponential(mean_gap);
    } else {
      const double shape = 1.0 / (spec.cv * spec.cv);  // CV of Gamma(k, theta) is 1/sqrt(k)
      t += gaps.gamma(shape, mean_gap / shape);
    }
    r.arrival_s = t;
    if (spec.lengths == LengthKind::kFixed) {
      r.prompt_tokens = spec.fixed_prompt;
      r.output_tokens = spec.fixed_output;
      continue;
    }
    const LengthFit& f = spec.lengths == LengthKind::kChat ? kChat : kSummarize;
    const double p = lens.lognormal_from_quantiles(f.prompt_median, f.prompt_p90);
    const double o = lens.lognormal_from_quantiles(f.output_median, f.output_p90);
    r.output_tokens = std::clamp<int64_t>(std::llround(o), 1, spec.max_model_len - 1);
    r.prompt_tokens = std::clamp<int64_t>(std::llround(p), 1, spec.max_model_len - r.output_tokens);
  }
  return out;
}

std::vector<Request> read_trace(std::istream& in, const std::string& name) {
  std::vector<Request> out;
  std::string line;
  int64_t lineno = 0;
  bool first = true;  // the first line that is not blank or a comment may be the header
  auto fail = [&](const std::string& what) {
    bad("trace", name + ":" + std::to_string(lineno) + ": " + what);
  };
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos || line[0] == '#') continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) {
      const size_t b = cell.find_first_not_of(" \t");
      f.push_back(b == std::string::npos ? ""
                                         : cell.substr(b, cell.find_last_not_of(" \t") - b + 1));
    }
    if (f.size() != 3) fail("expected arrival_s,prompt_tokens,output_tokens, got '" + line + "'");
    // A header names its columns: every cell starts with a letter (a data line never does).
    const bool header = std::all_of(f.begin(), f.end(), [](const std::string& c) {
      return !c.empty() && std::isalpha(static_cast<unsigned char>(c[0]));
    });
    if (std::exchange(first, false) && header) continue;
    // Each cell must be its number and nothing else: "12.7" tokens or a time "1.5s" is an error,
    // not a silent 12 or 1.5; from_chars reports overflow instead of wrapping or saturating.
    Request r;
    auto cell = [&](int k, auto& value, const char* column) {
      const char* end = f[k].data() + f[k].size();
      const auto [ptr, ec] = std::from_chars(f[k].data(), end, value);
      if (ec == std::errc::result_out_of_range)
        fail(str_cat(column, " '", f[k], "' is out of range"));
      if (ec != std::errc() || ptr != end || f[k].empty()) fail("not numbers: '" + line + "'");
    };
    cell(0, r.arrival_s, "arrival_s");
    cell(1, r.prompt_tokens, "prompt_tokens");
    cell(2, r.output_tokens, "output_tokens");
    if (!(r.arrival_s >= 0) || !std::isfinite(r.arrival_s)) fail("arrival_s must be >= 0");
    // Token counts become int32 positions in the attention call and block tables.
    for (const auto& [tokens, column] :
         {std::pair{r.prompt_tokens, "prompt_tokens"}, std::pair{r.output_tokens, "output_tokens"}})
      if (tokens < 1 || tokens > kMaxTraceTokens)
        fail(str_cat(column, " must be in [1, ", kMaxTraceTokens, "], got ", tokens));
    if (!out.empty() && r.arrival_s < out.back().arrival_s) fail("arrival_s decreases");
    r.id = static_cast<int64_t>(out.size());
    out.push_back(r);
  }
  if (out.empty()) bad("trace", name + ": no requests");
  return out;
}

std::vector<Request> load_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) bad("trace", "cannot open '" + path + "'");
  return read_trace(in, path);
}

std::vector<Request> scale_arrivals(std::vector<Request> reqs, double factor) {
  if (!(factor > 0) || !std::isfinite(factor))
    bad("factor", std::to_string(factor) + " must be positive");
  for (auto& r : reqs) r.arrival_s *= factor;
  return reqs;
}

double mean_rate(const std::vector<Request>& reqs) {
  if (reqs.size() < 2) return 0;
  const double span = reqs.back().arrival_s - reqs.front().arrival_s;
  return span > 0 ? static_cast<double>(reqs.size() - 1) / span : 0;
}

}  // namespace flashserve::serve
