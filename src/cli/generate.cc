// flashserve generate: one prompt of token ids through a model directory, printing the new ids
// (text comes with the tokenizer).
//   flashserve generate --model /tmp/tiny --prompt-ids 1,2,3 --max-tokens 32
//   flashserve generate --model DIR --prompt-ids 5,6 --temperature 0.8 --top-p 0.9 --seed 7
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/options.h"
#include "model/generate.h"
#include "model/runner.h"

namespace flashserve::cli {
namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    ids.push_back(static_cast<int32_t>(
        parse_int("--prompt-ids", text.substr(begin, end - begin), {0, INT32_MAX})));
    begin = end + 1;
  }
  return ids;
}

int generate(int argc, char** argv) {
  std::string dir, prompt, device = "cpu";
  model::GenerateOptions o;
  double temperature = 0, top_p = 1;
  int64_t top_k = 0;
  bool ignore_eos = false;
  CLI::App app{"Generate token ids from a prompt of token ids"};
  app.option_defaults()->always_capture_default();
  app.add_option("--model", dir, "model directory (config.json + safetensors)")->required();
  app.add_option("--prompt-ids", prompt, "comma-separated token ids, e.g. 1,2,3")->required();
  add_int(app, "--max-tokens", o.max_tokens, {1, 1 << 20}, "new tokens at most");
  add_real(app, "--temperature", temperature, {0, 1e4}, "0: greedy");
  auto* top_k_opt =
      add_int(app, "--top-k", top_k, {0, INT32_MAX}, "keep the k most likely tokens (0: all)");
  auto* top_p_opt =
      add_real(app, "--top-p", top_p, {0, 1, Open::kLow}, "keep the smallest set with this mass");
  auto* seed_opt = add_uint(app, "--seed", o.sampling.seed, "sampling seed");
  add_int(app, "--prefill-chunk", o.prefill_chunk, {0, 1 << 20},
          "prefill the prompt in chunks of this many tokens (0: whole)");
  app.add_flag("--ignore-eos", ignore_eos, "keep generating after the eos token");
  app.add_option("--device", device, "cpu or cuda");
  if (const int rc = parse(app, argc, argv); rc >= 0) return rc;
  if (device != "cpu" && device != "cuda")
    throw UsageError("--device", "'" + device + "' is not one of cpu, cuda");
  // Greedy decoding (temperature 0) takes the likeliest token: nothing is sampled.
  for (auto* opt : {top_k_opt, top_p_opt, seed_opt})
    refuse_unless(opt, temperature > 0, "only applies when sampling (--temperature > 0)");
  o.sampling.temperature = static_cast<float>(temperature);
  o.sampling.top_k = static_cast<int32_t>(top_k);
  o.sampling.top_p = static_cast<float>(top_p);
  o.stop_at_eos = !ignore_eos;
  const std::vector<int32_t> ids = parse_ids(prompt);
  // What the model directory holds (or lacks) is --model's fault: the error names the flag.
  std::unique_ptr<model::ModelRunner> runner = check_option("--model", [&] {
    return device == "cuda" ? model::make_cuda_runner(dir, 0) : model::make_cpu_runner(dir);
  });
  const std::vector<int32_t> out = model::generate(*runner, ids, o);
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
  std::printf("\n");
  return 0;
}

Register reg("generate", "generate token ids from a model directory and prompt ids", generate);

}  // namespace
}  // namespace flashserve::cli
