// sm90_sweep's variants: alternative tiles of the sm90 forward kernel (bf16), each a launch of
// sm90::launch<Cfg> on the same arguments. One file per head dim keeps each translation unit's
// ptxas work to a few kernels.
#pragma once

#include <cmath>
#include <vector>

#include "attention/sm90/launch_template.h"

namespace flashserve::bench {

struct Sm90Variant {
  const char* name;
  int head_dim;
  bool causal;
  void (*run)(const attention::sm90::FwdArgs&);
};

template <class Cfg, bool kCausal>
void run_sm90_variant(const attention::sm90::FwdArgs& a) {
  attention::sm90::FwdParams p = attention::sm90::fwd_params(a);
  attention::sm90::launch<Cfg, true, kCausal>(p, a);
}

template <class Cfg, bool kCausal>
void add_variant(std::vector<Sm90Variant>& v, const char* name) {
  v.push_back({name, Cfg::kHeadDim, kCausal, run_sm90_variant<Cfg, kCausal>});
}

// The FA3 grid's arguments (bf16 [batch, L, heads, d], batch x L = tokens, heads x d = hidden)
// on buffers the caller allocated for `tokens` x `hidden` elements (lse: tokens x hidden / d).
inline attention::sm90::FwdArgs grid_args(const void* q, const void* k, const void* v, void* out,
                                          float* lse, int* counter, int d, int L, bool causal,
                                          int tokens, int hidden, int sms, int l2,
                                          cudaStream_t stream) {
  attention::sm90::FwdArgs a{};
  const int heads = hidden / d;
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.lse = lse;
  a.dtype = DType::kBFloat16;
  a.batch = a.seqs = tokens / L;
  a.seq_begin = 0;
  a.only = 0;  // every sequence
  a.seqlen_q = a.seqlen_k = a.max_seqlen_q = a.max_seqlen_k = L;
  a.h_q = a.h_kv = heads;
  a.head_dim = d;
  const int64_t row = hidden, bstride = row * L;
  a.q_batch_stride = a.k_batch_stride = a.v_batch_stride = a.o_batch_stride = bstride;
  a.q_row_stride = a.k_row_stride = a.v_row_stride = a.o_row_stride = row;
  a.q_head_stride = a.k_head_stride = a.v_head_stride = a.o_head_stride = d;
  a.lse_batch_stride = int64_t{heads} * L;
  a.lse_head_stride = L;
  a.lse_row_stride = 1;
  a.window_left = -1;
  a.window_right = causal ? 0 : -1;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.sms = sms;
  a.l2_bytes = l2;
  a.tile_counter = counter;
  a.stream = stream;
  return a;
}

std::vector<Sm90Variant> sm90_variants_d64();
std::vector<Sm90Variant> sm90_variants_d128();
std::vector<Sm90Variant> sm90_variants_d256();

}  // namespace flashserve::bench
