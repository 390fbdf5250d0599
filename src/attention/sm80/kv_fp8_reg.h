// The fp8 KV cache's decode tiles with the codes converted at operand load (issue 23;
// docs/kernel-notes.md, "Issue 23: fp8 KV decode, converted at operand load"): K and V stay e4m3
// codes in shared memory as cp.async copied them (a code tile, smem_tile.h code_offset: half the
// bytes of a bf16 tile), and each thread converts the codes of its own MMA B fragments in
// registers, right before the MMAs, with cvt.rn.f16x2.e4m3x2 (exact: every e4m3 value is an f16
// normal or zero). Both GEMMs run in f16 (mma m16n8k16 f32.f16.f16.f32):
//
//   S = Q K^T: the B fragment of thread (g, q) (g = lane / 4, q = lane % 4) is, for a k16 step,
//     K[key g][k 2q, 2q + 1] and [k 8 + 2q, 9 + 2q]. One 16-byte load of key g's codes, dims
//     16 q .. 16 q + 15 of a 64-dim group, gives four k16 steps: word w (dims 16 q + 4 w .. + 3)
//     converts to b0 (dims 16 q + 4 w, + 1) and b1 (+ 2, + 3) of step w. The dot product does not
//     care about the order of the dims, so Q's columns are permuted to match (prepare_q): slot
//     16 w + 8 h + 2 q + e of a group holds dim 16 q + 4 w + 2 h + e. Q is converted once per tile,
//     in place in shared memory, to f16 times a power of two s chosen from the tile's largest |q|
//     (into [2^14, 2^15)), so no element overflows f16 and only those below 2^-29 of the largest
//     lose bits; 1 / s goes into the softmax scale with the k descale (KvScales). S' = s S
//     exactly: power-of-two scaling commutes with the products and the fp32 sums, and no product
//     of an f16 q' (>= 2^-24) and an e4m3 value (>= 2^-9) is below fp32's normals.
//   O += P V: the B fragment is V[keys 2q, 2q + 1][col g] and keys 8 + 2q, 9 + 2q: two keys of a
//     column, which are not adjacent in the [key][dim] cache. Thread (g, q) loads G bytes (G = 16,
//     d64: 8) of each of those four keys, dims G g .. G g + G - 1 of a group of 8 G dims, byte-
//     permutes key pairs together (prmt) and converts them: column g of n8 tile t of the group is
//     dim G g + t. The C fragment then gives thread (g, q) columns 2q, 2q + 1 of every tile: dims
//     2 G q .. 2 G q + 2 G - 1 of each group, contiguous, which the epilogue stores as they are
//     (store_rows_permuted): O leaves in the cache's column order, split-KV partials included, so
//     the combine is unchanged. P goes to f16 instead of bf16 (pack_p<__half>): P is in [0, 1],
//     f16 rounds it more finely (2^-11 relative against bf16's 2^-8) down to 2^-14 and absolutely
//     to 2^-25 below (docs/kernel-notes.md: the bound); the row sums stay the fp32 probabilities'.
//
// The tile is the bf16 decode tile's (tile_config.h decode_tiles: 16 packed rows, one warp, a
// ring of two K/V blocks of 8192 / D keys), with the code tiles in place of the bf16 tiles: 36-40
// KB of shared memory instead of 68-72, so five (d256) or six blocks fit an SM where three did,
// twice the bytes in flight per SM.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/pdl.cuh"
#include "fwd_kernel.h"

namespace flashserve::attention::sm80 {

// Shared memory of a register-conversion block: Q [kBlockM, D] (bf16 as loaded; f16 after
// prepare_q), then kStages K and kStages V code tiles [kBlockN, D] bytes, then the read-ahead
// table entries of the paged K and V streams (the bf16 tile's count; the loader asserts it).
template <class Cfg>
struct CodeSmem {
  static constexpr int kQBytes = Cfg::kBlockM * Cfg::kHeadDim * 2;
  static constexpr int kTileBytes = Cfg::kBlockN * Cfg::kHeadDim;
  static constexpr int kTilesEnd = kQBytes + 2 * Cfg::kStages * kTileBytes;
  static constexpr int kBytes = kTilesEnd + 2 * PagedShape<Cfg>::kEntries * int(sizeof(int32_t));
  static_assert(kTilesEnd == decode_code_smem_bytes(Cfg::kHeadDim, decode_tiles(Cfg::kHeadDim)),
                "the split policy counts this block's slots per SM by decode_code_smem_bytes");
  unsigned char* base;
  int32_t* k_pages;
  int32_t* v_pages;
  __device__ __forceinline__ explicit CodeSmem(unsigned char* b)
      : base(b),
        k_pages(reinterpret_cast<int32_t*>(b + kTilesEnd)),
        v_pages(k_pages + PagedShape<Cfg>::kEntries) {}
  __device__ __forceinline__ __nv_bfloat16* q() const {
    return reinterpret_cast<__nv_bfloat16*>(base);
  }
  __device__ __forceinline__ unsigned char* k_slot(int s) const {
    return base + kQBytes + s * kTileBytes;
  }
  __device__ __forceinline__ unsigned char* v_slot(int s) const {
    return base + kQBytes + (Cfg::kStages + s) * kTileBytes;
  }
};
template <class Cfg>
inline constexpr int kKvFp8RegSmemBytes = CodeSmem<Cfg>::kBytes;

// Four e4m3 codes (a 32-bit word, the lowest byte first) as two f16 pairs: lo = codes 0, 1 (code 0
// in the low half), hi = codes 2, 3. Exact. sm_89 on: one cvt per pair; below (CI's sm_80), the
// conversion cuda_fp8.h emulates.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\n"
      "cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
#else
  const __half2_raw a =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
  const __half2_raw b =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  lo = uint32_t{a.x} | (uint32_t{a.y} << 16);
  hi = uint32_t{b.x} | (uint32_t{b.y} << 16);
#endif
}

// The power of two s that puts m (>= 0; the tile's largest |q|) into [2^14, 2^15): 2^(141 - e)
// for m's biased exponent e, at most 2^127 (m below 2^-113, zero included, stays below 2^14);
// m = inf or NaN (e = 255) gives 2^13, and q's inf and NaN then stay what they are.
__device__ __forceinline__ float q_scale_for(float m) {
  const int e = (__float_as_uint(m) >> 23) & 0xff;
  const int se = min(268 - e, 254);
  return __uint_as_float(static_cast<uint32_t>(se) << 23);
}

// In place: the warp's Q tile [16, D] (bf16 as loaded, smem_tile.h's swizzled layout) becomes f16
// values s q in the permuted column order of the file comment (slot 16 w + 8 h + 2 q + e of each
// 64-dim group holds dim 16 q + 4 w + 2 h + e), for gemm_qk_codes' ldmatrix. Returns s. The
// caller has waited for Q's copies and synchronised; it synchronises the warp after.
template <int D>
__device__ __forceinline__ float prepare_q(__nv_bfloat16* sq, int lane) {
  const uint32_t base = smem_addr(sq);
  constexpr int kChunks = 16 * D / 8;  // 16-byte chunks of the tile
  float m = 0.0f;
#pragma unroll
  for (int i = lane; i < kChunks; i += 32) {
    const uint4 c = ld_shared_16(base + 16 * i);
    const uint32_t words[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      m = fmaxf(m, fabsf(__uint_as_float(words[k] << 16)));
      m = fmaxf(m, fabsf(__uint_as_float(words[k] & 0xffff0000u)));
    }
  }
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const float s = q_scale_for(m);
  // Units of (row, 64-dim group): each thread permutes whole units, reading all of one before
  // writing it, so no thread reads what another writes.
  constexpr int kGroups = D / 64, kUnits = 16 * kGroups;
#pragma unroll
  for (int u0 = 0; u0 < kUnits; u0 += 32) {
    const int u = u0 + lane;
    if (kUnits % 32 != 0 && u >= kUnits) break;
    const int row = u / kGroups, j = u % kGroups;
    uint32_t in[32];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const uint4 v = ld_shared_16(base + 2 * swizzled<D>(row, 8 * j + c));
      in[4 * c] = v.x;
      in[4 * c + 1] = v.y;
      in[4 * c + 2] = v.z;
      in[4 * c + 3] = v.w;
    }
    uint32_t out[32];
#pragma unroll
    for (int ow = 0; ow < 32; ++ow) {
      // Output word ow = slots 2 ow, 2 ow + 1: w = ow / 8, h = ow / 4 % 2, q = ow % 4, so dims
      // 16 q + 4 w + 2 h (+ 1): input word 8 q + 2 w + h.
      const uint32_t x = in[8 * (ow % 4) + 2 * (ow / 8) + (ow / 4) % 2];
      out[ow] = pack2<__half>(__uint_as_float(x << 16) * s, __uint_as_float(x & 0xffff0000u) * s);
    }
#pragma unroll
    for (int c = 0; c < 8; ++c)
      st_shared_16(base + 2 * swizzled<D>(row, 8 * j + c),
                   make_uint4(out[4 * c], out[4 * c + 1], out[4 * c + 2], out[4 * c + 3]));
  }
  return s;
}

// acc[0][nt] = Q' . K[n-tile nt]^T (scaled by prepare_q's s): Q' from shared memory (f16, permuted)
// by ldmatrix as gemm_qk's A, K's B fragments from the code tile sk by one 16-byte load per
// (n-tile, 64-dim group), converted in registers.
template <int D, int kNTiles>
__device__ __forceinline__ void gemm_qk_codes(float (&acc)[1][kNTiles][4], const __half* sq,
                                              const unsigned char* sk, int lane) {
  constexpr int kRowBytes = D * 2;
  const int l7 = lane & 7, g = lane >> 2, q = lane & 3;
  const uint32_t a_base = smem_addr(sq) + (l7 + ((lane >> 3) & 1) * 8) * kRowBytes;
  const int a_chunk = lane >> 4;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][nt][e] = 0.0f;
#pragma unroll
  for (int j = 0; j < D / 64; ++j) {
    uint32_t a[4][1][4];
#pragma unroll
    for (int w = 0; w < 4; ++w)
      ldmatrix_x4(a[w][0], a_base + (((2 * (4 * j + w) + a_chunk) ^ l7) << 4));
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const uint4 c = *reinterpret_cast<const uint4*>(sk + code_offset<D>(8 * nt + g, 4 * j + q));
      const uint32_t words[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t b0, b1;
        e4m3x4_to_f16x2x2(words[w], b0, b1);
        mma_16816<__half>(acc[0][nt], a[w][0], b0, b1);
      }
    }
  }
}

// Bytes of one V load per key (G) and dims per group (8 G): 16 and 128, or at d64 8 and 64.
template <int D>
inline constexpr int kVLoadBytes = D >= 128 ? 16 : 8;

// acc[0][G j + t] += P . V'[:, n-tile G j + t] over kKSteps k16 steps of keys, where column g of
// n-tile G j + t is dim 8 G j + G g + t. a_frags(ks, a) sets the A fragment (f16 probabilities).
template <int D, int kKSteps, int kDTiles, class AFrags>
__device__ __forceinline__ void gemm_pv_codes(float (&acc)[1][kDTiles][4], const AFrags& a_frags,
                                              const unsigned char* sv, int lane) {
  constexpr int G = kVLoadBytes<D>, kGroups = D / (8 * G), kWords = G / 4;
  static_assert(kDTiles == G * kGroups);
  const int g = lane >> 2, q = lane & 3;
  // Byte offset within a row's group: dims G g ..; at d64 the half of chunk g / 2.
  auto load = [&](int row, int j, uint32_t(&wd)[kWords]) {
    if constexpr (G == 16) {
      const uint4 c = *reinterpret_cast<const uint4*>(sv + code_offset<D>(row, 8 * j + g));
      wd[0] = c.x;
      wd[1] = c.y;
      wd[2] = c.z;
      wd[3] = c.w;
    } else {
      const uint2 c =
          *reinterpret_cast<const uint2*>(sv + code_offset<D>(row, g >> 1) + 8 * (g & 1));
      wd[0] = c.x;
      wd[1] = c.y;
    }
  };
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    uint32_t a[1][4];
    a_frags(ks, a);
    const int r0 = 16 * ks + 2 * q;
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      uint32_t k0[kWords], k1[kWords], k8[kWords], k9[kWords];
      load(r0, j, k0);
      load(r0 + 1, j, k1);
      load(r0 + 8, j, k8);
      load(r0 + 9, j, k9);
#pragma unroll
      for (int w = 0; w < kWords; ++w) {
        // Key pairs byte-interleaved: (key 2q, key 2q + 1) of dims 4w, 4w + 1, then 4w + 2, + 3.
        uint32_t b0[4], b1[4];
        e4m3x4_to_f16x2x2(__byte_perm(k0[w], k1[w], 0x5140), b0[0], b0[1]);
        e4m3x4_to_f16x2x2(__byte_perm(k0[w], k1[w], 0x7362), b0[2], b0[3]);
        e4m3x4_to_f16x2x2(__byte_perm(k8[w], k9[w], 0x5140), b1[0], b1[1]);
        e4m3x4_to_f16x2x2(__byte_perm(k8[w], k9[w], 0x7362), b1[2], b1[3]);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          mma_16816<__half>(acc[0][G * j + 4 * w + i], a[0], b0[i], b1[i]);
      }
    }
  }
}

// Writes the warp's normalised O rows (gemm_pv_codes' column order; fragment row r: tile row
// 8 r + g) and their LSE: to out and lse, or (split-KV) to the partials, in the cache's column
// order. Thread (g, q) holds columns 2q, 2q + 1 of every n8 tile, i.e. dims 2 G q + G e + t
// (e = 0, 1; t < G) of each group: whole 16-byte (bf16) or 16-byte (fp32, 4 dims) pieces.
template <class Cfg, class Tile>
__device__ __forceinline__ void store_rows_permuted(const FwdParams& p, const Tile& t,
                                                    const float (&o)[Cfg::kDTiles][4],
                                                    const float (&lse)[2], int lane) {
  constexpr int D = Cfg::kHeadDim, G = kVLoadBytes<D>, kGroups = D / (8 * G);
  const int g = lane >> 2, q = lane & 3;
  const int rows_valid = t.seq.q_len - t.m0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 8 * r + g;
    if (row >= rows_valid) continue;
    if constexpr (Tile::kWritesPartials) {
      const int64_t slot = t.partial_slot(p, row);
      float* out = p.o_partial + slot * D;
#pragma unroll
      for (int j = 0; j < kGroups; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
          for (int i = 0; i < G; i += 4) {
            const int dt = G * j + i;
            *reinterpret_cast<float4*>(out + 8 * G * j + 2 * G * q + G * e + i) = make_float4(
                o[dt][2 * r + e], o[dt + 1][2 * r + e], o[dt + 2][2 * r + e], o[dt + 3][2 * r + e]);
          }
      if (q == 0) p.lse_partial[slot] = lse[r];
    } else {
      __nv_bfloat16* out = t.out_row(p, row);
#pragma unroll
      for (int j = 0; j < kGroups; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
          for (int i = 0; i < G; i += 8) {
            const int dt = G * j + i;
            uint32_t w[4];
#pragma unroll
            for (int k = 0; k < 4; ++k)
              w[k] = pack2<__nv_bfloat16>(o[dt + 2 * k][2 * r + e], o[dt + 2 * k + 1][2 * r + e]);
            *reinterpret_cast<uint4*>(out + 8 * G * j + 2 * G * q + G * e + i) =
                make_uint4(w[0], w[1], w[2], w[3]);
          }
      if (q == 0) {
        float* l = t.lse_row(p, row);
        if (l != nullptr) *l = lse[r];
      }
    }
  }
}

// The decode tile's key loop (fwd_kernel.h attend's kStages == 2 schedule for one warp): each
// step waits for block n, lets the ring slot of block n + 1 take block n - 1, then S = Q' K^T from
// codes, the mask at kv_len (or the window), the online softmax, and O += P V from codes.
template <class Cfg, class Tile>
__device__ __forceinline__ void attend_codes(const FwdParams& p, const Tile& t,
                                             const CodeSmem<Cfg>& sm, WarpState<Cfg>& ws, int tid,
                                             float scale_log2) {
  constexpr int D = Cfg::kHeadDim, kBN = Cfg::kBlockN, kNT = Cfg::kNTiles;
  constexpr int kThreads = Cfg::kThreads;
  const int lane = tid & 31;
  const __half* sq = reinterpret_cast<const __half*>(sm.q());
  int buf = 0;
  auto step = [&](int n, auto masked) {
    cp_async_wait<0>();  // block n
    __syncthreads();     // ... for every thread; and slot buf ^ 1 (block n + 1) is read
    if (n - 1 >= t.blocks.n_min) {
      t.template load_k_codes<kThreads>(p, n - 1, sm.k_slot(buf ^ 1), sm.k_pages, tid);
      t.template load_v_codes<kThreads>(p, n - 1, sm.v_slot(buf ^ 1), sm.v_pages, tid);
    }
    cp_async_commit();
    float s[1][kNT][4];
    gemm_qk_codes<D, kNT>(s, sq, sm.k_slot(buf), lane);
    if constexpr (decltype(masked)::value)  // every row is the query at key position kv_len - 1
      mask_scores<1, kNT, true, true>(s, 0, n * kBN + 2 * (lane & 3), t.seq.kv_len,
                                      t.seq.kv_len - 1, p.window_left, -1);
    ws.softmax.update(s, ws.o, scale_log2);
    auto a_frags = [&](int ks, uint32_t(&a)[1][4]) { pack_p<__half>(s[0], ks, a[0]); };
    gemm_pv_codes<D, Cfg::kPvSteps, Cfg::kDTiles>(ws.o, a_frags, sm.v_slot(buf), lane);
    buf ^= 1;
  };
  for (int n = t.blocks.n_max - 1; n >= t.blocks.n_min; --n) {
    if (t.blocks.needs_mask(n)) {
      step(n, std::true_type{});
    } else {
      step(n, std::false_type{});
    }
  }
}

// The kernel: decode tiles (packed GQA, one warp) over a paged fp8 KV cache, bfloat16 q and out.
template <class Cfg, bool kSplit>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocksPerSm)
    fwd_kernel_kv_fp8_reg(const __grid_constant__ FwdKvFp8Params p) {
  static_assert(Cfg::kPackGqa && Cfg::kWarps == 1 && Cfg::kStages == 2 && Cfg::kMTiles == 1 &&
                    !Cfg::kPadded && !Cfg::kPvPairs,
                "the register-conversion path is the one-warp decode tile's");
  using Elem = __nv_bfloat16;
  using Tile = FwdTile<Cfg, Elem, false, true, kSplit, __nv_fp8_e4m3>;
  constexpr int D = Cfg::kHeadDim, kThreads = Cfg::kThreads;
  pdl::wait_for_producer();  // as fwd_body
  pdl::release_dependents();
  extern __shared__ __align__(128) unsigned char smem[];
  const CodeSmem<Cfg> sm(smem);
  const int tid = threadIdx.x, lane = tid & 31;
  const Tile t(p, int(blockIdx.x), int(blockIdx.y), int(blockIdx.z));
  if (!t.valid()) return;

  WarpState<Cfg> ws;
  const int hk = t.kv_head(p);
  const float k_descale =
      p.k_descale ? p.k_descale[t.seq.b * p.k_descale_batch_stride + hk * p.k_descale_head_stride]
                  : 1.0f;
  const float v_descale =
      p.v_descale ? p.v_descale[t.seq.b * p.v_descale_batch_stride + hk * p.v_descale_head_stride]
                  : 1.0f;
  float scale_log2 = p.scale_log2 * k_descale, scale = p.scale * k_descale;
  if (t.has_keys()) {
    // Prologue: Q in a group of its own, then K and V of the first block; Q is converted while
    // the block is in flight.
    load_tile_async<Cfg::kBlockM, D, kThreads>(sm.q(), t.q_row(p, 0), t.q_step(p),
                                               t.seq.q_len - t.m0, tid);
    cp_async_commit();
    t.template load_k_codes<kThreads>(p, t.blocks.n_max - 1, sm.k_slot(0), sm.k_pages, tid);
    t.template load_v_codes<kThreads>(p, t.blocks.n_max - 1, sm.v_slot(0), sm.v_pages, tid);
    cp_async_commit();
    cp_async_wait<1>();  // Q
    __syncthreads();
    const float s = prepare_q<D>(sm.q(), lane);
    __syncwarp();
    // S' = s S: the scores' scale takes 1 / s (exact: a power of two).
    scale_log2 /= s;
    scale /= s;
    attend_codes<Cfg>(p, t, sm, ws, tid, scale_log2);
  }
  // O = sum_j P_j code(v_j) x v_descale (fwd_kernel.h's fwd_body), then normalised and written.
#pragma unroll
  for (int dt = 0; dt < Cfg::kDTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) ws.o[0][dt][e] *= v_descale;
  float lse[1][2];
  ws.softmax.finish(ws.o, scale, lse);
  store_rows_permuted<Cfg>(p, t, ws.o[0], lse[0], lane);
}

}  // namespace flashserve::attention::sm80
