// flashserve profile: measures a model's step costs by parts with the real runner (the CPU runner,
// or the CUDA runner with --device cuda) and writes the table the simulator's profile cost model
// interpolates (serve/step_profile.h; docs/serving.md, "Profile cost model").
//   flashserve profile --shape tiny --quick --out /tmp/tiny-profile.csv
//   flashserve profile --model /tmp/mistral-7b-random --device cuda --out m7b-h200.csv
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "cli/command.h"
#include "cli/kv_cache_flag.h"
#include "cli/options.h"
#include "cli/scratch_dir.h"
#include "engine/model_engine.h"
#include "engine/step_profiler.h"
#include "flashserve/error.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"

namespace flashserve::cli {
namespace {

namespace fe = flashserve::engine;

int profile(int argc, char** argv) {
  std::string model_dir, shape, device = "cpu", out;
  bool quick = false, smoke = false;
  int64_t max_len = 8192, reps = 3;
  int32_t block_size = 16;
  double gpu_mem_util = 0.9, kv_memory_mb = 512;
  CLI::App app{"Measure a model's step costs by parts for the simulator's profile cost model"};
  auto* model_opt =
      app.add_option("--model", model_dir, "model directory (config.json + safetensors)");
  auto* shape_opt =
      app.add_option("--shape", shape, "a random checkpoint of this preset, made on the fly");
  app.add_option("--device", device, "cpu or cuda")->default_str(device);
  app.add_option("--out", out, "the table to write (CSV)")->required();
  auto* quick_opt =
      app.add_flag("--quick", quick, "a small grid (tests): tokens to 192, KV to 384");
  app.add_flag("--smoke", smoke,
               "the smallest grid, one step a point (sanitizer tests: checks the path only)")
      ->excludes(quick_opt);
  auto* max_len_opt = add_int(app, "--max-len", max_len, {16, 1 << 20},
                              "full grid: the largest chunk, cached KV, decode KV and step tokens");
  auto* reps_opt =
      add_int(app, "--reps", reps, {1, 1000}, "timed steps per point (the median is kept)");
  add_int(app, "--block-size", block_size, {1, 1 << 12}, "KV block size in tokens");
  auto* util_opt = add_real(app, "--gpu-memory-utilization", gpu_mem_util, {0, 1, Open::kLow},
                            "cuda: fraction of the GPU's memory for weights + KV");
  auto* kv_mem_opt = add_real(app, "--kv-memory-mb", kv_memory_mb, {1, 1 << 24, Open::kNone},
                              "cpu: MiB of KV pool");
  KvCacheDtypeFlag kv_dtype_flag;
  kv_dtype_flag.add(app);
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  if ((model_opt->count() > 0) == (shape_opt->count() > 0))
    throw UsageError("--model", "give exactly one of --model DIR and --shape NAME");
  if (device != "cpu" && device != "cuda")
    throw UsageError("--device", "'" + device + "' is not one of cpu, cuda");
  refuse_unless(max_len_opt, !quick && !smoke, "sets the full grid; --quick has its own");
  refuse_unless(reps_opt, !smoke, "--smoke times one step a point");
  if (!shape.empty()) check_option("--shape", [&] { return model::preset_config(shape); });
  const model::KvCacheDtype kv_dtype = kv_dtype_flag.resolve(device);
  // The table is written after minutes of measuring: a path that cannot be written fails now.
  std::ofstream f(out);
  if (!f) throw UsageError("--out", "cannot write '" + out + "'");
  refuse_unless(util_opt, device == "cuda", "sizes the GPU's KV pool (--device cuda)");
  refuse_unless(kv_mem_opt, device == "cpu", "sizes the CPU's KV pool (--device cpu)");

  // A --shape on the GPU gets weights generated on the device; on the CPU, a checkpoint written
  // to a scratch directory.
  const bool on_device = !shape.empty() && device == "cuda";
  ScratchDir scratch(!shape.empty() && !on_device);
  if (!scratch.path.empty()) {
    std::printf("writing a random %s checkpoint to %s...\n", shape.c_str(), scratch.path.c_str());
    std::fflush(stdout);
    model::write_random_checkpoint(model::preset_config(shape), scratch.path);
  }
  fe::ModelEngineOptions mo;
  mo.model_dir = shape.empty() ? model_dir : scratch.path;
  if (on_device) mo.random_shape = shape;
  const std::string model_name =
      on_device ? "random " + shape + " (weights made on the device)" : mo.model_dir;
  mo.device = device;
  mo.block_size = block_size;
  mo.gpu_memory_utilization = gpu_mem_util;
  mo.cpu_kv_bytes = kv_memory_mb * (1 << 20);
  mo.kv_cache_dtype = kv_dtype;
  const auto t0 = std::chrono::steady_clock::now();
  const fe::LoadedModel model = fe::load_model(mo);
  fe::ProfileGrid grid = smoke ? fe::ProfileGrid::smoke()
                         : quick
                             ? fe::ProfileGrid::quick()
                             : fe::ProfileGrid::full(std::min<int64_t>(
                                   max_len, model.runner->config().max_position_embeddings / 2));
  if (!smoke) grid.reps = static_cast<int>(reps);
  std::printf("profiling %s on %s: KV pool %lld blocks x %d tokens (%s)\n", model_name.c_str(),
              model.device.c_str(), static_cast<long long>(model.num_blocks), model.block_size,
              flashserve::model::kv_cache_dtype_name(kv_dtype));
  fe::ProfileProgress progress;
  progress.on_point = [](const std::string& what, int64_t done, int64_t total) {
    std::fprintf(stderr, "\r%lld/%lld %-40s", static_cast<long long>(done),
                 static_cast<long long>(total), what.c_str());
    if (done == total) std::fprintf(stderr, "\n");
  };
  const auto t1 = std::chrono::steady_clock::now();
  serve::StepProfile p = fe::profile_model(model, grid, progress);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  if (!shape.empty()) p.meta["checkpoint"] = "random " + shape;
  p.meta["kv_cache_dtype"] = flashserve::model::kv_cache_dtype_name(kv_dtype);
  p.meta["grid"] = smoke   ? "smoke"
                   : quick ? "quick"
                           : "full, max len " + std::to_string(grid.tokens.back());
  p.write_csv(f);
  f.close();
  if (!f) throw Error(ErrorKind::kInternal, "--out", "writing '" + out + "' failed");
  std::printf("linear: %.3f ms at %g tokens .. %.3f ms at %g\n", p.linear.seconds.front() * 1e3,
              p.linear.x.front(), p.linear.seconds.back() * 1e3, p.linear.x.back());
  std::printf("decode: base %.3f ms at batch %g; attention %.3f ms at %g x %g\n",
              p.decode_base.seconds.front() * 1e3, p.decode_base.x.front(),
              p.decode_attn.seconds.back() * 1e3, p.decode_attn.x.back(), p.decode_attn.y.back());
  std::printf("prefill attention: %.3f ms for %g tokens after %g cached\n",
              p.prefill_attn.seconds.back() * 1e3, p.prefill_attn.x.back(),
              p.prefill_attn.y.back());
  std::printf("sampled row %.2f us, engine overhead %.3f ms/step\n", p.sample_row_s * 1e6,
              p.overhead_s * 1e3);
  const double all = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s (%.1f s of measuring, %.1f s with loading)\n", out.c_str(), secs, all);
  return 0;
}

Register reg("profile", "measure a model's step costs by parts (the simulator's profile table)",
             profile);

}  // namespace
}  // namespace flashserve::cli
