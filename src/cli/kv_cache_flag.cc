#include "cli/kv_cache_flag.h"

#include <cstdlib>
#include <string>

#include "cli/options.h"
#include "flashserve/error.h"

namespace flashserve::cli {

void KvCacheDtypeFlag::add(CLI::App& app) {
  app.add_option("--kv-cache-dtype", value,
                 "KV cache element type: auto (the runner's: bf16 on cuda, float32 on cpu), "
                 "bf16, fp8 (e4m3, per-head scales 1.0: twice bf16's tokens; on cuda while "
                 "FLASHSERVE_CUDA_FP8_KV=1)")
      ->default_str(value);
}

model::KvCacheDtype KvCacheDtypeFlag::resolve(const std::string& device) const {
  const model::KvCacheDtype d =
      check_option("--kv-cache-dtype", [&] { return model::parse_kv_cache_dtype(value); });
  if (device == "cuda") {
    try {
      model::refuse_cuda_fp8_kv_cache_if_off(d, std::getenv("FLASHSERVE_CUDA_FP8_KV"));
    } catch (const Error& e) {
      // The switch off: a usage error of the flag (exit 2), before anything loads. A malformed
      // switch value (kInvalidArgument naming the variable) stays the library's error.
      if (e.kind() != ErrorKind::kUnsupported) throw;
      std::string what = e.what();
      const std::string prefix = e.argument() + ": ";
      if (what.rfind(prefix, 0) == 0) what.erase(0, prefix.size());
      throw UsageError("--kv-cache-dtype", what);
    }
  }
  return d;
}

void check_profile_kv_cache(const serve::StepProfile& profile, model::KvCacheDtype dtype) {
  const auto it = profile.meta.find("kv_cache_dtype");
  const std::string measured = it == profile.meta.end() ? "auto" : it->second;
  if (measured != model::kv_cache_dtype_name(dtype))
    throw UsageError("--kv-cache-dtype", std::string(model::kv_cache_dtype_name(dtype)) +
                                             ", but the --profile table was measured with the " +
                                             measured +
                                             " cache (profile again with this --kv-cache-dtype)");
}

}  // namespace flashserve::cli
