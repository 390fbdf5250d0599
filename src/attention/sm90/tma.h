// TMA (the Tensor Memory Accelerator, PTX cp.async.bulk.tensor): tensor maps built on the host and
// tile copies from global to shared memory that complete on an mbarrier.
//
// A tensor map describes one tensor (up to 5 dimensions, innermost first, strides in bytes) and
// the box one copy moves. Out-of-bounds elements of a box are filled with zeros, and the barrier
// still receives the bytes of the whole box: ragged sequence ends need no special copy.
//
// cuTensorMapEncodeTiled is a driver function; it is reached through the runtime's driver entry
// point so that the library keeps linking the runtime only.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: no libcuda symbol is linked)
#include <cuda_runtime.h>

#include <cstdint>
#include <cuda/ptx>

#include "mbarrier.h"

namespace flashserve::attention::sm90 {

// ---------------------------------------------------------------------------------------------
// Host

// The parameters of one tiled map: `dims[i]` elements along dimension i (0 innermost, contiguous),
// `strides[i]` bytes between consecutive elements of dimension i + 1, `box[i]` elements per copy.
struct TensorMapSpec {
  const void* base;
  CUtensorMapDataType dtype;
  int rank;
  uint64_t dims[5];
  uint64_t strides[4];
  uint32_t box[5];
  CUtensorMapSwizzle swizzle;
};

// Returns the driver's status (CUDA_SUCCESS = 0); *out is valid on success. `entry_error` tells a
// missing driver entry point apart from a refused map.
CUresult encode_tensor_map(const TensorMapSpec& spec, CUtensorMap* out, cudaError_t* entry_error);

// ---------------------------------------------------------------------------------------------
// Device

// One 4-D box (coordinates innermost first, in elements) into `smem`, completing on `bar`. Only
// one thread issues it; `smem` is 128-byte aligned (1024 for the 128-byte swizzle).
__device__ __forceinline__ void tma_load_4d(void* smem, const CUtensorMap* map, Mbarrier& bar,
                                            int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem, map,
                                  coords, &bar.word);
}

// tma_load_4d, multicast: the box lands at `smem`'s offset in every CTA of the cluster whose bit
// is set in `cta_mask`, each completing its bytes on the barrier at `bar`'s offset there.
__device__ __forceinline__ void tma_load_4d_multicast(void* smem, const CUtensorMap* map,
                                                      Mbarrier& bar, uint16_t cta_mask, int32_t c0,
                                                      int32_t c1, int32_t c2, int32_t c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem, map,
                                  coords, &bar.word, cta_mask);
}

// One 4-D box from `smem` (written by this CTA's threads: each fences its writes to the async
// proxy and they synchronize before one thread issues this) into global memory; the elements of
// the box outside the tensor are not written. The copy joins this thread's bulk group: commit it
// (tma_store_commit) and wait for its reads (tma_store_wait_read) before `smem` is written again.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* smem, int32_t c0,
                                             int32_t c1, int32_t c2, int32_t c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, map, coords,
                                  smem);
}
// One 4-D box of `smem` added element-wise into global memory (cp.reduce.async.bulk.tensor .add;
// the element type is the map's, fp32 for the backward's dQ accumulator), each element's add
// atomic with respect to other CTAs' adds; the elements of the box outside the tensor are not
// touched. Issued, committed and waited for as tma_store_4d.
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, const void* smem,
                                                  int32_t c0, int32_t c1, int32_t c2, int32_t c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_reduce_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared,
                                         cuda::ptx::op_add, map, coords, smem);
}
__device__ __forceinline__ void tma_store_commit() {
  cuda::ptx::cp_async_bulk_commit_group();
}
// This thread's committed stores have read their shared memory (it may be written again).
__device__ __forceinline__ void tma_store_wait_read() {
  cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
}
// This thread's committed stores are complete (before the CTA exits).
__device__ __forceinline__ void tma_store_wait_all() {
  cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
}
// Makes this thread's generic-proxy shared-memory writes visible to the async proxy (TMA).
__device__ __forceinline__ void fence_shared_to_async() {
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
}

}  // namespace flashserve::attention::sm90
