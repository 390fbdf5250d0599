// A model's measured step costs, split into parts (Vidur-style), as `flashserve profile` writes
// them and the profile cost model (cost_model.h) interpolates them. Prefill and decode attention
// are separate tables over their own axes: one whole-step grid over a single KV axis would mix
// costs ~20x apart (a chunk's keys are compute-bound, a decode's memory-bound).
//
// The parts, each from whole steps of constructed batches timed by the engine's executor (layout ->
// forward -> sample; engine/step_profiler.h) and derived by differences:
//   linear(T)          a step of T one-token entries at KV length 1, one of them sampled: the
//                      linear layers, norms, RoPE, the per-step fixed cost of the forward
//   decode_base(B)     a decode-only step of B entries at KV length 1, every one sampled (on the
//   GPU
//                      the CUDA-graph path, as the engine's decode-only steps are)
//   sample_row         seconds per sampled row beyond the first: (T entries, T - 1 sampled) minus
//                      linear(T), over T - 2 rows
//   prefill_attn(C,K)  a prefill chunk of C tokens after K cached ones, minus linear(C)
//   decode_attn(B,L)   B decodes at KV length L, minus decode_base(B)
//   overhead           the engine's host time per step outside the executor (schedule, complete)
//   all_reduce(B)      tensor parallelism (a profile made with --tensor-parallel-size N > 1): one
//                      all-reduce of B bytes over the N ranks, measured on its own; the tables
//                      above are then one rank's compute (model/tensor_parallel.h's rank_config),
//                      as Vidur profiles them, and a step adds all_reduces x all_reduce(T x
//                      all_reduce_bytes_per_token) for its T tokens (two a layer: after o_proj and
//                      down_proj)
//   all_gather(B)      with tensor parallelism: one all-gather in which each rank sends B bytes,
//                      measured on its own; a step adds all_gather(S x
//                      logits_gather_bytes_per_row) for its S sampled rows (each rank's block of
//                      the LM head's logits, float32, gathered before sampling)
// Every table is non-decreasing along each axis (the profiler makes it so: a running maximum over
// the measured differences, which noise can make dip), so its interpolation is monotone.
//
// File format (CSV, docs/serving.md): `# key: value` lines (model, device, grid, method), then a
// header `table,x,y,seconds` and one row per grid point: `linear,T,0,s`, `decode_base,B,0,s`,
// `prefill_attn,C,K,s`, `decode_attn,B,L,s`, `sample_row,0,0,s`, `overhead,0,0,s`; with tensor
// parallelism also `all_reduce,B,0,s` and one `all_reduces,n,b,0` (n a step, b bytes a token),
// `all_gather,B,0,s` and one `logits_gather,b,0,0` (b bytes a sampled row from each rank).
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace flashserve::serve {

// Seconds over one axis, piecewise linear between the points and linear beyond the edges (the edge
// segment's slope), never below 0.
struct ProfileTable1 {
  std::vector<double> x, seconds;
  double at(double v) const;
};

// Seconds over two axes (x outer, y inner: seconds[i * y.size() + j]), bilinear.
struct ProfileTable2 {
  std::vector<double> x, y, seconds;
  double at(double u, double v) const;
  double& cell(size_t i, size_t j) { return seconds[i * y.size() + j]; }
  double cell(size_t i, size_t j) const { return seconds[i * y.size() + j]; }
};

struct StepProfile {
  std::map<std::string, std::string> meta;  // model, device, date, method, ...
  ProfileTable1 linear, decode_base;
  ProfileTable2 prefill_attn, decode_attn;
  double sample_row_s = 0, overhead_s = 0;
  // Tensor parallelism: empty all_reduce and all_gather (and zeros) for one device.
  ProfileTable1 all_reduce;
  int64_t all_reduces_per_step = 0;        // 2 x layers
  double all_reduce_bytes_per_token = 0;   // hidden x the activations' element size
  ProfileTable1 all_gather;                // x: bytes each rank sends
  double logits_gather_bytes_per_row = 0;  // the LM head's vocabulary block x 4 (float32)
  // Seconds of a step's all-reduces for `tokens` tokens (0 without tensor parallelism).
  double all_reduce_seconds(double tokens) const;
  // Seconds of a step's logits all-gather for `sampled` rows (0 without tensor parallelism).
  double logits_gather_seconds(double sampled) const;

  // Throws Error(kInvalidArgument, "profile", ...) naming the table: axes strictly increasing and
  // non-negative, values finite and >= 0, non-decreasing along every axis, no table empty.
  void validate(const std::string& name) const;
  void write_csv(std::ostream& out) const;
  static StepProfile read_csv(std::istream& in, const std::string& name);
  static StepProfile load(const std::string& path);
};

// Makes a measured grid non-decreasing along every axis by a running maximum (noise in the
// differences can make a later point dip below an earlier one).
void make_monotone(ProfileTable1& t);
void make_monotone(ProfileTable2& t);

}  // namespace flashserve::serve
