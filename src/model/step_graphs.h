// Which CUDA graph, if any, a step of the CUDA runner replays, and the row counts it runs at: the
// one place that holds the bucket decisions (plain C++, so CI tests them without a GPU).
//
// Token buckets (token_bucket): powers of two up to 64 rows, multiples of 64 up to
// kMixedGraphMaxTokens, then of 512. They are the GEMM's tuning buckets too (gemm.cu times
// cuBLASLt's candidates once per bucket and every row count of the bucket takes that algorithm): a
// mixed step padded to its bucket runs every GEMM with the algorithm its unpadded rows would get,
// which is what lets its graph give the eager step's logits bit for bit. Padding costs at most 63
// rows from 64 to kMixedGraphMaxTokens tokens (6% of a 1088-token step); above, steps run eager
// at their own rows (a larger FLASHSERVE_MIXED_GRAPH_TOKENS pads them up to 511).
//
// Three kinds of step:
//   - decode-only (one new token per sequence, every sequence sampled): a graph per (batch, block
//     table width rounded up to a power of two, the attention plan's replay key), its attention
//     split for the width's keys (by length where the step's lengths are unequal: at most two
//     keys a batch and width);
//   - mixed (prefill chunks, with or without decodes) of at most mixed_max_tokens tokens: the rows
//     padded to token_bucket(T), a graph per (padded rows, sequences, sample rows, width bucket,
//     the attention plan's replay key: the kernels, tiles, splits and sequence ranges its own
//     lengths choose, which fixes the decode count where the batch keeps decodes together);
//   - anything else (graphs off, profiling, a step above mixed_max_tokens): eager.
// Steps up to kMixedGraphMaxTokens fall in 38 token buckets; the runner captures a mixed key the
// kMixedCaptureAfter-th time it sees it and keeps at most kMaxMixedGraphs mixed and
// kMaxDecodeGraphs decode graphs (the least recently replayed of the kind goes first), each a few
// hundred kernel nodes that point into the runner's own buffers (a graph holds no activation
// memory of its own, but its instantiation holds host memory).
#pragma once

#include <cstdint>

#include "model/forward_batch.h"

namespace flashserve::model {

// The bucket of a step's (or a GEMM's) row count: the smallest bucket value >= m (m >= 1).
int64_t token_bucket(int64_t m);

// A block table width rounded up to a power of two (a graph replays for any width up to it).
int64_t width_bucket(int64_t pages_per_seq);

inline constexpr int64_t kMixedGraphMaxTokens = 2048;
// Mixed-step graphs are on: their logits are bit-identical to the eager step's on the H200
// (tests/model_gpu/mixed_graph_gpu_test.cc, session 16) and a replayed mixed step of 512 tokens is
// 2-5% faster than the eager one at 0-256 decodes (bench_model --mixed, session 17,
// bench/results/mixed-graphs-h200-2026-12-03.md). FLASHSERVE_MIXED_GRAPH_TOKENS=0 turns them off.
// The captures' host cost under a changing load and the LRU's churn are not measured yet.
inline constexpr bool kMixedGraphsByDefault = true;
inline constexpr int kMaxMixedGraphs = 64;
// Decode graphs are keyed by (batch, width bucket) and whether the attention splits by length, so
// a server sees up to max_num_seqs x ~10 x 2 keys (a serving load's lengths are nearly always
// unequal: 97% of ShareGPT's steps at 7 req/s, session 34, so mostly one of the two),
// and each instantiated graph holds host memory of its own (~1-3 MB for 32 layers): session 20's
// overload run on the H200 (mistral-7b shape, 64 concurrent) grew the heap by 134 MiB in the
// drain alone, each new (batch, width) of the shrinking batch captured once. The least recently
// replayed goes past this bound; a steady load replays a few dozen keys (batches near the
// concurrency bound, two or three width buckets).
inline constexpr int kMaxDecodeGraphs = 128;
// A mixed step's graph is captured the second time its key is seen (the first runs eagerly, padded
// as the graph would): under a changing load many keys come once (a request joins, another ends),
// and a capture costs about a second eager step of host time plus the instantiation.
inline constexpr int kMixedCaptureAfter = 2;

enum class StepGraphKind { kEager, kDecode, kMixed };

struct StepGraphOptions {
  bool graphs = true;  // off: every step eager
  int64_t mixed_max_tokens = kMixedGraphsByDefault ? kMixedGraphMaxTokens : 0;  // 0: eager
};

struct StepGraphShape {
  StepGraphKind kind = StepGraphKind::kEager;
  int64_t rows = 0;   // rows of the step's token buffers it runs: total_q, or its bucket (mixed)
  int64_t width = 0;  // block table entries per sequence it stages
};

// The runner's options from its environment, refused by name where a value is not understood:
// FLASHSERVE_CUDA_GRAPHS ("0" off; unset, empty or "1" on) and FLASHSERVE_MIXED_GRAPH_TOKENS (a
// non-negative decimal count, the largest mixed step that takes a graph; 0: mixed steps eager;
// unset or empty: StepGraphOptions' default). The arguments are the variables' values (null:
// unset).
StepGraphOptions step_graph_options_from_env(const char* cuda_graphs, const char* mixed_tokens);
// The same from this process's environment: what the CUDA runner runs with (and the cost model of
// a CUDA deployment assumes).
StepGraphOptions step_graph_options_from_env();

// The kind of the batch's step and the rows and width it runs at.
StepGraphShape step_graph_shape(const ForwardBatch& batch, const StepGraphOptions& options);

// The rows a step of `tokens` that is not decode-only runs at: its token bucket where it takes a
// mixed graph (graphs on, at most mixed_max_tokens tokens), else its own. step_graph_shape's
// rule, for the cost model (serve/cost_model.h), which costs a step at the rows it runs.
int64_t mixed_step_rows(int64_t tokens, const StepGraphOptions& options);

}  // namespace flashserve::model
