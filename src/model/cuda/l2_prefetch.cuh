// A span of weights a kernel asks the memory system to bring into L2 (model/decode_kernels.h says
// which, from which kernel): cp.async.bulk.prefetch.L2, one instruction per 16 KB chunk, the
// chunks dealt round-robin to every thread of the grid. Nothing waits for it and nothing reads
// the result: a hint, which the product reading those weights later finds in L2. The span is
// shrunk to 16-byte boundaries inside it (the instruction's alignment), so no byte outside it is
// named. Devices before sm_90 compile it to nothing.
#pragma once

#include <cstdint>

namespace flashserve::model::cuda {

struct L2Span {
  const void* data = nullptr;
  int64_t bytes = 0;  // 0: nothing
};

__device__ __forceinline__ void prefetch_l2(const L2Span& span) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int64_t kChunk = 16 * 1024;
  if (span.bytes <= 0) return;
  const uint64_t base = __cvta_generic_to_global(span.data);  // the instruction's .global address
  const uint64_t begin = (base + 15) & ~uint64_t{15};
  const uint64_t end = (base + static_cast<uint64_t>(span.bytes)) & ~uint64_t{15};
  if (end <= begin) return;
  const int64_t chunks = static_cast<int64_t>((end - begin + kChunk - 1) / kChunk);
  const int64_t threads = int64_t{gridDim.x} * blockDim.x;
  for (int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; c < chunks; c += threads) {
    const uint64_t at = begin + static_cast<uint64_t>(c) * kChunk;
    const uint32_t size = static_cast<uint32_t>(end - at < kChunk ? end - at : kChunk);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at), "r"(size) : "memory");
  }
#endif
}

}  // namespace flashserve::model::cuda
