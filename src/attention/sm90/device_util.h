// Register-level helpers the sm90 kernels share (the forward, fwd_*.h, and the backward,
// bwd_kernel.h): the setmaxnreg budgets, exp2 on the MUFU unit, packing fp32 pairs to 16 bits,
// accumulator fragments as RS wgmma operands, 16-byte row stores from a fragment, and stmatrix.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashserve::attention::sm90 {

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// 2^x on the MUFU unit (flush-to-zero; 2^-inf = 0), as the scores' exponent needs.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Four 8 x 8 matrices of 16-bit elements from registers into shared memory (stmatrix x4): r[i] is
// matrix i's fragment (row lane / 4, columns 2 (lane % 4) and + 1, the accumulator's layout), and
// lane L gives the shared-memory address of row L % 8 of matrix L / 8 (16 contiguous bytes).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kBf16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// P as the A operand of the RS wgmma: k-step kk is accumulator columns 16kk .. 16kk + 15 (wgmma.h).
template <bool kBf16, int kN>
__device__ __forceinline__ void to_operand(const float (&sc)[kN], uint32_t (&pa)[kN / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kN / 8; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      pa[kk][r] = pack2<kBf16>(sc[8 * kk + 2 * r], sc[8 * kk + 2 * r + 1]);
}

// One accumulator row of O as 16-byte pieces. Thread q of the row's quad holds columns
// 8i + 2q, 8i + 2q + 1 of every 8-column group i (packed[i]); a 4 x 4 transpose within the quad
// (two xor-shuffle rounds) gives thread q all eight columns of groups 4m + q, so each store
// instruction writes 64 contiguous bytes per row instead of 16: a quarter of the L1 wavefronts of
// 4-byte stores (the epilogue is a fixed cost of every tile, which short sequences feel most:
// +5% at d128 512 keys, +10% causal, +9-15% at d256; docs/kernel-notes.md, session 10).
// Every lane takes part in the shuffles; `put(group, value)` stores the 16 bytes of 8-column
// group `group` (to global memory, or to the TMA staging buffer).
template <int kD, class Put>
__device__ __forceinline__ void store_row_vec16(uint32_t (&packed)[kD / 8], int q, Put&& put) {
  static_assert(kD % 32 == 0, "groups of four 8-column groups");
#pragma unroll
  for (int m = 0; m < kD / 32; ++m) {
    uint32_t* a = packed + 4 * m;
    // Round 1 (xor 2): the 2 x 2 blocks of the 4 x 4 (thread, group) matrix trade places.
#pragma unroll
    for (int j0 = 0; j0 < 2; ++j0) {
      const bool hi = q & 2;
      const uint32_t got = __shfl_xor_sync(0xffffffffu, hi ? a[j0] : a[2 + j0], 2);
      if (hi)
        a[j0] = got;
      else
        a[2 + j0] = got;
    }
    // Round 2 (xor 1): each 2 x 2 block is transposed.
#pragma unroll
    for (int j1 = 0; j1 < 2; ++j1) {
      const bool odd = q & 1;
      const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? a[2 * j1] : a[2 * j1 + 1], 1);
      if (odd)
        a[2 * j1] = got;
      else
        a[2 * j1 + 1] = got;
    }
    put(4 * m + q, make_uint4(a[0], a[1], a[2], a[3]));
  }
}

}  // namespace flashserve::attention::sm90
