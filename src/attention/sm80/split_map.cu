// The item map of a length-aware decode launch (kernel/split_items.h, fwd_params.h split_map),
// made once a launch by one CTA before the split kernel: the launch's chunk from its sequences'
// key blocks, then a scan of their item counts in sequence order. The split kernel's CTAs read
// their (sequence, share) from it with one load, and the combine its rows' (first item, count),
// instead of each walking the launch's lengths (a chain of round trips to L2 in every CTA while
// the others saturate memory: session 33).
#include <cuda_runtime.h>

#include "attention/cuda_check.h"
#include "common/pdl.cuh"
#include "launch.h"

namespace flashserve::attention::sm80 {
namespace {

constexpr int kMapThreads = 1024;

template <class T>
__device__ __forceinline__ T block_sum(T x, T* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // the scratch's last readers are done
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  T total = 0;
#pragma unroll
  for (int w = 0; w < kMapThreads / 32; ++w) total += scratch[w];
  return total;
}

// Inclusive scan of x over the block's threads in order; `total` gets the block's sum.
__device__ __forceinline__ int block_scan(int x, int* scratch, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) scratch[warp] = x;
  __syncthreads();
  int before = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < kMapThreads / 32; ++w) {
    before += w < warp ? scratch[w] : 0;
    total += scratch[w];
  }
  return x + before;
}

__global__ void __launch_bounds__(kMapThreads)
    split_map_kernel(const __grid_constant__ FwdParams p) {
  __shared__ int64_t sums[kMapThreads / 32];
  __shared__ int scans[kMapThreads / 32];
  // Launched programmatically, the lengths are read only after the kernel before is done (and
  // the workspace written only after the previous layer's kernels have read it).
  pdl::wait_for_producer();
  pdl::release_dependents();
  const int begin = p.seq_begin, end = p.seq_end;
  int64_t blocks = 0;
  int first_blocks = 0;  // this thread's sequence of the first pass, kept for the scan below
  for (int b = begin + threadIdx.x; b < end; b += kMapThreads) {
    const int k = split_key_blocks(p, b);
    if (b < begin + kMapThreads) first_blocks = k;
    blocks += k;
  }
  const int64_t busy = int64_t{end - begin} * (p.num_splits - 1);
  const int chunk = kernel::chunk_for(block_sum(blocks, sums), busy, p.split_min_blocks);
  SplitMap map = split_map_of(p);
  int items = 0;  // of the sequences before this pass
  for (int base = begin; base < end; base += kMapThreads) {
    const int b = base + threadIdx.x;
    const int key_blocks = base == begin ? first_blocks : b < end ? split_key_blocks(p, b) : 0;
    const int count = b < end ? kernel::items_for(key_blocks, chunk) : 0;
    int pass_items;
    const int first = items + block_scan(count, scans, pass_items) - count;
    if (b < end) {
      map.rows[b - begin] = make_int2(first, count);
      for (int s = 0; s < count; ++s) map.items[first + s] = make_int4(b, s, count, chunk);
    }
    items += pass_items;
  }
  // The grid's items past the last share: no sequence.
  const int grid_items = (end - begin) * p.num_splits;
  for (int w = items + threadIdx.x; w < grid_items; w += kMapThreads)
    map.items[w] = make_int4(-1, 0, 0, chunk);
}

}  // namespace

void run_split_map(const FwdParams& params, cudaStream_t stream, bool pdl) {
  check_cuda(pdl::launch(pdl, split_map_kernel, dim3(1), dim3(kMapThreads), 0, stream, params),
             "split map kernel launch");
}

}  // namespace flashserve::attention::sm80
