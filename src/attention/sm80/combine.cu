// Host side of the split-KV combine (combine.h): one warp per (row, head) for a few splits, up to
// eight for many.
#include <cuda_runtime.h>

#include "attention/cuda_check.h"
#include "combine.h"
#include "flashserve/error.h"
#include "launch.h"
#include "ptx.h"

namespace flashserve::attention::sm80 {
namespace {

template <class Elem, int kHeadDim, int kWarpsPerItem>
void launch(const FwdParams& params, cudaStream_t stream) {
  constexpr int kItemsPerBlock = kCombineThreads / 32 / kWarpsPerItem;
  const int64_t items = params.q_rows * params.h_q;
  const int64_t blocks = (items + kItemsPerBlock - 1) / kItemsPerBlock;
  if (blocks == 0) return;
  combine_kernel<Elem, kHeadDim, kWarpsPerItem><<<blocks, kCombineThreads, 0, stream>>>(params);
}

template <class Elem, int kHeadDim>
void launch_for_splits(const FwdParams& params, cudaStream_t stream) {
  // About eight splits per warp, at most eight warps.
  if (params.num_splits > 32) return launch<Elem, kHeadDim, 8>(params, stream);
  if (params.num_splits > 8) return launch<Elem, kHeadDim, 4>(params, stream);
  return launch<Elem, kHeadDim, 1>(params, stream);
}

template <class Elem>
void launch_for_dim(const FwdParams& params, int head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return launch_for_splits<Elem, 64>(params, stream);
    case 128:
      return launch_for_splits<Elem, 128>(params, stream);
    default:
      return launch_for_splits<Elem, 256>(params, stream);
  }
}

}  // namespace

void run_combine(const FwdParams& params, DType dtype, int head_dim, cudaStream_t stream) {
  if (dtype == DType::kBFloat16)
    launch_for_dim<__nv_bfloat16>(params, head_dim, stream);
  else
    launch_for_dim<__half>(params, head_dim, stream);
  check_cuda(cudaGetLastError(), "split-KV combine kernel launch");
}

}  // namespace flashserve::attention::sm80
