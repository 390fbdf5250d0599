// Host entry point of the sm90 backward kernels (bwd_kernel.h; bwd_swapped_kernel.h at d256):
// dense or varlen batches (seqused_k too), head dims 64, 128 and 256, bf16/fp16, no mask,
// bottom-right causal or a sliding window, GQA/MQA; dq through the fp32 accumulator (atomics or
// bulk reduce-adds: BwdArgs::dq_bulk; d256 bulk only), not deterministic.
// attention/backward_cuda.cu decides when it runs (choose_backward_family in
// attention/cuda/plan.h; FLASHSERVE_BWD_KERNEL forces either family).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/sm80/bwd_params.h"
#include "flashserve/tensor.h"

namespace flashserve::attention::sm90 {

struct BwdArgs {
  DType dtype;  // kBFloat16 or kFloat16
  bool masked;  // causal or a window side: the masked instantiation
  // dQ through shared memory and a TMA bulk reduce-add per step instead of per-element atomics
  // (FLASHSERVE_SM90_BWD_DQ_BULK, read by the dispatch once per call: parse_sm90_bwd_dq_bulk in
  // attention/cuda/plan.h). Either way dq is summed in no fixed order.
  bool dq_bulk;
  // With dq_bulk: each step in FlashAttention-3's order (BwdOverlapTile in tile_config.h,
  // FLASHSERVE_SM90_BWD_OVERLAP: parse_sm90_bwd_overlap). The atomics' kernel ignores it.
  bool overlap;
  // With dq_bulk, on a masked call: the key blocks heaviest first (BwdHeavyFirstTile in
  // tile_config.h, FLASHSERVE_SM90_BWD_HEAVY_FIRST: parse_sm90_bwd_heavy_first), sections sized
  // by the device's multiprocessors and L2 (sms, l2_bytes: read only then). Ignored elsewhere.
  bool heavy_first;
  // With dq_bulk: a persistent grid, min(tiles, sms) CTAs each looping over tiles
  // (BwdPersistentTile in tile_config.h, FLASHSERVE_SM90_BWD_PERSISTENT:
  // parse_sm90_bwd_persistent), taking tiles from tile_counter; masked calls in the
  // heaviest-first order whatever heavy_first says (bwd_launch_template.h persistent_order). The
  // atomics' kernel ignores it.
  bool persistent;
  // The device's multiprocessors and L2 bytes: read only for heavy_first or persistent.
  int sms;
  int64_t l2_bytes;
  // A device int in the workspace the persistent CTAs take their next tile from (zeroed by the
  // launch); null: no persistent grid.
  int* tile_counter;
  // With dq_bulk on a dense batch (no seqused_k): [batch][h_kv] device ints in the workspace,
  // zeroed by the caller, for the main kernel's units to count their CTAs on, so that each
  // unit's last CTA converts its dQ and no postprocess runs (FLASHSERVE_SM90_BWD_FUSED_DQ:
  // parse_sm90_bwd_fused_dq); used where the call runs the one-tile 3-D grid at d64 or d128
  // (run_bwd_hdim), else the postprocess converts. Null: the postprocess.
  int* dq_counters;
  int batch, h_kv;
  // Rows of q/dout and of k/v per sequence (dense) or in all (varlen: those rows form one
  // sequence of the tensor maps).
  int q_rows, kv_rows;
  int max_q_len, max_kv_len;  // of any sequence: the grid is ceil(max_kv_len / kBlockN) key blocks
  cudaStream_t stream;
};

// Runs the shared preprocess (D), the sm90 main kernel and the shared postprocess (dq; none where
// the main kernel converts dq itself: BwdArgs::dq_counters) on args.stream; the caller has
// zeroed dq, dk, dv and the dq accumulator (params.dq_accum) and any dq_counters.
// Throws flashserve::Error (kUnsupported for a head dim without an instantiation or a tensor TMA
// cannot describe, kCuda when a launch fails).
void run_bwd(const sm80::BwdParams& params, const BwdArgs& args, int head_dim);

template <int kHeadDim>
void run_bwd_hdim(const sm80::BwdParams& params, const BwdArgs& args);
// Head dim 256: bwd_swapped_kernel.h (bwd_hdim256.cu), the bulk-dQ path alone.
template <>
void run_bwd_hdim<256>(const sm80::BwdParams& params, const BwdArgs& args);

}  // namespace flashserve::attention::sm90
