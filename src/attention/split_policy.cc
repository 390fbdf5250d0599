#include "split_policy.h"

#include <algorithm>

#include "sm80/tile_config.h"

namespace flashserve::attention {

namespace {
// The most splits a launch takes, and the grid's z (sequences x splits) bound.
constexpr int64_t kMostSplits = 128, kMaxGridZ = 65535;
}  // namespace

bool is_decode(const Problem& pr) {
  return pr.max_q_len == 1;
}

// Split-KV pays when the (query tile, head, sequence) grid cannot fill the GPU: long-context
// decode and small prefill chunks. Prefill: tiles and key blocks of the sm80 tiles the launch
// runs (sm80/tile_config.h's fwd_tiles: the only family that splits); below one wave, split to
// about two, each split keeping >= 4 key blocks. Decode: one
// small block per (KV head, sequence) tile, in three regimes (H200, 32/8 heads, d128):
//   - long keys (>= two splits of 16 key blocks, 2k keys at d128): about two rounds of the GPU's
//     block slots, each split keeping >= 16 key blocks (1024 keys). docs/kernel-notes.md run 12:
//     batch 1 x 32k peaks at 32 splits (3.0 TB/s; 128 splits 2.7), batch 8 x 8k at 4-16, batch
//     64 x 4k at 4-8, and 128+ sequences at 1.
//   - long keys whose 16-block splits would leave under half a round of slots busy (a few
//     sequences of 2k-16k keys): the blocks are too few to hide the kernel's latency, so a split
//     keeps >= key_blocks / 32 blocks instead (up to 32 splits, batch 1 x 32k's best, down to the
//     short regime's one block at 2k). Not measured on its own: it joins the two measured regimes.
//   - short keys (< 2k at d128, and 2k over at most one tile per SM): a few sequences leave the
//     GPU idle, many fill it unsplit. Aim at two blocks per SM, each split keeping one key block.
//     bench_model's attention rows (H200, page 16, 1k keys, 32/8 heads, 2026-12-02, run 47):
//     batch 1 took 43.3/19.3/14.6 us with 1/4/16 splits, batch 32 46.3/55.3/76.4 us. Batches
//     2-16 (H100, paged 16, bench_serve_attn --decode-splits, session 37,
//     bench/results/decode-splits-h100-2026-12-06-session37.md): the fastest forced count gave
//     256 blocks at 512, 1k and 2k keys (2 x 1k: 16 splits, 4 x: 8, 8 x: 4, 16 x: 2), where one
//     block per SM took 6-29% longer at batch 2-8 (4 x 1k 15.4 us against 12.0 at 8 splits;
//     4 x 2k, then in the long regime below at 25 splits: 20.8 us against 16.1).
// The fp8 KV cache's register-conversion tiles (fp8_codes) hold half the bytes, so twice the
// blocks fit an SM (decode_code_smem_bytes: six at d128), and they have one more regime:
//   - one round of their slots holds every tile and at least half of it is busy: unsplit. H200,
//     64 decodes x 2k and x 4k, 32/8 heads, d128 (512 tiles in 792 slots; session 23,
//     bench/results/kv-fp8-h200-2026-12-03.md): 72/86/81/87 us and 136/157/144/148 us at 1/2/3/4
//     splits; the splits only add the combine's traffic once the blocks keep HBM busy. Over six
//     decode shapes (32-128 x 2k-4k, 8 x 8k and 32k) every count this policy gives the register
//     tiles measured best or within 2.3% of the best forced count (same file). The 16-bit
//     tiles keep the rules above: in that table they were 5% off at two shapes (96 x 2k: 2
//     splits 202 us, unsplit 191; 32 x 4k: 4 splits 145, 3 splits 138), not yet acted on.
// Never more than 128 splits or a grid z (batch x splits) past 65535.
SplitChoice split_choice(const Problem& pr, const SplitDevice& dev, bool decode, bool fp8_codes) {
  if (pr.num_splits == 1) return {1, 1};
  if (pr.num_splits > 1) return {pr.num_splits, 1};
  const int64_t most = std::min(kMostSplits, kMaxGridZ / std::max<int64_t>(pr.batch, 1));
  int64_t tiles, key_blocks, target, enough, min_blocks;  // enough: tiles that need no split
  int64_t slots = 0;  // decode: blocks the GPU runs at once (one round)
  // The tiles of the kernel the call runs: its head dims', or the next compiled head dim's.
  const int head_dim =
      sm80::kernel_head_dim(static_cast<int>(pr.head_dim), static_cast<int>(pr.head_dim_v));
  if (decode) {
    const sm80::Tiles t = sm80::decode_tiles(head_dim);
    const int block_smem =
        fp8_codes ? sm80::decode_code_smem_bytes(head_dim, t) : sm80::fwd_smem_bytes(head_dim, t);
    const int64_t per_sm =  // block slots per SM, by shared memory (1 KB reserved per block)
        std::max<int64_t>(1, dev.smem_per_sm / (block_smem + 1024));
    tiles = (pr.h_q / pr.h_kv + t.block_m - 1) / t.block_m * pr.h_kv * pr.batch;
    key_blocks = (pr.max_kv_len + t.block_n - 1) / t.block_n;
    slots = per_sm * dev.sms;
    target = enough = 2 * slots;
    min_blocks = 16;
    if (key_blocks < 2 * min_blocks || (key_blocks == 2 * min_blocks && tiles <= dev.sms)) {
      const int64_t whole_blocks = pr.max_kv_len / t.block_n;  // short keys: two blocks per SM
      const int64_t splits = std::min<int64_t>({2 * int64_t{dev.sms} / tiles, whole_blocks, most});
      return {splits < 2 ? 1 : static_cast<int>(splits), 1};
    }
    if (fp8_codes && tiles <= slots && 2 * tiles >= slots)  // one round, half busy
      return {1, static_cast<int>(min_blocks)};
  } else {
    const sm80::Tiles t = sm80::fwd_tiles(head_dim, pr.mask.has_left() || pr.mask.has_right());
    tiles = (pr.max_q_len + t.block_m - 1) / t.block_m * pr.h_q * pr.batch;
    key_blocks = (pr.max_kv_len + t.block_n - 1) / t.block_n;
    target = 2 * dev.sms;
    enough = dev.sms;
    min_blocks = 4;
  }
  if (tiles >= enough || key_blocks < 2 * min_blocks) return {1, static_cast<int>(min_blocks)};
  const int64_t want = (target + tiles - 1) / tiles;
  int64_t splits = std::min<int64_t>({want, key_blocks / min_blocks, most});
  if (decode && 2 * tiles * splits < slots) {  // under half a round busy: smaller splits
    min_blocks = std::max<int64_t>(1, key_blocks / 32);
    splits = std::min<int64_t>({want, key_blocks / min_blocks, most});
  }
  // Decode is bandwidth-bound once one round of the GPU's block slots is busy: a second round
  // that is mostly empty costs nearly a whole round. When the blocks overflow one round by less
  // than half, fit them in one. Measured (H200, run 31, 8 x 8k, 32/8 heads, d128; TB/s by
  // splits): 4: 3.74, 6: 3.70, 8: 3.27 (512 blocks in 396 slots), 12: 3.60.
  if (decode) {
    const int64_t blocks = tiles * splits;
    if (blocks > slots && 2 * blocks < 3 * slots) splits = std::min(splits, slots / tiles);
  }
  return {splits < 2 ? 1 : static_cast<int>(splits), static_cast<int>(min_blocks)};
}

BalancedSplit balanced_split(const Problem& pr, const SplitDevice& dev) {
  if (pr.num_splits != 0 || pr.batch < 2) return {};
  const SplitChoice c = split_choice(pr, dev, true);
  const int64_t items = int64_t{c.splits} + 1;
  if (items > kMostSplits || pr.batch * items > kMaxGridZ) return {};
  return {static_cast<int>(items), c.min_blocks};
}

}  // namespace flashserve::attention
