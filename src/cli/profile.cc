// flashserve profile: measures a model's step costs by parts with the real runner (the CPU runner,
// or the CUDA runner with --device cuda) and writes the table the simulator's profile cost model
// interpolates (serve/step_profile.h; docs/serving.md, "Profile cost model").
//   flashserve profile --shape tiny --quick --out /tmp/tiny-profile.csv
//   flashserve profile --model /tmp/mistral-7b-random --device cuda --out m7b-h200.csv
// With --tensor-parallel-size N (Vidur's method, docs/tensor-parallel.md): the step tables time
// one rank's compute, a model of rank 0's heads, MLP columns and vocabulary with random weights
// (model/tensor_parallel.h's rank_config), on one device; the all_reduce and all_gather tables
// time the collectives alone over N ranks (NCCL over GPUs 0..N-1 on cuda, the in-process group on
// cpu).
//   flashserve profile --shape yi-34b --device cuda --tensor-parallel-size 2 --out yi-tp2.csv
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
#include "cli/tensor_parallel_flag.h"
#include "engine/collective_profiler.h"
#include "engine/model_engine.h"
#include "engine/step_profiler.h"
#include "flashserve/error.h"
#include "model/checkpoint.h"
#include "model/local_communicator.h"
#include "model/nccl_communicator.h"
#include "model/presets.h"
#include "model/random_checkpoint.h"
#include "model/tensor_parallel.h"

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
                            "cuda: fraction of the GPU's memory for the weights, the largest "
                            "step's buffers and the KV pool");
  auto* kv_mem_opt = add_real(app, "--kv-memory-mb", kv_memory_mb, {1, 1 << 24, Open::kNone},
                              "cpu: MiB of KV pool");
  KvCacheDtypeFlag kv_dtype_flag;
  kv_dtype_flag.add(app);
  TensorParallelFlag tp;
  tp.add(app);
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  if ((model_opt->count() > 0) == (shape_opt->count() > 0))
    throw UsageError("--model", "give exactly one of --model DIR and --shape NAME");
  if (device != "cpu" && device != "cuda")
    throw UsageError("--device", "'" + device + "' is not one of cpu, cuda");
  tp.check_device(device);
  refuse_unless(max_len_opt, !quick && !smoke, "sets the full grid; --quick has its own");
  refuse_unless(reps_opt, !smoke, "--smoke times one step a point");
  const model::ModelConfig config =
      shape.empty()
          ? check_option("--model", [&] { return model::Checkpoint::open(model_dir).config(); })
          : check_option("--shape", [&] { return model::preset_config(shape); });
  tp.check_model(config);
  const int ranks = static_cast<int>(tp.size);
  std::vector<int> gpus;  // the all-reduce's devices on cuda: 0 .. N-1
  if (ranks > 1 && device == "cuda")
    for (int g = 0; g < ranks; ++g) gpus.push_back(g);
  const model::KvCacheDtype kv_dtype = kv_dtype_flag.resolve(device);
  // The table is written after minutes of measuring: a path that cannot be written fails now.
  std::ofstream f(out);
  if (!f) throw UsageError("--out", "cannot write '" + out + "'");
  refuse_unless(util_opt, device == "cuda", "sizes the GPU's KV pool (--device cuda)");
  refuse_unless(kv_mem_opt, device == "cpu", "sizes the CPU's KV pool (--device cpu)");

  // A --shape on the GPU gets weights generated on the device; on the CPU, a checkpoint written
  // to a scratch directory. So does a tensor-parallel rank's stand-in, whatever the source.
  const bool stand_in = ranks > 1;
  const bool on_device = (!shape.empty() || stand_in) && device == "cuda";
  ScratchDir scratch((!shape.empty() || stand_in) && !on_device);
  const model::ModelConfig rank_model = stand_in ? model::rank_config(config, ranks) : config;
  const std::string source = shape.empty() ? model_dir : "random " + shape;
  if (!scratch.path.empty()) {
    std::printf(
        "writing a random %s checkpoint to %s...\n",
        stand_in ? ("rank 0 of " + std::to_string(ranks) + " of " + source).c_str() : shape.c_str(),
        scratch.path.c_str());
    std::fflush(stdout);
    model::write_random_checkpoint(rank_model, scratch.path);
  }
  fe::ModelEngineOptions mo;
  mo.model_dir = scratch.path.empty() ? model_dir : scratch.path;
  if (on_device && stand_in)
    mo.random_config = rank_model;
  else if (on_device)
    mo.random_shape = shape;
  const std::string model_name =
      stand_in    ? "rank 0 of " + std::to_string(ranks) + " of " + source + " (random weights)"
      : on_device ? "random " + shape + " (weights made on the device)"
                  : mo.model_dir;
  mo.device = device;
  mo.block_size = block_size;
  mo.gpu_memory_utilization = gpu_mem_util;
  mo.cpu_kv_bytes = kv_memory_mb * (1 << 20);
  mo.kv_cache_dtype = kv_dtype;
  fe::ProfileGrid grid = smoke   ? fe::ProfileGrid::smoke()
                         : quick ? fe::ProfileGrid::quick()
                                 : fe::ProfileGrid::full(std::min<int64_t>(
                                       max_len, rank_model.max_position_embeddings / 2));
  if (!smoke) grid.reps = static_cast<int>(reps);
  // The pool is sized after the buffers of the grid's largest step, as serving sizes it.
  for (const std::vector<int64_t>* axis : {&grid.tokens, &grid.chunk, &grid.decode_batch})
    mo.largest_step_tokens = std::max(mo.largest_step_tokens, axis->back());
  mo.largest_step_rows = grid.decode_batch.back();
  const auto t0 = std::chrono::steady_clock::now();
  const fe::LoadedModel model = fe::load_model(mo);
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
  if (stand_in) {
    // The all-reduces of a step of T tokens: two a layer of T x hidden activations (bf16 on the
    // GPU, float32 on the CPU), timed alone over the ranks at the linear table's token counts.
    // The logits' all-gather of S sampled rows: each rank's vocabulary block of float32 logits,
    // at the decode batch sizes (a step samples at most one row an entry).
    const int64_t elem = device == "cuda" ? 2 : 4;
    std::printf("timing the all-reduce and the logits' all-gather over %d ranks (%s)...\n", ranks,
                device == "cuda" ? "NCCL" : "in-process");
    std::fflush(stdout);
    auto group = device == "cuda" ? model::make_nccl_group(gpus) : model::make_local_group(ranks);
    fe::CollectiveGrid ar = fe::CollectiveGrid::for_counts(
        fe::Collective::kAllReduce, grid.tokens, config.hidden_size * elem,
        device == "cuda" ? DType::kBFloat16 : DType::kFloat32);
    const int64_t gather_row = model::rank_shape(config, ranks, 0).vocab_block * 4;
    fe::CollectiveGrid ag = fe::CollectiveGrid::for_counts(
        fe::Collective::kAllGather, grid.decode_batch, gather_row, DType::kFloat32);
    if (smoke) ar.reps = ag.reps = 1, ar.warmup = ag.warmup = 0;
    p.all_reduce = fe::profile_collective(*group, gpus, ar);
    p.all_reduces_per_step = 2 * config.num_hidden_layers;
    p.all_reduce_bytes_per_token = static_cast<double>(config.hidden_size * elem);
    p.all_gather = fe::profile_collective(*group, gpus, ag);
    p.logits_gather_bytes_per_row = static_cast<double>(gather_row);
    p.meta["tensor_parallel_size"] = std::to_string(ranks);
    p.meta["checkpoint"] = "rank 0 of " + std::to_string(ranks) + " of " + source;
    p.validate(out);
  }
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
