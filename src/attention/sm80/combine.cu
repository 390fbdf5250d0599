// Host side of the split-KV combine (combine.h): one warp per (row, head) for a few splits, up to
// eight for many.
#include <cuda_runtime.h>

#include <string>

#include "attention/cuda_check.h"
#include "combine.h"
#include "common/pdl.cuh"
#include "flashserve/error.h"
#include "launch.h"
#include "ptx.h"

namespace flashserve::attention::sm80 {
namespace {

// head_dim_v: 0 for every column of kHeadDim, else the padded kernel's value head dim.
template <class Elem, int kHeadDim, int kWarpsPerItem>
void launch(const FwdParams& params, int head_dim_v, cudaStream_t stream, bool pdl) {
  constexpr int kItemsPerBlock = kCombineThreads / 32 / kWarpsPerItem;
  const int64_t items = params.q_rows * params.h_q;
  const int64_t blocks = (items + kItemsPerBlock - 1) / kItemsPerBlock;
  if (blocks == 0) return;
  const dim3 grid(static_cast<unsigned>(blocks)), block(kCombineThreads);
  if (head_dim_v == 0) {
    check_cuda(pdl::launch(pdl, combine_kernel<Elem, kHeadDim, kWarpsPerItem>, grid, block, 0,
                           stream, params),
               "split-KV combine kernel launch");
    return;
  }
  FwdPaddedParams padded{params};
  padded.head_dim_v = head_dim_v;
  check_cuda(pdl::launch(pdl, combine_kernel_padded<Elem, kHeadDim, kWarpsPerItem>, grid, block, 0,
                         stream, padded),
             "split-KV combine kernel launch");
}

template <class Elem, int kHeadDim>
void launch_for_splits(const FwdParams& params, int head_dim_v, int row_splits, cudaStream_t stream,
                       bool pdl) {
  // About eight splits per warp, at most eight warps.
  if (row_splits > 32) return launch<Elem, kHeadDim, 8>(params, head_dim_v, stream, pdl);
  if (row_splits > 8) return launch<Elem, kHeadDim, 4>(params, head_dim_v, stream, pdl);
  return launch<Elem, kHeadDim, 1>(params, head_dim_v, stream, pdl);
}

template <class Elem>
void launch_for_dim(const FwdParams& params, int head_dim, int head_dim_v, int row_splits,
                    cudaStream_t stream, bool pdl) {
  switch (head_dim) {
    case 64:
      return launch_for_splits<Elem, 64>(params, head_dim_v, row_splits, stream, pdl);
    case 128:
      return launch_for_splits<Elem, 128>(params, head_dim_v, row_splits, stream, pdl);
    default:
      return launch_for_splits<Elem, 256>(params, head_dim_v, row_splits, stream, pdl);
  }
}

}  // namespace

void run_combine(const FwdParams& params, DType dtype, int head_dim, cudaStream_t stream,
                 int head_dim_v, int row_splits, bool pdl) {
  if (row_splits == 0) row_splits = params.num_splits;
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    throw Error(ErrorKind::kInternal, "q",
                "split-KV combine for head dim " + std::to_string(head_dim));
  // Every column of the kernel's head dim is the call's: the combine without a column bound.
  if (head_dim_v >= head_dim) head_dim_v = 0;
  if (dtype == DType::kBFloat16)
    launch_for_dim<__nv_bfloat16>(params, head_dim, head_dim_v, row_splits, stream, pdl);
  else
    launch_for_dim<__half>(params, head_dim, head_dim_v, row_splits, stream, pdl);
}

}  // namespace flashserve::attention::sm80
