// A span of weights a kernel asks the memory system to bring into L2 (model/decode_kernels.h says
// which, from which kernel): cp.async.bulk.prefetch.L2, one instruction per 16 KB chunk. Nothing
// waits for it and nothing reads the result: a hint, which the product reading those weights later
// finds in L2. The span is shrunk to 16-byte boundaries inside it (the instruction's alignment), so
// no byte outside it is named. Devices before sm_90 compile it to nothing.
//
// The chunks are issued by blocks the kernel adds to its grid for them, a few chunks each: one
// SM takes bulk prefetches slowly (session 32, H100: one block of the RoPE kernel asking for the
// 32 MB of o weights held that kernel 137 us instead of 7, ~0.24 TB/s; the grid ends only when
// its blocks have issued them all), so they are spread over as many SMs as the span needs at a
// microsecond or so each, and the blocks that do the kernel's work issue none.
#pragma once

#include <algorithm>
#include <cstdint>

namespace flashserve::model::cuda {

struct L2Span {
  const void* data = nullptr;
  int64_t bytes = 0;  // 0: nothing
};

inline constexpr int64_t kL2PrefetchChunk = 16 * 1024;
inline constexpr int64_t kL2PrefetchChunksPerBlock = 16;  // 256 KB: ~1 us at one SM's rate
inline constexpr int64_t kL2PrefetchMaxBlocks = 256;

// The blocks a kernel adds to its grid to prefetch `span` (0 for none).
inline unsigned l2_prefetch_blocks(const L2Span& span) {
  if (span.bytes <= 0) return 0;
  const int64_t per_block = kL2PrefetchChunk * kL2PrefetchChunksPerBlock;
  return static_cast<unsigned>(
      std::min((span.bytes + per_block - 1) / per_block, kL2PrefetchMaxBlocks));
}

#ifdef __CUDACC__  // the header is also read by host code (the spans in the kernels' arguments)
// In a kernel launched with `work_blocks` blocks of work and l2_prefetch_blocks(span) more after
// them: false in the work blocks; in the added ones, their share of the span's chunks issued,
// true (the kernel returns: they do nothing else).
__device__ __forceinline__ bool issue_l2_prefetch(const L2Span& span, int64_t work_blocks) {
  if (blockIdx.x < work_blocks) return false;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (span.bytes <= 0) return true;
  const uint64_t base = __cvta_generic_to_global(span.data);  // the instruction's .global address
  const uint64_t begin = (base + 15) & ~uint64_t{15};
  const uint64_t end = (base + static_cast<uint64_t>(span.bytes)) & ~uint64_t{15};
  if (end <= begin) return true;
  const int64_t chunks =
      static_cast<int64_t>((end - begin + kL2PrefetchChunk - 1) / kL2PrefetchChunk);
  const int64_t threads = (int64_t{gridDim.x} - work_blocks) * blockDim.x;
  for (int64_t c = (blockIdx.x - work_blocks) * blockDim.x + threadIdx.x; c < chunks;
       c += threads) {
    const uint64_t at = begin + static_cast<uint64_t>(c) * kL2PrefetchChunk;
    const uint32_t size =
        static_cast<uint32_t>(end - at < kL2PrefetchChunk ? end - at : kL2PrefetchChunk);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at), "r"(size) : "memory");
  }
#endif
  return true;
}
#endif

}  // namespace flashserve::model::cuda
