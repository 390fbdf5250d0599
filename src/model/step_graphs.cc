#include "model/step_graphs.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/env_switch.h"
#include "flashserve/error.h"

namespace flashserve::model {

// Powers of two up to 64 rows (decode batches, where the weights' read is the cost), then
// multiples of 64 up to the largest mixed step that takes a graph by default, then of 512:
// cuBLASLt's algorithms differ little within a bucket (gemm.cu), and a mixed step pads at most
// one bucket step. Steps of 512 from 1024 on made every mixed step of 1025-1536 tokens run at
// 1536 rows: on the H200 (mistral-7b shape, arXiv, --budget auto; session 26's step logs) the
// budget's 1088-token steps took 1.27-1.30x the profile's cost (44 ms where 1024-token steps took
// 33.5: the GEMMs at 1.41x their rows), past a 46.2 ms SLO where 1024's steps met it.
int64_t token_bucket(int64_t m) {
  if (m <= 64) {
    int64_t b = 1;
    while (b < m) b *= 2;
    return b;
  }
  const int64_t step = m <= kMixedGraphMaxTokens ? 64 : 512;
  return (m + step - 1) / step * step;
}

int64_t width_bucket(int64_t pages_per_seq) {
  int64_t w = 1;
  while (w < pages_per_seq) w *= 2;
  return w;
}

StepGraphOptions step_graph_options_from_env(const char* cuda_graphs, const char* mixed_tokens) {
  StepGraphOptions o;
  o.graphs = env_switch(cuda_graphs, "FLASHSERVE_CUDA_GRAPHS", o.graphs);
  if (mixed_tokens != nullptr && *mixed_tokens != '\0') {
    int64_t n = 0;
    for (const char* c = mixed_tokens; *c != '\0'; ++c) {
      if (*c < '0' || *c > '9' || n > (int64_t{1} << 40))
        throw Error(
            ErrorKind::kInvalidArgument, "FLASHSERVE_MIXED_GRAPH_TOKENS",
            std::string("must be a non-negative token count, got \"") + mixed_tokens + "\"");
      n = n * 10 + (*c - '0');
    }
    o.mixed_max_tokens = n;
  }
  return o;
}

StepGraphShape step_graph_shape(const ForwardBatch& b, const StepGraphOptions& o) {
  StepGraphShape s;
  s.rows = b.total_q;
  s.width = b.pages_per_seq;
  if (!o.graphs || b.total_q == 0) return s;
  const int64_t samples = static_cast<int64_t>(b.sample_rows.size());
  if (b.total_q == b.batch && samples == b.batch && b.max_seqlen_q == 1) {
    s.kind = StepGraphKind::kDecode;
    s.width = width_bucket(b.pages_per_seq);
    return s;
  }
  if (b.total_q > o.mixed_max_tokens) return s;
  s.kind = StepGraphKind::kMixed;
  s.rows = mixed_step_rows(b.total_q, o);
  s.width = width_bucket(b.pages_per_seq);
  return s;
}

StepGraphOptions step_graph_options_from_env() {
  return step_graph_options_from_env(std::getenv("FLASHSERVE_CUDA_GRAPHS"),
                                     std::getenv("FLASHSERVE_MIXED_GRAPH_TOKENS"));
}

int64_t mixed_step_rows(int64_t tokens, const StepGraphOptions& o) {
  return o.graphs && tokens > 0 && tokens <= o.mixed_max_tokens ? token_bucket(tokens) : tokens;
}

}  // namespace flashserve::model
