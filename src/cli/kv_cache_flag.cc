#include "cli/kv_cache_flag.h"

#include "cli/options.h"

namespace flashserve::cli {

void KvCacheDtypeFlag::add(CLI::App& app) {
  app.add_option("--kv-cache-dtype", value,
                 "KV cache element type: auto (the runner's: bf16 on cuda, float32 on cpu), "
                 "bf16, fp8 (e4m3, per-head scales 1.0: twice bf16's tokens; cpu only for now)")
      ->default_str(value);
}

model::KvCacheDtype KvCacheDtypeFlag::resolve(const std::string& device) const {
  const model::KvCacheDtype d =
      check_option("--kv-cache-dtype", [&] { return model::parse_kv_cache_dtype(value); });
  if (d == model::KvCacheDtype::kFp8E4M3 && device == "cuda")
    throw UsageError("--kv-cache-dtype",
                     "fp8: the cuda runner has no fp8 KV cache yet (its fp8 attention kernels "
                     "are not built); give auto or bf16, or --device cpu");
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
