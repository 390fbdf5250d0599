// Warpgroup MMA (PTX wgmma.mma_async, sm_90a): the four warps of a warpgroup compute one
// m64nNk16 product together, asynchronously; B (and A, in the SS form) come from shared memory
// through 64-bit matrix descriptors, the fp32 accumulator lives in registers.
//
// Shared-memory layout: every operand tile here is what TMA writes with the 128-byte swizzle:
// rows of 64 16-bit elements (128 bytes), 8-row groups of 1024 bytes ("swizzle atoms") whose
// 16-byte chunks are XOR-permuted by the row index within the group. The descriptor names the
// swizzle and two strides (PTX ISA, "Matrix Descriptor Format" and the canonical layouts):
// - K-major (the contiguous dimension is K: Q and K for S = Q K^T): SBO = 1024 bytes between
//   8-row groups along M/N; LBO is unused (K per instruction, 16 elements = 32 bytes, stays inside
//   one 128-byte row); the k-th 16-column step advances the start address by 32 bytes.
// - MN-major (the contiguous dimension is N: V, [keys, d] row-major, as the B of P V, with the
//   instruction's transpose bit): LBO = bytes between 64-column groups along N (one TMA box of
//   64 columns to the next), SBO = 1024 bytes between 8-row groups along K; the k-th 16-row step
//   advances the start address by 16 * 128 bytes.
// The tile base is 1024-byte aligned so that the address-based swizzle of TMA and of wgmma agree
// (base offset field 0).
//
// Accumulator fragment (m64nN, fp32, N/2 registers per thread): warp w of the warpgroup holds rows
// 16w .. 16w + 15; thread lane holds, for i in [0, N/8), d[4i + 0..1] = row lane/4, columns
// 8i + 2 (lane%4) + {0, 1}, and d[4i + 2..3] = row lane/4 + 8, the same columns. The A fragment
// of the RS form (k16, four 32-bit registers of two 16-bit values) for k-step j is exactly the
// accumulator's columns 16j .. 16j + 15 packed in order: {d[8j..8j+1]}, {d[8j+2..3]},
// {d[8j+4..5]}, {d[8j+6..7]} — so P goes from the S accumulator to the A operand without shuffles.
#pragma once

#include <cstdint>

namespace flashserve::attention::sm90 {

// 128-byte swizzle descriptor: start address, LBO and SBO in bytes (each encoded >> 4, 14 bits).
__device__ __forceinline__ uint64_t smem_desc_sw128(const void* smem, uint32_t lbo_bytes,
                                                    uint32_t sbo_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  desc |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  desc |= uint64_t{1} << 62;  // layout type 1: 128-byte swizzle
  return desc;
}

// 64-byte swizzle (layout type 2): rows of 64 bytes in 8-row atoms of 512 bytes, as TMA's 64-byte
// swizzle writes them (the fp8 forward's Q and K at d64, 64 one-byte columns a row, and its V^T
// boxes of 64 keys); K-major,
// SBO = 512 between 8-row groups, LBO unused. The tile base is 512-byte aligned.
__device__ __forceinline__ uint64_t smem_desc_sw64(const void* smem, uint32_t lbo_bytes,
                                                   uint32_t sbo_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  desc |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  desc |= uint64_t{2} << 62;  // layout type 2: 64-byte swizzle
  return desc;
}

// The descriptor of the same layout `bytes` further on (a k-step inside the tile). Adds to the
// encoded start address, which is what a descriptor built from smem + bytes would hold.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

// Makes register and shared-memory writes of this thread visible to the warpgroup's following
// wgmma (required before the first wgmma, and after the accumulators were touched).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of an accumulator across the asynchronous MMA
// (the registers belong to the tensor core between the issue and the wait).
template <int kN>
__device__ __forceinline__ void fence_regs(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void fence_regs(uint32_t (&a)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i)
#pragma unroll
    for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[i][r])::"memory");
}

// D (+)= A B, A and B from shared memory, both K-major. scale_d 0: D = A B.
template <int kN, bool kBf16>
__device__ void mma_ss(float (&d)[kN / 2], uint64_t a, uint64_t b, int scale_d);
// D (+)= A B, A and B from shared memory, both MN-major (read transposed; the backward's
// dQ = dS K, sm90/bwd_kernel.h).
template <int kN, bool kBf16>
__device__ void mma_ss_tt(float (&d)[kN / 2], uint64_t a, uint64_t b, int scale_d);
// D (+)= A B, A and B from shared memory, A MN-major (read transposed), B K-major (the d256
// backward's dV^T = dO^T P and dK^T = Q^T dS, sm90/bwd_swapped_kernel.h).
template <int kN, bool kBf16>
__device__ void mma_ss_tn(float (&d)[kN / 2], uint64_t a, uint64_t b, int scale_d);
// D (+)= A B, A from registers (the fragment above), B from shared memory MN-major (transposed).
template <int kN, bool kBf16>
__device__ void mma_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b, int scale_d);

// float8_e4m3fn, m64nNk32 (32 one-byte elements = 32 bytes per k-step, as the 16-bit k16 forms):
// both operands K-major (8-bit wgmma has no transpose). SS: A and B from shared memory; RS: A from
// registers, in the 8-bit A fragment (PTX ISA: thread q of a quad holds, in register v1 + 2 v2,
// byte v0, row lane/4 + 8 v1, column 4q + v0 + 16 v2), which is not the accumulator's column
// order (fwd_mainloop.h's to_e4m3_operand and fp8_vt.h's key permutation).
template <int kN>
__device__ void mma_ss_e4m3(float (&d)[kN / 2], uint64_t a, uint64_t b, int scale_d);
template <int kN>
__device__ void mma_rs_e4m3(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t b, int scale_d);

}  // namespace flashserve::attention::sm90

// The instructions, one specialisation per shape the tiles use.
#include "wgmma_ops.h"
