// bench_constrained: what structured output costs a decode step (issue 24: a json_schema request
// in a batch of 64 must not make the step slower than 1.1x an unconstrained one). The engine as
// the server drives it (schedule, forward, masks, sample), on the CUDA runner at a real model's
// shape with random weights made on the device, or on the CPU runner with a checkpoint:
//   64 sequences (--batch) decode over --context prompt tokens each; K of them (--constrained,
//   default 0,1,8,64) carry response_format json_schema's constraint (server/json_constraint.h)
//   over a synthetic vocabulary of the model's size (synthetic_vocab.h: the random model has no
//   tokenizer); the wall clock of each engine step once every prompt is in, over --steps steps,
//   beside the same batch with K = 0 in the same run.
// A constrained row whose object completes starts another (a bench-only wrapper), so every step
// computes K masks from states across the object (keys, strings, numbers, punctuation), and no row
// leaves the batch (ignore_eos, max_tokens past the run).
//   bench_constrained [--shape mistral-7b | --model DIR --device cpu] [--batch 64] [--context 512]
//                     [--steps 64] [--constrained 0,1,8,64]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_args.h"
#include "engine/model_engine.h"
#include "server/json_constraint.h"
#include "server/json_schema.h"
#include "synthetic_vocab.h"

namespace fe = flashserve::engine;
namespace fm = flashserve::model;
namespace fs = flashserve::server;
using Clock = std::chrono::steady_clock;

namespace {

// The request's schema: an object of a string, an integer, an enum and an array of strings
// (json_mask_cost's), a shape agents ask for.
std::shared_ptr<const fm::JsonGrammar> schema_grammar() {
  return fs::json_schema_grammar(nlohmann::ordered_json::parse(R"({"type": "object",
      "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
      "color": {"enum": ["red", "green", "blue"]},
      "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name"]})"),
                                 "schema", false);
}

// A json_schema constraint that starts a new object when one completes, so that the row keeps
// computing masks for as long as the run lasts; counts the time its masks take.
class RepeatingJson final : public fm::TokenConstraint {
 public:
  RepeatingJson(std::shared_ptr<const fs::VocabTrie> trie,
                std::shared_ptr<const fm::JsonGrammar> grammar, std::atomic<double>* mask_ms)
      : trie_(std::move(trie)), grammar_(std::move(grammar)), mask_ms_(mask_ms) {
    restart();
  }
  bool allowed_next(std::vector<uint32_t>& allowed) override {
    const auto t0 = Clock::now();
    if (inner_->allowed_next(allowed)) {
      std::fill(allowed.begin(), allowed.end(), 0u);
      restart();
      inner_->allowed_next(allowed);
    }
    // Rows' masks run on the executor's workers at once: their times add up atomically.
    mask_ms_->fetch_add(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    return false;
  }
  void accept(int32_t token) override { inner_->accept(token); }

 private:
  void restart() { inner_ = std::make_unique<fs::JsonConstraint>(trie_, grammar_); }
  std::shared_ptr<const fs::VocabTrie> trie_;
  std::shared_ptr<const fm::JsonGrammar> grammar_;
  std::unique_ptr<fs::JsonConstraint> inner_;
  std::atomic<double>* mask_ms_;
};

struct Timing {
  double step_ms = 0;  // mean wall clock of an engine step
  double mask_ms = 0;  // mean CPU time of the masks in a step, summed over the constrained rows
};

Timing run(const fe::LoadedModel& model, const std::shared_ptr<const fs::VocabTrie>& trie,
           const std::shared_ptr<const fm::JsonGrammar>& grammar, int batch, int64_t context,
           int steps, int constrained) {
  flashserve::serve::SchedulerConfig sc;
  sc.policy = flashserve::serve::Policy::kVllmV1;  // whole prompts in few steps; decodes after
  sc.max_tokens_per_step = 8192;
  sc.max_running = batch;
  sc.max_model_len = context + steps + 64;
  auto engine = fe::make_model_engine(model, sc);
  const int32_t vocab = static_cast<int32_t>(model.runner->config().vocab_size);
  std::mt19937 rng(7);
  std::atomic<double> mask_ms = 0;
  for (int i = 0; i < batch; ++i) {
    fe::NewRequest r;
    r.prompt.resize(static_cast<size_t>(context));
    for (int32_t& t : r.prompt) t = static_cast<int32_t>(rng() % vocab);
    r.max_tokens = steps + 48;
    r.ignore_eos = true;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 1000 + i;
    if (i < constrained) r.constraint = std::make_shared<RepeatingJson>(trie, grammar, &mask_ms);
    engine->add_request(std::move(r));
  }
  // Until every prompt is in and every row decodes: then a few steps to warm up (graphs).
  for (;;) {
    const int64_t tokens = engine->step().num_tokens;
    if (engine->scheduler().num_waiting() == 0 && tokens == batch) break;
  }
  for (int i = 0; i < 8; ++i) engine->step();
  mask_ms = 0;
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) {
    const fe::StepResult s = engine->step();
    if (s.num_tokens != batch) {
      std::fprintf(stderr, "step %d ran %lld tokens, not %d: a row left the batch\n", i,
                   static_cast<long long>(s.num_tokens), batch);
      std::exit(1);
    }
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return {ms / steps, mask_ms.load() / steps};
}

}  // namespace

int main(int argc, char** argv) {
  fe::ModelEngineOptions o;
  o.model_dir = arg(argc, argv, "--model", "");
  o.device = arg(argc, argv, "--device", "cuda");
  if (o.model_dir.empty()) o.random_shape = arg(argc, argv, "--shape", "mistral-7b");
  const int batch = std::atoi(arg(argc, argv, "--batch", "64").c_str());
  const int64_t context = std::atoll(arg(argc, argv, "--context", "512").c_str());
  const int steps = std::atoi(arg(argc, argv, "--steps", "64").c_str());
  const std::vector<int> ks = parse_int_list(arg(argc, argv, "--constrained", "0,1,8,64").c_str());
  const fe::LoadedModel model = fe::load_model(o);
  const fm::ModelConfig& c = model.runner->config();
  const int32_t vocab = static_cast<int32_t>(c.vocab_size);
  const auto t0 = Clock::now();
  const auto trie =
      std::make_shared<const fs::VocabTrie>(flashserve::bench::synthetic_vocab(vocab));
  const auto grammar = schema_grammar();
  std::printf(
      "model: %s (%s, %lld layers, hidden %lld, vocab %d) on %s; synthetic vocabulary's trie "
      "built in %.0f ms\nbatch %d decoding over %lld-token prompts, %d steps timed per row "
      "(vllm-v1's engine step: schedule, forward, masks, sample)\n\n",
      o.model_dir.empty() ? ("random " + o.random_shape).c_str() : o.model_dir.c_str(),
      c.architecture.c_str(), static_cast<long long>(c.num_hidden_layers),
      static_cast<long long>(c.hidden_size), vocab, o.device.c_str(),
      std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), batch,
      static_cast<long long>(context), steps);
  std::printf(
      "| json_schema rows | step (ms) | masks per step (CPU ms, summed over the rows) | step / "
      "unconstrained |\n|---|---|---|---|\n");
  // The process's first engine pays for first-touch allocations and warm-up the later ones do
  // not: one unconstrained run first, not timed, so that K = 0 is measured as the others are.
  run(model, trie, grammar, batch, context, steps, 0);
  const Timing base = run(model, trie, grammar, batch, context, steps, 0);
  for (int k : ks) {
    const Timing t = k == 0 ? base : run(model, trie, grammar, batch, context, steps, k);
    std::printf("| %d | %.3f | %.3f | %.3f |\n", k, t.step_ms, t.mask_ms, t.step_ms / base.step_ms);
  }
  return 0;
}
