// Shared-memory mbarriers (PTX ISA "mbarrier"): the handshake between the TMA producer and the
// consumer warpgroups. A barrier counts arrivals and, for TMA, transaction bytes; a phase completes
// when both reach zero, and waiters name the phase they wait for by its parity. Thin typed wrappers
// over CCCL's cuda::ptx so the kernel reads as "wait full[s]" / "release empty[s]".
#pragma once

#include <cstdint>
#include <cuda/ptx>

namespace flashserve::attention::sm90 {

struct Mbarrier {
  uint64_t word;

  // One thread initialises; fence_init + a CTA barrier make it visible to the async proxy (TMA)
  // and to the other threads before anyone arrives.
  __device__ __forceinline__ void init(uint32_t arrivals) {
    cuda::ptx::mbarrier_init(&word, arrivals);
  }
  static __device__ __forceinline__ void fence_init() {
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }

  // The producer's arrival that also announces `bytes` of TMA data completing on this barrier.
  __device__ __forceinline__ void arrive_expect_tx(uint32_t bytes) {
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                         cuda::ptx::space_shared, &word, bytes);
  }

  // A consumer's arrival (release: its reads of the guarded buffer happen before the producer's
  // next write to it), made only where `pred` holds. Predicated, not branched: a divergent branch
  // between a wgmma's issue and its wait makes ptxas serialize the wgmmas (C7520).
  __device__ __forceinline__ void arrive_if(bool pred) {
    asm volatile(
        "{\n.reg .pred p;\n.reg .b64 state;\nsetp.ne.b32 p, %1, 0;\n"
        "@p mbarrier.arrive.release.cta.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_addr()),
        "r"(static_cast<int>(pred))
        : "memory");
  }

  __device__ __forceinline__ void arrive() { arrive_if(true); }

  // An arrival on this barrier's twin in CTA `rank` of the cluster (the same shared-memory
  // offset there; the own rank included), predicated as arrive_if. The default semantics (release
  // at CTA scope), as CUTLASS's ClusterBarrier has them: .release.cluster compiles to a
  // MEMBAR.ALL.GPU before every arrival (and .acquire.cluster waits to an L1 invalidation), which
  // made the multicast kernel 0.6-0.75x the one without (docs/kernel-notes.md, session 16). What
  // the arrival announces needs no fence: the consumers arrive once wgmma_wait has completed their
  // reads of the stage, so none is outstanding when the other CTA's TMA overwrites it.
  __device__ __forceinline__ void arrive_cluster_if(bool pred, uint32_t rank) {
    asm volatile(
        "{\n.reg .pred p;\n.reg .b32 remote;\nsetp.ne.b32 p, %1, 0;\n"
        "mapa.shared::cluster.u32 remote, %0, %2;\n"
        "@p mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr()),
        "r"(static_cast<int>(pred)), "r"(rank)
        : "memory");
  }

  // One arrival once this thread's earlier cp.async copies have landed (counted in the barrier's
  // initial count: .noinc), so the copies' data is what a waiter of this phase sees.
  __device__ __forceinline__ void arrive_on_cp_async() {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr())
                 : "memory");
  }

  // Spins until the phase of parity `phase` has completed. A fresh barrier is in phase 0, so
  // waiting for parity 1 returns at once: the producer's first pass over the empty barriers.
  // The loop is inside one asm statement: as a C++ loop it is a data-dependent branch between
  // wgmma issues and waits, which ptxas answers by serializing the wgmmas (C7520).
  // With FLASHSERVE_SM90_WAIT_TRAP defined, a wait that lasts 2 s traps instead (the launch fails
  // with an illegal-instruction error) so that a protocol bug (a wrong phase or a missing
  // arrival) fails in seconds rather than hanging; it is a debugging aid, off by default, since a
  // trap in the consumer loop makes ptxas spill the in-flight accumulators (docs/kernel-notes.md).
  __device__ __forceinline__ void wait(uint32_t phase) {
#ifdef FLASHSERVE_SM90_WAIT_TRAP
    if (cuda::ptx::mbarrier_try_wait_parity(&word, phase)) return;
    const uint64_t start = globaltimer_ns();
    for (uint32_t n = 1;; ++n) {
      if (cuda::ptx::mbarrier_try_wait_parity(&word, phase)) return;
      // No printf here: a call inside the kernel serializes its wgmma (ptxas C7510).
      if ((n & 1023) == 0 && globaltimer_ns() - start > 2000000000ull) __trap();
    }
#else
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(smem_addr()),
        "r"(phase)
        : "memory");
#endif
  }

 private:
  __device__ __forceinline__ uint32_t smem_addr() const {
    return static_cast<uint32_t>(__cvta_generic_to_shared(&word));
  }
  static __device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
};

}  // namespace flashserve::attention::sm90
