// A synthetic step profile whose costs have closed forms, for tests that hand-compute what the
// profile cost model (and what is built on it: the SLOs, the auto budget) must give:
//   linear(T) = decode_base(T) = base_s + per_token_s x T   (exact: the tables are linear)
//   decode_attn(B, L)           = per_key_s x B x L           (exact: bilinear in B and L)
//   prefill_attn, sample_row, overhead: 0.
#pragma once

#include "serve/step_profile.h"

namespace flashserve::testing {

inline serve::StepProfile linear_profile(double base_s, double per_token_s, double per_key_s) {
  serve::StepProfile p;
  p.meta["model"] = "synthetic";
  p.linear.x = p.decode_base.x = {1, 100000};
  for (double x : p.linear.x) p.linear.seconds.push_back(base_s + per_token_s * x);
  p.decode_base.seconds = p.linear.seconds;
  p.prefill_attn.x = {1, 100000};
  p.prefill_attn.y = {0, 1000000};
  p.prefill_attn.seconds.assign(4, 0.0);
  p.decode_attn.x = {1, 1024};
  p.decode_attn.y = {1, 1000000};
  for (double b : p.decode_attn.x)
    for (double l : p.decode_attn.y) p.decode_attn.seconds.push_back(per_key_s * b * l);
  return p;
}

}  // namespace flashserve::testing
