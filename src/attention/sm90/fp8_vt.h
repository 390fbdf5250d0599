// V^T for the sm90 fp8 forward (docs/fp8.md, "The sm90 fp8 forward"): 8-bit wgmma reads both of
// its shared-memory operands K-major, and for O += P V the reduction runs over the keys, so the
// B operand must hold each column of V (one head-dim index) with its keys contiguous. A pre-pass
// writes V^T [batch, h_kv, d, keys] into the plan's workspace (keys: the longest sequence's,
// rounded up to 128, tile_config.h fp8_vt_keys), one slab per sequence whatever the layout of V
// (dense, varlen, or with seqused_k): the kernel's TMA box of V^T for key block j of sequence b
// is keys 128 j .. 128 j + 127 of slab b. Keys past a sequence's kv_len in its last block are
// zeros, so the masked keys' P = 0 never meets a NaN or an infinity there (what zero_v_tail does
// for the 16-bit kernels). Blocks of 128 keys past the kernel's last key block (VtArgs::block_keys)
// are never read and not written.
//
// Within every 32 keys the pre-pass stores the keys in the order the P fragment of the fp8
// wgmma takes them (fp8_vt_key): the A operand of m64nNk32 wants thread q of a quad to hold
// keys 4q .. 4q + 3 and 16 + 4q .. 16 + 4q + 3, while the S accumulator gives it keys 2q, 2q + 1,
// 8 + 2q, 9 + 2q (and + 16). Packing the accumulator as it lies (fwd_mainloop.h's to_e4m3_operand)
// and permuting V's keys the same way gives the same sum over the keys, with no shuffle in the
// kernel's loop (FlashAttention-3 shuffles P when V comes column-major, permute_Aregs_fp8, and
// permutes in its in-kernel transpose otherwise).
//
// Cost: V is read once and V^T written once (2 x batch x kv x h_kv x d bytes beyond what the
// kernel reads); for the FA3 grid's 16k tokens x 16 heads x d128 that is 64 MB, 23-24 us on an
// H100 (fp8_transpose_v below): ~4% of the call at d128 and 4k keys, ~16% at 512.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/kernel/seqlen.h"
#include "tile_config.h"  // fp8_vt_key, fp8_vt_writes

namespace flashserve::attention::sm90 {

struct VtArgs {
  const uint8_t* v;  // [batch, seqlen_k, h_kv, d] dense or [total_k, h_kv, d] varlen (bytes)
  int64_t batch_stride, row_stride, head_stride;  // bytes (elements); varlen: batch stride 0
  const int32_t* cu_seqlens_k;                    // null: dense
  const int32_t* seqused_k;                       // null: every row is a key
  int seqlen_k;                                   // dense: rows per sequence
  uint8_t* vt;                                    // [batch, h_kv, d, keys]
  int h_kv;
  int64_t keys;    // a multiple of 128
  int block_keys;  // the kernel's key block: every key it reads below `keys` is written
};

// One CTA per (block of 128 keys, KV head, sequence), kD / 2 threads, no shared memory: thread
// t takes 16 columns of V (bytes 16 (t / 8) .. + 15 of a row) and 16 keys (the block's group
// t % 8; fp8_vt_key permutes keys within each 16, so a group's positions are its own keys). It
// loads 16 bytes of each of its 16 keys, transposes each 4 x 4 bytes (4 keys of 4 columns) with
// byte permutes into the columns' words (keys in fp8_vt_key's order), and stores its 16 keys of
// each of its 16 rows of V^T. The eight groups of one piece of columns are neighbouring lanes,
// so that a store instruction writes whole 128-byte lines of 4 rows, and a load 64 bytes of each
// of 8 rows. Measured (ncu on an H100, the FA3 grid's 16k tokens x 16 heads, 64 MB moved):
// 22.6-23.4 us at every head dim (session 40). Earlier versions (session 39): the first staged the
// block in shared memory and read it back one byte at a time (64 byte loads a thread, 8-way bank
// conflicts from its 16-row stride), 44-50 us at every head dim: a sixth of a d128 call at 512
// keys, 4-6% at 4k. Words of 32 keys in lanes 32 apart (a warp's load one 128-byte row, its stores
// 32 rows apart): d128 and d256 42 us, d64 31. The same with a word's four key groups in
// neighbouring lanes (stores of whole lines, loads of 32 bytes of 4 rows, kD threads): 27-29 us.
template <int kD>
__global__ void __launch_bounds__(kD / 2) fp8_transpose_v(const VtArgs a) {
  const int hk = blockIdx.y, b = blockIdx.z;
  const kernel::SeqLens s =
      kernel::seq_lens(nullptr, a.cu_seqlens_k, a.seqused_k, 0, a.seqlen_k, b);
  // The kernel reads whole key blocks of block_keys up to the sequence's last key: their keys
  // below `keys` are written (zeros past kv_len), the rest of the slab never read; keys past
  // `keys` are TMA's zero fill.
  const int key0 = blockIdx.x * 128;
  if (!fp8_vt_writes(key0, s.kv_len, a.block_keys)) return;
  static_assert(kD % 64 == 0, "whole warps: 4 pieces of 16 columns, 8 key groups each");
  const int piece = threadIdx.x / 8, first = key0 + 16 * (threadIdx.x % 8);
  const uint8_t* v = a.v + b * a.batch_stride + hk * a.head_stride + 16 * piece;
  uint32_t w[16][4];  // key first + k, columns 16 piece + 4 j .. + 3 in w[k][j]
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    uint4 x = make_uint4(0, 0, 0, 0);
    if (first + k < s.kv_len)
      x = *reinterpret_cast<const uint4*>(v + int64_t{s.k_start + first + k} * a.row_stride);
    w[k][0] = x.x, w[k][1] = x.y, w[k][2] = x.z, w[k][3] = x.w;
  }
  // Word i of column 4 j + c's 16 keys holds positions 4 i .. 4 i + 3 of the group: keys
  // fp8_vt_key(4 i + e) (which stay within 0..15).
  uint32_t out[16][4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t k0 = w[fp8_vt_key(4 * i)][j], k1 = w[fp8_vt_key(4 * i + 1)][j];
      const uint32_t k2 = w[fp8_vt_key(4 * i + 2)][j], k3 = w[fp8_vt_key(4 * i + 3)][j];
      // Byte c of each key's word is column c: interleave the keys' bytes pairwise, then pairs.
      const uint32_t lo01 = __byte_perm(k0, k1, 0x5140), hi01 = __byte_perm(k0, k1, 0x7362);
      const uint32_t lo23 = __byte_perm(k2, k3, 0x5140), hi23 = __byte_perm(k2, k3, 0x7362);
      out[4 * j][i] = __byte_perm(lo01, lo23, 0x5410);
      out[4 * j + 1][i] = __byte_perm(lo01, lo23, 0x7632);
      out[4 * j + 2][i] = __byte_perm(hi01, hi23, 0x5410);
      out[4 * j + 3][i] = __byte_perm(hi01, hi23, 0x7632);
    }
  uint8_t* vt = a.vt + (int64_t{b} * a.h_kv + hk) * kD * a.keys + first;
#pragma unroll
  for (int c = 0; c < 16; ++c)
    *reinterpret_cast<uint4*>(vt + (16 * piece + c) * a.keys) =
        make_uint4(out[c][0], out[c][1], out[c][2], out[c][3]);
}

// The pre-pass over `batch` sequences (a.keys / 128 blocks of each), on `stream`.
template <int kD>
inline void launch_fp8_transpose_v(const VtArgs& a, int batch, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.keys / 128), static_cast<unsigned>(a.h_kv),
                  static_cast<unsigned>(batch));
  fp8_transpose_v<kD><<<grid, kD / 2, 0, stream>>>(a);
}

}  // namespace flashserve::attention::sm90
