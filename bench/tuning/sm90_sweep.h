// sm90_sweep's variants: alternative tiles of the sm90 forward kernel (bf16), each a launch of
// sm90::launch<Cfg> on the same arguments. One file per head dim keeps each translation unit's
// ptxas work to a few kernels.
#pragma once

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

std::vector<Sm90Variant> sm90_variants_d64();
std::vector<Sm90Variant> sm90_variants_d128();
std::vector<Sm90Variant> sm90_variants_d256();

}  // namespace flashserve::bench
