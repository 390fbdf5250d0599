// flashserve make-checkpoint: a model directory in Hugging Face's format with random weights
// (model/random_checkpoint.h states the scaling), for testing and benchmarking without downloads.
//   flashserve make-checkpoint --shape tiny --out /tmp/tiny
//   flashserve make-checkpoint --shape mistral-7b --out /data/mistral-7b-random --seed 1
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <string>

#include "cli/command.h"
#include "cli/options.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "tokenizer/checkpoint_tokenizer.h"

namespace flashserve::cli {
namespace {

int make_checkpoint(int argc, char** argv) {
  std::string shape, out, dtype = "bf16";
  model::RandomCheckpointOptions o;
  CLI::App app{"Write a model directory (config.json + safetensors) with random weights"};
  app.option_defaults()->always_capture_default();
  std::string shapes;
  for (const auto& n : model::preset_names()) shapes += (shapes.empty() ? "" : ", ") + n;
  app.add_option("--shape", shape, shapes)->required();
  app.add_option("--out", out, "directory to write (created if needed)")->required();
  add_uint(app, "--seed", o.seed, "seed of the weights");
  app.add_option("--dtype", dtype, "bf16, fp16 or fp32");
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  if (dtype == "bf16")
    o.dtype = DType::kBFloat16;
  else if (dtype == "fp16")
    o.dtype = DType::kFloat16;
  else if (dtype == "fp32")
    o.dtype = DType::kFloat32;
  else
    throw UsageError("--dtype", "'" + dtype + "' is not one of bf16, fp16, fp32");
  const model::ModelConfig config =
      check_option("--shape", [&] { return model::preset_config(shape); });
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t bytes = model::write_random_checkpoint(config, out, o);
  // A tokenizer and chat template beside the weights, so the checkpoint is served like a real one.
  tokenizer::write_checkpoint_tokenizer(out, static_cast<int32_t>(config.vocab_size));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %s, %.3f GB of %s weights in %.1f s (%.2f GB/s)\n", out.c_str(), shape.c_str(),
              static_cast<double>(bytes) / 1e9, dtype.c_str(), s,
              static_cast<double>(bytes) / 1e9 / s);
  return 0;
}

Register reg("make-checkpoint", "write a random-weight model directory (tiny, mistral-7b, ...)",
             make_checkpoint);

}  // namespace
}  // namespace flashserve::cli
