// What the host passes to the sm90 backward kernel (bwd_kernel.h): TMA tensor maps (q and dout
// with boxes of 64 columns x kBlockM rows, k and v with 64 x kBlockN, and the fp32 dQ
// accumulator's for the bulk reduce-add; varlen tensors as one sequence of all their rows, as the
// forward's maps) and the parameters the sm80 backward takes (sm80/bwd_params.h: pointers,
// strides, the lengths' sources, the mask, the scale, the fp32 dQ accumulator and D in the
// workspace), which the shared preprocess and postprocess read too.
#pragma once

#include <cuda.h>

#include "attention/sm80/bwd_params.h"

namespace flashserve::attention::sm90 {

struct BwdParams {
  CUtensorMap tma_q, tma_k, tma_v, tma_do;
  // The fp32 dQ accumulator [q_rows][h_q][d] as q's map lays q out, boxes of 32 columns x 64
  // rows: the bulk reduce-add's target (FLASHSERVE_SM90_BWD_DQ_BULK=1; unset otherwise).
  CUtensorMap tma_dq_accum;
  sm80::BwdParams p;
  // The persistent grid (Cfg::kPersistent): a device int, zeroed by the launch, each CTA's
  // producer takes its next tile from (entry t of p.fwd.order); null otherwise.
  int* tile_counter;
  // The fused dQ conversion (bwd_kernel.h convert_dq_if_last): [batch][h_kv] zeroed device ints,
  // each unit's count of CTAs done; null: the postprocess converts dq.
  int* dq_counters;
};

}  // namespace flashserve::attention::sm90
