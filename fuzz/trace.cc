// Fuzzes the CSV trace parser (serve/workload.h read_trace). Properties: it returns requests or
// throws flashserve::Error naming "trace" (never another exception, a crash, UB or a hang); what
// it returns satisfies the documented invariants (ids in order, arrivals finite, >= 0 and
// non-decreasing, token counts in [1, kMaxTraceTokens]); and replaying a small trace through the
// simulator terminates with every request finished.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "engine/simulator.h"
#include "flashserve/error.h"
#include "serve/cost_model.h"
#include "serve/workload.h"

namespace fs = flashserve::serve;
namespace fe = flashserve::engine;

namespace {
[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "trace fuzz: %s\n", what);
  std::abort();
}

// A cost model that needs no GPU preset: a fixed cost per step plus one per token.
class TinyCost : public fs::CostModel {
 public:
  double step_seconds(const fs::Batch& batch) const override {
    return 1e-3 + 1e-6 * static_cast<double>(batch.num_tokens());
  }
  std::string describe() const override { return "tiny"; }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::vector<fs::Request> reqs;
  try {
    reqs = fs::read_trace(in, "fuzz.csv");
  } catch (const flashserve::Error& e) {
    if (e.argument() != "trace") fail("error names another argument than trace");
    return 0;
  }
  if (reqs.empty()) fail("no requests and no error");
  int64_t tokens = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const fs::Request& r = reqs[i];
    if (r.id != static_cast<int64_t>(i)) fail("ids out of order");
    if (!(r.arrival_s >= 0) || !std::isfinite(r.arrival_s)) fail("bad arrival");
    if (i && r.arrival_s < reqs[i - 1].arrival_s) fail("arrivals decrease");
    for (int64_t n : {r.prompt_tokens, r.output_tokens})
      if (n < 1 || n > fs::kMaxTraceTokens) fail("token count out of range");
    tokens += r.prompt_tokens + r.output_tokens;  // <= 2^32 per row: no overflow for any size
  }
  const double rate = fs::mean_rate(reqs);
  if (!(rate >= 0) || !std::isfinite(rate)) fail("mean rate not finite");
  // Small traces run through the real scheduler: it must finish every request, or refuse.
  if (tokens > 20000 || reqs.size() > 64) return 0;
  fe::SimConfig config;
  config.scheduler.policy = fs::Policy::kSarathi;
  config.scheduler.max_tokens_per_step = 256;
  config.scheduler.max_model_len = 1 << 16;
  config.num_blocks = 4096;
  config.block_size = 16;
  try {
    const fe::SimResult r = fe::simulate(reqs, config, TinyCost());
    if (r.finished.size() != reqs.size()) fail("the simulation lost requests");
  } catch (const flashserve::Error& e) {
    if (e.kind() != flashserve::ErrorKind::kInvalidArgument) fail("simulation failed internally");
  }
  return 0;
}
