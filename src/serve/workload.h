// Request streams for the simulator (and, later, the GPU benchmark): arrival times from a Poisson
// or gamma process, prompt and output lengths from built-in distributions, fixed values or a CSV
// trace. Everything is seeded; the random numbers come from std::mt19937_64 (whose output the
// standard fixes) through our own transforms, so a seed gives the same workload with any standard
// library.
#pragma once

#include <cstdint>
#include <istream>
#include <random>
#include <string>
#include <vector>

namespace flashserve::serve {

struct Request {
  int64_t id = 0;
  double arrival_s = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
};

// Length distributions. Both built-ins are log-normal fits to the median and P90 of the two
// datasets of the Sarathi-Serve paper (openchat_sharegpt4 and arxiv_summarization):
//   chat:      prompt median 1730, P90 5696; output median 415, P90 834
//   summarize: prompt median 7059, P90 12985; output median 208, P90 371
// Samples are rounded, at least 1, and a prompt is cut so that prompt + output <= max_model_len.
enum class LengthKind : int32_t { kChat, kSummarize, kFixed };
LengthKind parse_length_kind(const std::string& name);  // "chat", "summarize", "fixed"

enum class ArrivalKind : int32_t { kPoisson, kGamma };
ArrivalKind parse_arrival_kind(const std::string& name);  // "poisson", "gamma"

// Gamma arrivals' coefficient of variation. Below kMinGammaCv the shape 1/cv^2 exceeds 10^4 and
// Marsaglia-Tsang's acceptance test cancels catastrophically (at cv = 1e-160 the shape is inf and
// the sampler never accepts); above kMaxGammaCv almost every gap rounds to 0.
inline constexpr double kMinGammaCv = 0.01, kMaxGammaCv = 100;
// The most requests generate_workload makes (a vector of them is allocated up front).
inline constexpr int64_t kMaxGeneratedRequests = 10'000'000;

struct WorkloadSpec {
  LengthKind lengths = LengthKind::kChat;
  int64_t fixed_prompt = 512;  // kFixed
  int64_t fixed_output = 128;  // kFixed
  ArrivalKind arrival = ArrivalKind::kPoisson;
  double rate = 1.0;  // requests per second
  double cv = 1.0;    // gamma: coefficient of variation of the gaps (1 = Poisson, > 1 = bursty)
  int64_t num_requests = 1000;  // 1..kMaxGeneratedRequests
  int64_t max_model_len = 8192;
  uint64_t seed = 0;

  void validate() const;  // throws Error naming the field
};

std::vector<Request> generate_workload(const WorkloadSpec& spec);

// A CSV trace `arrival_s,prompt_tokens,output_tokens`, one request a line, an optional header line
// (before the first request), '#' comments. Each cell must be exactly a number (whole for the token
// counts); arrivals must not decrease. `name` is used in error messages.
// Token counts are in [1, kMaxTraceTokens].
inline constexpr int64_t kMaxTraceTokens = (int64_t{1} << 31) - 1;
std::vector<Request> read_trace(std::istream& in, const std::string& name);
std::vector<Request> load_trace(const std::string& path);

// Same requests, arrival times multiplied by `factor` (factor < 1 raises the rate).
std::vector<Request> scale_arrivals(std::vector<Request> reqs, double factor);
// Requests per second between the first and the last arrival (0 for fewer than 2 requests).
double mean_rate(const std::vector<Request>& reqs);

// The seeded sampler behind generate_workload, exposed for tests.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  double uniform();  // in (0, 1)
  double normal();   // standard normal (Box-Muller)
  double exponential(double mean);
  double gamma(double shape, double scale);  // Marsaglia-Tsang
  double lognormal_from_quantiles(double median, double p90);

 private:
  std::mt19937_64 gen_;
};

}  // namespace flashserve::serve
