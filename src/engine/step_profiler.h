// `flashserve profile`: measures a loaded model's step costs by parts (serve/step_profile.h says
// which parts and how each is derived) with the engine's own executor (layout -> the runner's
// forward -> its sampler, timed on the wall clock, as the engine's steps are), so the simulator's
// profile cost model is calibrated by the runner it predicts.
//
// The runner gives no per-kernel timing through its interface, so every part comes from whole steps
// of constructed batches and differences between them (decode attention = decodes at KV L minus
// decodes at KV 1, and so on). Each point is the median of `reps` timed steps after `warmup`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/model_engine.h"
#include "serve/step_profile.h"

namespace flashserve::engine {

struct ProfileGrid {
  std::vector<int64_t> tokens;        // linear: tokens per step
  std::vector<int64_t> decode_batch;  // decode attention and decode base: decodes per step
  std::vector<int64_t> decode_kv;     // decode attention: KV length of each decode (first: 1)
  std::vector<int64_t> chunk;         // prefill attention: chunk tokens
  std::vector<int64_t> cached;        // prefill attention: cached KV before the chunk (first: 0)
  int reps = 3, warmup = 1;

  // Small, for the CPU tests (~2 s on the tiny model): tokens to 192, chunks to 128 after up to
  // 384 cached, 16 decodes of up to 384 keys.
  static ProfileGrid quick();
  // The smallest grid (two points an axis, one step each): exercises the path under the
  // sanitizers, whose Debug steps are ~100x slower; its times mean little.
  static ProfileGrid smoke();
  // Serving's range up to `max_len` tokens (chunks, cached KV, a vllm step of whole prompts), with
  // decodes up to 256 sequences x `max_len` of KV.
  static ProfileGrid full(int64_t max_len);
  // Throws Error(kInvalidArgument) naming the axis: every axis non-empty, strictly increasing,
  // positive (cached from 0), decode_kv starting at 1 and cached at 0.
  void validate() const;
};

struct ProfileProgress {
  std::function<void(const std::string& what, int64_t done, int64_t total)> on_point;
};

// Measures `model` over `grid`. Decode points whose KV does not fit the pool (B x L tokens) are not
// run: they are extrapolated linearly in L from the row's largest measured points (recorded in
// the profile's meta "extrapolated"). Throws Error(kInvalidArgument) when a chunk + cached length
// exceeds the model's positions or the pool.
serve::StepProfile profile_model(const LoadedModel& model, const ProfileGrid& grid,
                                 const ProfileProgress& progress = {});

// The engine's host time per step outside the executor (schedule, complete, replay's loop),
// measured on a simulated executor over a busy workload, seconds.
double measure_engine_overhead();

}  // namespace flashserve::engine
