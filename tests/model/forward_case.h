// What the CPU forward tests share: small random models covering each architecture's features,
// sequences in a shuffled paged pool, and the comparison of a row of logits with the float64
// reference's (reference_model.h) at float32 rounding's tolerance.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/forward_batch.h"
#include "support/worst.h"

namespace flashserve::model::testing {

inline ModelConfig small_config(const std::string& variant) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.num_hidden_layers = 2;
  c.hidden_size = 128;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;  // q width 256 != hidden: o_proj is not square, a transposition shows
  c.intermediate_size = 192;
  c.vocab_size = 300;
  c.max_position_embeddings = 512;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000;
  if (variant == "qwen2") {
    c.architecture = "Qwen2ForCausalLM";
    c.attention_bias = true;
    c.tie_word_embeddings = true;
    c.num_key_value_heads = 1;  // MQA
    c.rope_theta = 1e6;
  } else if (variant == "llama3") {
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = 8;
    c.rope_scaling.low_freq_factor = 1;
    c.rope_scaling.high_freq_factor = 4;
    // Wavelengths above 64 are scaled, below 16 kept, between blended: all three bands occur.
    c.rope_scaling.original_max_position_embeddings = 64;
    c.num_key_value_heads = 4;      // MHA
  } else if (variant == "qwen3") {  // q/k RMSNorm per head before RoPE, no bias
    c.architecture = "Qwen3ForCausalLM";
    c.qk_norm = true;
    c.rope_theta = 1e6;
  } else if (variant == "yarn") {
    c.rope_scaling.type = "yarn";
    c.rope_scaling.factor = 4;
    // Dimensions 0..9 blend, the rest are interpolated; cos and sin scale by 1 + 0.1 ln 4.
    c.rope_scaling.original_max_position_embeddings = 64;
  } else if (variant == "mistral") {
    c.architecture = "MistralForCausalLM";
    c.sliding_window = 7;
  }
  c.validate();
  return c;
}

// A sequence in the test's paged pool.
struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
};

// Blocks of the pool dealt to the sequences in a random order, so that pages are not contiguous.
inline std::vector<Seq> make_seqs(std::mt19937_64& rng, const std::vector<int64_t>& lens,
                                  int64_t vocab, int32_t block_size, int64_t capacity,
                                  int64_t* num_blocks) {
  int64_t total = 0;
  for (size_t i = 0; i < lens.size(); ++i) total += (capacity + block_size - 1) / block_size;
  std::vector<int32_t> ids(static_cast<size_t>(total));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  std::vector<Seq> seqs;
  size_t next = 0;
  for (int64_t len : lens) {
    Seq s;
    for (int64_t t = 0; t < len; ++t) s.tokens.push_back(tok(rng));
    for (int64_t b = 0; b < (capacity + block_size - 1) / block_size; ++b)
      s.blocks.push_back(ids[next++]);
    seqs.push_back(std::move(s));
  }
  *num_blocks = total;
  return seqs;
}

// Step `step` of the tests' schedule over `seqs` (every one sampled): step 0 every prompt whole,
// then one token a step, drawn at random and appended to the sequence's tokens (not sampled: the
// logits are what is checked).
inline ForwardBatch prefill_then_decode_step(std::vector<Seq>& seqs, int64_t step,
                                             int32_t block_size, int64_t vocab,
                                             std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  ForwardBatchBuilder bb(block_size);
  for (Seq& s : seqs) {
    if (step > 0) s.tokens.push_back(tok(rng));
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    const int64_t start = step == 0 ? 0 : n - 1;
    bb.add(s.tokens.data() + start, start, n - start, s.blocks, true);
  }
  return std::move(bb).build();
}

// Largest |ours - reference| over a row, and the row's RMS.
struct Diff {
  double max_abs = 0, rms = 0;
};
inline Diff compare(const float* ours, const std::vector<double>& ref) {
  Diff d;
  for (size_t i = 0; i < ref.size(); ++i) {
    d.max_abs =
        flashserve::testing::worse(d.max_abs, std::fabs(static_cast<double>(ours[i]) - ref[i]));
    d.rms += ref[i] * ref[i];
  }
  d.rms = std::sqrt(d.rms / static_cast<double>(ref.size()));
  return d;
}

// float32 throughout (GEMMs over at most 256 terms, softmax, norms) against float64: the largest
// error seen over many seeds is 3e-6 of the logits' RMS (about 25 float32 epsilons); 3e-5 leaves a
// 10x margin and is 1000x below a real defect (a wrong bias, rotation band or mask moves logits by
// 0.01-0.5 of their RMS).
constexpr double kRelTol = 3e-5;

}  // namespace flashserve::model::testing
