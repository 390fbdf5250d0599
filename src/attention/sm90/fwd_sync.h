// How the roles of the sm90 forward kernel (fwd_kernel.h) wait for one another beyond the
// mbarriers of its stages (mbarrier.h): the named barriers (bar.sync ids: 0 is __syncthreads,
// 1..3 the warp scheduler's, warp_scheduler.h; 8..10 the consumers' epilogues; 12 the producer
// warpgroup's), a consumer warp's arrival that releases a buffer to the producer, and with
// multicast (TileConfig::kCluster 2) the CTA's rank in its cluster and the cluster's barrier.
// The tile scheduler, the mainloop, the epilogue and the kernel all use them.
#pragma once

#include <cstdint>
#include <cuda/ptx>

#include "mbarrier.h"

namespace flashserve::attention::sm90 {

// The CTA's rank in its cluster: 0 without multicast (TileConfig::kCluster 1).
template <class Cfg>
__device__ __forceinline__ uint32_t cta_rank() {
  if constexpr (Cfg::kCluster == 1)
    return 0;
  else
    return cuda::ptx::get_sreg_cluster_ctarank();
}

// Every thread of every CTA of the cluster: what each did before happens before what any does
// after (the barriers' initialisation before the other CTA's first multicast or arrival; the
// other CTA's last arrivals on this one's barriers before this one exits).
__device__ __forceinline__ void cluster_sync() {
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait();
}

// The producer warpgroup's 128 threads, with kv_cp_async (named barrier 12: 1..3 are the warp
// scheduler's, 8..10 the consumers' epilogues).
__device__ __forceinline__ void producers_sync() {
  asm volatile("bar.sync 12, 128;\n" ::: "memory");
}

// The 128 threads of consumer warpgroup cw (named barriers 1 .. kConsumers are the warp
// scheduler's; these are 8 + cw).
__device__ __forceinline__ void epilogue_sync(int cw) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(8 + cw) : "memory");
}

// One arrival per consumer warp: its warpgroup's GEMM that read the buffer has completed.
// `when` (warp-uniform) is folded into the arrival's predicate rather than branched on, so that it
// can sit between a wgmma's issue and its wait.
__device__ __forceinline__ void release(Mbarrier& empty, bool when = true) {
  __syncwarp();
  empty.arrive_if(when && threadIdx.x % 32 == 0);
}

// The release of a K or V stage: with multicast, on both CTAs' twins of the barrier (either CTA's
// producer writes both copies of the stage).
template <class Cfg>
__device__ __forceinline__ void release_kv(Mbarrier& empty) {
  if constexpr (Cfg::kCluster == 1) {
    release(empty);
  } else {
    __syncwarp();
#pragma unroll
    for (uint32_t r = 0; r < Cfg::kCluster; ++r) empty.arrive_cluster_if(threadIdx.x % 32 == 0, r);
  }
}

}  // namespace flashserve::attention::sm90
