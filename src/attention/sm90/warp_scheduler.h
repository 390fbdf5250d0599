// Ping-pong between the two consumer warpgroups (FlashAttention-3's "warp scheduler barrier"):
// the warpgroups take turns issuing their GEMMs, so that while one runs its softmax on the CUDA
// cores the tensor cores work on the other's QK^T and PV. Two named barriers (PTX bar.sync /
// bar.arrive, ids 1 and 2; 0 is __syncthreads), each completing at 256 threads: warpgroup c
// waits on barrier 1 + c (its own 128 threads plus the other's 128 arrivals) before it issues,
// and arrives on the other's barrier once its GEMMs are issued.
#pragma once

namespace flashserve::attention::sm90 {

class WarpScheduler {
 public:
  // `consumer` is 0 or 1. Warpgroup 0 issues first: warpgroup 1 lets it go before either waits
  // (only when the tile has work, so that every arrival is matched by a wait).
  __device__ __forceinline__ WarpScheduler(int consumer, bool has_work) : self_(consumer) {
    if (has_work && consumer == 1) arrive(1);
  }

  // Before this warpgroup issues its GEMMs of one step.
  __device__ __forceinline__ void wait_turn() const { sync(1 + self_); }

  // After they are issued: the other warpgroup's turn. Warpgroup 1 skips this after its last
  // step (warpgroup 0 has no step left to wait for it), so both barriers end the kernel empty.
  // Predicated, not branched (a divergent branch between wgmma issue and wait serializes them).
  __device__ __forceinline__ void pass_turn(bool last_step) const {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p bar.arrive %0, %1;\n}\n" ::"r"(
                     1 + (self_ ^ 1)),
                 "n"(kThreads), "r"(static_cast<int>(!(self_ == 1 && last_step)))
                 : "memory");
  }

 private:
  static constexpr int kThreads = 256;  // both consumer warpgroups
  static __device__ __forceinline__ void sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
  }
  static __device__ __forceinline__ void arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
  }
  int self_;
};

}  // namespace flashserve::attention::sm90
