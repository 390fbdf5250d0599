// --kv-cache-dtype, as serve, bench-serve, profile and simulate take it (vLLM's values:
// model/kv_cache_dtype.h): auto (the runner's own type) by default, bf16, fp8 / fp8_e4m3.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "model/kv_cache_dtype.h"
#include "serve/step_profile.h"

namespace flashserve::cli {

struct KvCacheDtypeFlag {
  std::string value = "auto";

  void add(CLI::App& app);
  // The parsed value, or a UsageError naming --kv-cache-dtype (an unknown value; fp8_e5m2; fp8 on
  // --device cuda while FLASHSERVE_CUDA_FP8_KV is off). `device` empty: no runner (simulate
  // models a GPU whose cache is fp8).
  model::KvCacheDtype resolve(const std::string& device) const;
};

// A step profile (`flashserve profile`) measured with another cache than `dtype` would predict
// another engine's steps: UsageError naming --kv-cache-dtype (a table without the key was
// measured before the flag existed, with the runner's own cache: auto).
void check_profile_kv_cache(const serve::StepProfile& profile, model::KvCacheDtype dtype);

}  // namespace flashserve::cli
