// A timeline of the sm90 forward kernel, for tuning builds only (TileConfig's kTrace; the
// library's tiles never record): one thread per role (the producer's, and thread 0 of each
// consumer warpgroup) writes (clock64 << 8 | event) at the points below into FwdParams::trace,
// kTraceCap records per role per CTA. bench/tuning/sm90_trace.cu turns the records into the time
// each phase of a step and of a tile takes (docs/kernel-notes.md, session 11).
#pragma once

#include <cstdint>

namespace flashserve::attention::sm90 {

inline constexpr int kTraceRoles = 4;  // the producer and up to three consumer warpgroups
inline constexpr int kTraceCap = 16384;

enum TraceEvent : uint32_t {
  // A consumer warpgroup, per tile: the producer's announcement read, Q landed; per key block:
  // its turn taken, K landed, the GEMMs issued (and the turn passed), S ready, the softmax done,
  // P V of the block before done, the step's end; the epilogue's start, its staging free (the
  // previous tile's TMA store has read it), O and LSE written, the staging fenced and synced, and
  // its end.
  kTileRead = 1,
  kQReady,
  kTurn,
  kKReady,
  kIssued,
  kSReady,
  kSoftmaxDone,
  kPvDone,
  kStepEnd,
  kEpilogueStart,
  kEpilogueEnd,
  kEpilogueFree,
  kEpilogueWritten,
  kEpilogueSynced,
  // The producer: a tile announced; after its wait for the stage, Q, K and V issued.
  kProducerTile = 16,
  kProducerQ,
  kProducerK,
  kProducerV,
};

// The recorder of one role: `on` selects the thread that writes (a predicate, not a branch:
// a branch between a wgmma's issue and its wait would serialize the wgmmas, C7520).
template <bool kEnabled>
struct Trace {
  __device__ __forceinline__ Trace(uint64_t* buffer, int role, bool on) {
    if constexpr (kEnabled) {
      base_ = buffer + (static_cast<int64_t>(blockIdx.x) * kTraceRoles + role) * kTraceCap;
      on_ = on && buffer != nullptr;
    }
  }
  __device__ __forceinline__ void operator()(TraceEvent e) {
    if constexpr (kEnabled) {
      uint64_t clock;
      asm volatile("mov.u64 %0, %%clock64;" : "=l"(clock));
      const uint32_t write = on_ && n_ < kTraceCap;
      asm volatile(
          "{\n .reg .pred p;\n setp.ne.u32 p, %0, 0;\n @p st.global.u64 [%1], %2;\n}\n" ::"r"(
              write),
          "l"(base_ + (n_ < kTraceCap ? n_ : 0)), "l"((clock << 8) | e)
          : "memory");
      ++n_;
    }
  }
  uint64_t* base_ = nullptr;
  bool on_ = false;
  int n_ = 0;
};

}  // namespace flashserve::attention::sm90
