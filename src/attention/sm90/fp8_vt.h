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
// 8 + 2q, 9 + 2q (and + 16). Packing the accumulator as it lies (fwd_kernel.h's to_e4m3_operand)
// and permuting V's keys the same way gives the same sum over the keys, with no shuffle in the
// kernel's loop (FlashAttention-3 shuffles P when V comes column-major, permute_Aregs_fp8, and
// permutes in its in-kernel transpose otherwise).
//
// Cost: V is read once and V^T written once (2 x batch x kv x h_kv x d bytes beyond what the
// kernel reads); for the FA3 grid's 16k tokens x 16 heads x d128 that is 64 MB, ~20 us at
// ~3 TB/s, about 1-2% of the attention's time at d128.
#pragma once

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

// One CTA per (block of 128 keys, KV head, sequence): the block's rows of V into shared memory
// (16 bytes a load), then each row of V^T's block written as 16-byte pieces.
template <int kD>
__global__ void __launch_bounds__(256) fp8_transpose_v(const VtArgs a) {
  constexpr int kPad = 16;  // spreads the column reads of the second step over the banks
  __shared__ alignas(16) uint8_t tile[128][kD + kPad];
  const int hk = blockIdx.y, b = blockIdx.z;
  const kernel::SeqLens s =
      kernel::seq_lens(nullptr, a.cu_seqlens_k, a.seqused_k, 0, a.seqlen_k, b);
  // The kernel reads whole key blocks of block_keys up to the sequence's last key: their keys
  // below `keys` are written (zeros past kv_len), the rest of the slab never read; keys past
  // `keys` are TMA's zero fill.
  const int key0 = blockIdx.x * 128;
  if (!fp8_vt_writes(key0, s.kv_len, a.block_keys)) return;
  constexpr int kPieces = kD / 16;
  const uint8_t* v = a.v + b * a.batch_stride + hk * a.head_stride;
  for (int i = threadIdx.x; i < 128 * kPieces; i += 256) {
    const int r = i / kPieces, piece = i % kPieces;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (key0 + r < s.kv_len)
      x = *reinterpret_cast<const uint4*>(v + int64_t{s.k_start + key0 + r} * a.row_stride +
                                          piece * 16);
    *reinterpret_cast<uint4*>(&tile[r][piece * 16]) = x;
  }
  __syncthreads();
  uint8_t* out = a.vt + (int64_t{b} * a.h_kv + hk) * kD * a.keys + key0;
  for (int i = threadIdx.x; i < kD * 8; i += 256) {
    const int n = i / 8, piece = i % 8;  // row n of V^T, keys 16 piece .. 16 piece + 15
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t x = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = piece * 16 + 4 * j + e;
        x |= uint32_t{tile[col / 32 * 32 + fp8_vt_key(col % 32)][n]} << (8 * e);
      }
      w[j] = x;
    }
    *reinterpret_cast<uint4*>(out + n * a.keys + piece * 16) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

}  // namespace flashserve::attention::sm90
