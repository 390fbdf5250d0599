// Ping-pong between the consumer warpgroups (FlashAttention-3's "warp scheduler barrier"): the
// warpgroups take turns issuing their GEMMs, round robin, so that while one runs its softmax on
// the CUDA cores the tensor cores work on the others' QK^T and PV. One named barrier per consumer
// (PTX bar.sync / bar.arrive, ids 1..kConsumers; 0 is __syncthreads), each completing at 256
// threads: warpgroup c waits on barrier 1 + c (its own 128 threads plus the previous one's 128
// arrivals) before it issues, and arrives on the next one's barrier once its GEMMs are issued.
#pragma once

namespace flashserve::attention::sm90 {

template <int kConsumers>
class WarpScheduler {
 public:
  // `consumer` is 0 .. kConsumers - 1; one scheduler per CTA, its turns running on over all the
  // CTA's tiles. Warpgroup 0 issues first: the last one lets it go before any waits.
  __device__ __forceinline__ explicit WarpScheduler(int consumer) : self_(consumer) {
    if (consumer == kLast) arrive(1);
  }

  // Before this warpgroup issues its GEMMs of one step.
  __device__ __forceinline__ void wait_turn() const { sync(1 + self_); }

  // After they are issued: the next warpgroup's turn.
  __device__ __forceinline__ void pass_turn() const { arrive(1 + (self_ + 1) % kConsumers); }

  // After the CTA's last tile: warpgroup 0 takes the turn the last one passed it (or the first,
  // if the CTA had no step), so that every arrival is matched and the barriers end empty.
  __device__ __forceinline__ void finish() const {
    if (self_ == 0) sync(1);
  }

 private:
  static constexpr int kLast = kConsumers - 1;
  static constexpr int kThreads = 256;  // a consumer warpgroup and the one before it
  static __device__ __forceinline__ void sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
  }
  static __device__ __forceinline__ void arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
  }
  int self_;
};

}  // namespace flashserve::attention::sm90
