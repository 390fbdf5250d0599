// One unit of the forward kernel's work: a query tile of one (grid) head of one sequence (and one
// split of its key blocks under split-KV). It knows where its rows live in q, out and lse, which
// key blocks it visits, and how to bring those blocks into shared memory.
//
// Rows: normally tile row r is query position m0 + r of query head `head`. With GQA packing
// (decode configurations, tile_config.h) the grid head is a KV head and, since every sequence
// then has at most one query, tile row r is query head head * h_ratio + m0 + r of position 0:
// the group's heads share one tile and one pass over K/V (FlashAttention's "seqlen_q / ngroups
// swap"), and the rows are a head stride apart instead of a row stride.
#pragma once

#include <cstdint>
#include <type_traits>

#include "block_mask.h"
#include "fwd_params.h"
#include "smem_tile.h"

namespace flashserve::attention::sm80 {

// The real column chunks of a row of q and k (qk_chunks) and of v and out (v_chunks), smem_tile.h:
// all of the kernel's head dim, or (padded kernels, kPadded) the call's head dims, read from the
// FwdPaddedParams that the kernel's FwdParams then is.
template <bool kPadded>
struct TileChunks {
  __device__ __forceinline__ explicit TileChunks(const FwdParams&) {}
  __device__ __forceinline__ AllChunks qk_chunks() const { return {}; }
  __device__ __forceinline__ AllChunks v_chunks() const { return {}; }
  __device__ __forceinline__ AllChunks qk_steps() const { return {}; }
  __device__ __forceinline__ AllChunks v_pairs() const { return {}; }
};
template <>
struct TileChunks<true> {
  ChunkBound qk, v;
  __device__ __forceinline__ explicit TileChunks(const FwdParams& p)
      : qk{static_cast<const FwdPaddedParams&>(p).head_dim / 8},
        v{static_cast<const FwdPaddedParams&>(p).head_dim_v / 8} {}
  __device__ __forceinline__ ChunkBound qk_chunks() const { return qk; }
  __device__ __forceinline__ ChunkBound v_chunks() const { return v; }
  // The GEMMs' live parts (warp_gemm.h): k16 steps of QK^T and pairs of n8 d-tiles of PV (16
  // columns each) that hold a real column.
  __device__ __forceinline__ ChunkBound qk_steps() const { return {(qk.n + 1) / 2}; }
  __device__ __forceinline__ ChunkBound v_pairs() const { return {(v.n + 1) / 2}; }
};

// KvElem: the element type of K and V in global memory: Elem, or __nv_fp8_e4m3 (an fp8 KV cache,
// paged only), staged as codes and widened to Elem in shared memory (smem_tile.h
// load_tile_paged_async, widen_e4m3_tile).
template <class Cfg, class Elem, bool kHasMask, bool kPaged, bool kSplit, class KvElem = Elem>
struct FwdTile : TileChunks<Cfg::kPadded> {
  static constexpr int D = Cfg::kHeadDim, kBM = Cfg::kBlockM, kBN = Cfg::kBlockN;
  static constexpr bool kPack = Cfg::kPackGqa;
  static constexpr bool kMasked = kHasMask;        // for users of the tile type
  static constexpr bool kWritesPartials = kSplit;  // split-KV: fp32 partials, not out/lse
  static_assert(!(kPack && kHasMask), "packed rows share one position: no per-row mask");

  int head;  // grid head: the query head, or the KV head when packed
  // split-KV: which share of the key blocks; length-aware decode: the item (grid z), or -1 for
  // the only item of its sequence, which writes out and lse as an unsplit tile does.
  int split;
  int m0;  // first tile row
  SeqInfo seq;
  // Packed tiles' rows share the sequence's one query, so a left window (Mistral's sliding
  // window) bounds them all alike: their key blocks follow it too.
  KeyBlocks<kBM, kBN, kHasMask || kPack> blocks;

  __device__ __forceinline__ FwdTile(const FwdParams& p, int m_block, int head_, int z)
      : FwdTile(p, m_block, head_, z, locate(p, z)) {}

 private:
  // Grid z's sequence and share: z / num_splits and z % num_splits, or (a length-aware decode
  // launch, kernel/split_items.h) item z's from the launch's item map; chunk > 0 then, and
  // share < 0 for an item past the launch's last (b is then a valid index whose tile has no
  // rows).
  struct Where {
    int b, share, chunk;
    bool direct = false;  // the sequence's only item
  };
  static __device__ __forceinline__ Where locate(const FwdParams& p, int z) {
    if constexpr (!kSplit) {
      return {p.seq_begin + z, 0, 0};
    } else {
      if constexpr (kPack) {
        if (p.split_min_blocks > 0) {  // the launch's item map (split_map.cu): one load
          const int4 it = split_map_of(p).items[z];  // (sequence, share, count, chunk)
          if (it.x < 0) return {p.seq_begin, -1, it.w, false};
          return {it.x, it.y, it.w, it.z == 1};
        }
      }
      return {p.seq_begin + z / p.num_splits, z % p.num_splits, 0};
    }
  }

  __device__ __forceinline__ FwdTile(const FwdParams& p, int m_block, int head_, int z, Where w)
      : TileChunks<Cfg::kPadded>(p),
        head(head_),
        split(w.direct      ? -1
              : w.chunk > 0 ? z
                            : w.share),
        m0(m_block * kBM),
        seq(p, w.b),
        blocks(kPack ? 0 : m0, kPack ? min(seq.q_len, 1) : seq.q_len, seq.kv_len, p.window_left,
               kPack ? -1 : p.window_right) {
    // A sequence the other launch of a mixed batch takes, or an item past the last: no rows here.
    if (!takes_seq(p.only, seq.q_len) || w.share < 0) seq.q_len = 0;
    // Rows are (position 0, head of the group). `blocks` saw the one query of the sequence (its
    // window; the right side of a bottom-right single query masks nothing).
    if constexpr (kPack) seq.q_len *= p.h_ratio;
    if constexpr (kSplit) {
      if (w.chunk > 0)
        blocks.keep_share(w.share, w.chunk);
      else
        blocks.keep_split(split, p.num_splits);
    }
  }

 public:
  // Whether this split tile writes out and lse itself (a length-aware item that is its
  // sequence's only one) rather than partials.
  __device__ __forceinline__ bool writes_out() const {
    return !kWritesPartials || (kPack && split < 0);
  }

  // Rows past q_len (varlen sequences shorter than the grid's longest) have no work.
  __device__ __forceinline__ bool valid() const { return m0 < seq.q_len; }
  __device__ __forceinline__ bool has_keys() const { return blocks.n_max > blocks.n_min; }
  __device__ __forceinline__ int kv_head(const FwdParams& p) const {
    return kPack ? head : head / p.h_ratio;
  }
  // Tile row `row` of q, and the distance between consecutive tile rows.
  __device__ __forceinline__ const Elem* q_row(const FwdParams& p, int row) const {
    return static_cast<const Elem*>(p.q) + seq.q_off(p) +
           offset_of(p, p.q_row_stride, p.q_head_stride, row);
  }
  __device__ __forceinline__ int64_t q_step(const FwdParams& p) const {
    return kPack ? p.q_head_stride : p.q_row_stride;
  }
  __device__ __forceinline__ Elem* out_row(const FwdParams& p, int row) const {
    return static_cast<Elem*>(p.out) + seq.o_off(p) +
           offset_of(p, p.o_row_stride, p.o_head_stride, row);
  }
  __device__ __forceinline__ int64_t out_step(const FwdParams& p) const {
    return kPack ? p.o_head_stride : p.o_row_stride;
  }
  __device__ __forceinline__ float* lse_row(const FwdParams& p, int row) const {
    if (p.lse == nullptr) return nullptr;
    return p.lse + seq.lse_off(p) + offset_of(p, p.lse_row_stride, p.lse_head_stride, row);
  }
  __device__ __forceinline__ int64_t lse_step(const FwdParams& p) const {
    return kPack ? p.lse_head_stride : p.lse_row_stride;
  }
  // Split-KV partial slot of tile row `row` ([num_splits, q_rows, h_q] slots, unpacked order, so
  // the combine needs no knowledge of packing) and the slot distance between tile rows.
  __device__ __forceinline__ int64_t partial_slot(const FwdParams& p, int row) const {
    // Packed (decode) tiles: one row per sequence, by sequence (fwd_params.h partials_by_seq),
    // or length-aware, one per item (`split` is the item).
    const int64_t q_row =
        kPack ? int64_t{seq.b - p.seq_begin} : seq.q_row0(p) - p.partial_row0 + m0 + row;
    const int64_t h = kPack ? int64_t{head} * p.h_ratio + m0 + row : head;
    if (kPack && p.split_min_blocks > 0) return int64_t{split} * p.h_q + h;
    return (split * p.q_rows + q_row) * p.h_q + h;
  }
  __device__ __forceinline__ int64_t partial_step(const FwdParams& p) const {
    return kPack ? 1 : p.h_q;
  }

  // Key/value block n into shared tile `dst` ([kBN, D]); rows past kv_len and chunks `chunks`
  // does not have are zero-filled. Paged: `entries` holds this stream's read-ahead block-table
  // entries (smem_tile.h); the loop's first block reads the table itself, and every block but
  // the last fetches the next one's.
  template <int kThreads, class Chunks>
  __device__ __forceinline__ void load_kv(const FwdParams& p, const void* base, int64_t head_stride,
                                          int64_t row_stride, int64_t page_stride, int64_t seq_off,
                                          int n, Elem* dst, int32_t* entries, int tid,
                                          Chunks chunks) const {
    const KvElem* src = static_cast<const KvElem*>(base) + seq_off + kv_head(p) * head_stride;
    static_assert(kPaged || std::is_same_v<KvElem, Elem>, "e4m3 K/V are paged only");
    if constexpr (kPaged) {
      load_tile_paged_async<kBN, D, kThreads>(
          dst, src, p.block_table + seq.b * p.block_table_stride, p.page, page_stride, row_stride,
          n * kBN, seq.kv_len - n * kBN, entries, n, n < blocks.n_max - 1, n - 1 >= blocks.n_min,
          tid, chunks);
    } else {
      load_tile_async<kBN, D, kThreads>(dst, src + n * kBN * row_stride, row_stride,
                                        seq.kv_len - n * kBN, tid, chunks);
    }
  }
  template <int kThreads>
  __device__ __forceinline__ void load_k(const FwdParams& p, int n, Elem* dst, int32_t* entries,
                                         int tid) const {
    load_kv<kThreads>(p, p.k, p.k_head_stride, p.k_row_stride, p.k_page_stride, seq.k_off(p), n,
                      dst, entries, tid, this->qk_chunks());
  }
  // An e4m3 block that load_kv staged in `dst`, widened in place once this thread's wait has
  // retired its group; the step's barrier after it publishes the tile. Nothing for 16-bit K/V.
  template <int kThreads>
  __device__ __forceinline__ void widen_kv(Elem* dst) const {
    if constexpr (!std::is_same_v<KvElem, Elem>) widen_e4m3_tile<kBN, D, kThreads>(dst);
  }
  template <int kThreads>
  __device__ __forceinline__ void load_v(const FwdParams& p, int n, Elem* dst, int32_t* entries,
                                         int tid) const {
    load_kv<kThreads>(p, p.v, p.v_head_stride, p.v_row_stride, p.v_page_stride, seq.v_off(p), n,
                      dst, entries, tid, this->v_chunks());
  }

  // e4m3 block n into the code tile `dst` (smem_tile.h code_offset; bytes), as load_kv copies
  // it (same pages, read-ahead entries and zero fill), for the decode tiles that convert the codes
  // at operand load (kv_fp8_reg.h).
  template <int kThreads>
  __device__ __forceinline__ void load_codes(const FwdParams& p, const void* base,
                                             int64_t head_stride, int64_t row_stride,
                                             int64_t page_stride, int64_t seq_off, int n,
                                             unsigned char* dst, int32_t* entries, int tid) const {
    static_assert(kPaged && std::is_same_v<KvElem, __nv_fp8_e4m3> && !Cfg::kPadded);
    const KvElem* src = static_cast<const KvElem*>(base) + seq_off + kv_head(p) * head_stride;
    load_tile_paged_async<kBN, D, kThreads, Elem, AllChunks, KvElem, true>(
        reinterpret_cast<Elem*>(dst), src, p.block_table + seq.b * p.block_table_stride, p.page,
        page_stride, row_stride, n * kBN, seq.kv_len - n * kBN, entries, n, n < blocks.n_max - 1,
        n - 1 >= blocks.n_min, tid);
  }
  template <int kThreads>
  __device__ __forceinline__ void load_k_codes(const FwdParams& p, int n, unsigned char* dst,
                                               int32_t* entries, int tid) const {
    load_codes<kThreads>(p, p.k, p.k_head_stride, p.k_row_stride, p.k_page_stride, seq.k_off(p), n,
                         dst, entries, tid);
  }
  template <int kThreads>
  __device__ __forceinline__ void load_v_codes(const FwdParams& p, int n, unsigned char* dst,
                                               int32_t* entries, int tid) const {
    load_codes<kThreads>(p, p.v, p.v_head_stride, p.v_row_stride, p.v_page_stride, seq.v_off(p), n,
                         dst, entries, tid);
  }

 private:
  __device__ __forceinline__ int64_t offset_of(const FwdParams& p, int64_t row_stride,
                                               int64_t head_stride, int row) const {
    if constexpr (kPack) return (int64_t{head} * p.h_ratio + m0 + row) * head_stride;
    return (m0 + row) * row_stride + head * head_stride;
  }
};

}  // namespace flashserve::attention::sm80
